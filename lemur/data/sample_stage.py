"""The build's samples (`inspect:`, docs/format.md#samples): the steps that collect them in
the read tasks, and the stage that joins them into `<build>/samples/` after packing.

In the read tasks: each filter keeps its drops with the value that tripped the rule
(`DropSamples`, attached like datatrove's `exclusion_writer`), the PII step its redacted
documents and counts, and a step after the filters the kept documents and the length and
language histograms (`KeptSamples`); each writes one part file per task under the run's
`samples/` folder. After packing: the part files merged, the duplicate clusters read from
dedup's removals, FIM and repository documents from their runs, all decoded from tokens.
Nothing here changes a document: shards are the same bytes with `inspect:` on or off.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data import work as work_folders
from lemur.data.dedup.examples import TokenRunReader, duplicate_samples, seeded_order
from lemur.data.filter.base import LemurFilter
from lemur.data.filter.pii import PiiScrub
from lemur.data.recipe.recipe import Recipe
from lemur.data.runs.format import TokenRun
from lemur.data.samples.collect import KeptSamples
from lemur.data.samples.drops import DropSamples
from lemur.data.samples.merge import merge_parts, write_samples
from lemur.data.samples.records import (
    EXACT_DUPLICATES,
    KEPT,
    NEAR_DUPLICATES,
    SampleSettings,
    capped,
)
from lemur.tokenizer import Tokenizer
from lemur.tokenizer.fim import MARKER_ROLES, CodeMarkers

SAMPLES_DIR = "samples"  # under the build's own directory


def sample_settings(recipe: Recipe) -> SampleSettings | None:
    """The samples' settings, or None with `inspect:` off."""
    return recipe.inspect.settings(recipe.seed) if recipe.inspect.enabled else None


def filter_slug(f: LemurFilter) -> str:
    """A filter's folder name under `rejects:` and the samples' parts."""
    return getattr(f, "rejects_slug", type(f).__name__.removesuffix("Filter").lower())


def attach_drop_samples(recipe: Recipe, filters: list[LemurFilter], run_dir: Path) -> None:
    """Give each filter its samples (their part files under the run), with `inspect:` on."""
    settings = sample_settings(recipe)
    if settings is None:
        return
    parts = work_folders.samples_parts(run_dir)
    for f in filters:
        f.samples = DropSamples(settings, str(parts / filter_slug(f)), PiiScrub(recipe.pii))


def pii_samples(recipe: Recipe, run_dir: Path) -> tuple[SampleSettings, str] | None:
    """The PII step's samples (settings, part folder), or None with `inspect:` off."""
    settings = sample_settings(recipe)
    if settings is None:
        return None
    return settings, str(work_folders.samples_parts(run_dir) / "pii")


def kept_steps(recipe: Recipe, run_dir: Path) -> list[KeptSamples]:
    """The kept-documents step after the filters (none with `inspect:` off)."""
    settings = sample_settings(recipe)
    if settings is None:
        return []
    return [KeptSamples(settings, str(work_folders.samples_parts(run_dir) / "kept"))]


def rerun_notice(recipe: Recipe, previous: dict[str, Any] | None) -> str | None:
    """The one line a build says before reading its inputs again only because `rejects:`
    or `inspect:` changed since the build in its output (None: nothing to say)."""
    if previous is None or not isinstance(previous.get("recipe"), dict):
        return None
    now, then = recipe.to_dict(), previous["recipe"]
    changed = [k for k in ("rejects", "inspect") if now.get(k) != then.get(k)]
    if not changed:
        return None
    rest = [k for k in now if k not in ("rejects", "inspect", "output") and now[k] != then.get(k)]
    if rest:  # other changes re-read anyway: nothing particular to say
        return None
    return (
        f"{' and '.join(changed)}: changed: reading and tokenizing again "
        f"({len(recipe.sources)} sources)"
    )


def marked_decoder(tokenizer: Tokenizer, markers: CodeMarkers | None) -> Callable:
    """Tokens -> text, without BOS/EOS framing, FIM and repository markers spelled out
    (`<|fim_prefix|>`-like names of their roles), so a sample shows a document's layout."""
    names = {}
    if markers is not None:
        names = {
            getattr(markers, r): f"<{r}>" for r in MARKER_ROLES if getattr(markers, r) is not None
        }
    framing = {i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None}

    def decode(tokens: np.ndarray) -> str:
        ids = tokens.tolist()
        while ids and ids[0] in framing:
            ids = ids[1:]
        while ids and ids[-1] in framing:
            ids = ids[:-1]
        out, run = [], []
        for i in ids:
            if i in names:
                out += [tokenizer.decode(run), names[i]]
                run = []
            else:
                run.append(i)
        return "".join([*out, tokenizer.decode(run)])

    return decode


def run_documents(
    tok_dir: Path,
    n_tasks: int,
    sources: set[int],
    settings: SampleSettings,
    chosen: Callable[[np.ndarray], bool] = lambda tokens: True,
) -> list[tuple[int, int, int]]:
    """Up to K documents of `sources` in a token run that `chosen` takes (by their tokens),
    those of lowest seeded rank of their id: (rank, task, local index)."""
    reader = TokenRunReader(tok_dir, None)
    found: list[tuple[int, int, int]] = []
    for task in range(n_tasks):
        rec = reader.records(task)
        cand = np.flatnonzero(np.isin(rec["source"], sorted(sources)))
        ranks = seeded_order(rec["id_hash"][cand], settings.seed)
        taken = 0
        for i in np.argsort(ranks, kind="stable").tolist():
            if taken == settings.per_reason:
                break
            if chosen(reader.tokens(task, int(cand[i]))):
                found.append((int(ranks[i]), task, int(cand[i])))
                taken += 1
    return sorted(found)[: settings.per_reason]


def document_records(
    recipe: Recipe, tok_dir: Path, picked: list[tuple[int, int, int]], decode: Callable, kind: str
) -> list[dict[str, Any]]:
    """kept.jsonl records of documents picked from a token run."""
    reader = TokenRunReader(tok_dir, None)
    out = []
    for _, task, local in picked:
        rec = reader.records(task)[local]
        source = recipe.sources[int(rec["source"])]
        text = decode(reader.tokens(task, local))
        out.append(
            {
                "source": source.name,
                "domain": source.domain,
                "language": reader.language(task, int(rec["language"])),
                "id": reader.doc_id(task, local),
                **capped(text, recipe.inspect.max_bytes),
                "kind": kind,
            }
        )
    return out


def extra_documents(
    recipe: Recipe, packed: TokenRun, grouped: bool, decode: Callable, markers: CodeMarkers | None
) -> list[dict[str, Any]]:
    """kept.jsonl's FIM documents (those holding the prefix marker) and repository
    documents (of repository sources, with `repos:`) of the run the pack stage reads."""
    settings = sample_settings(recipe)
    assert settings is not None
    out = []
    if recipe.fim is not None and markers is not None:
        fim = {i for i, s in enumerate(recipe.sources) if s.domain in recipe.fim.domains}
        mark = markers.prefix
        picked = run_documents(
            packed.token_dir, packed.tasks, fim, settings, lambda t: bool((t == mark).any())
        )
        out += document_records(recipe, packed.token_dir, picked, decode, "fim")
    if grouped:
        repos = set(recipe.repo_sources())
        picked = run_documents(packed.token_dir, packed.tasks, repos, settings)
        out += document_records(recipe, packed.token_dir, picked, decode, "repository")
    return out


def build_samples(
    recipe: Recipe,
    tok: tuple[Tokenizer, CodeMarkers | None],
    read: TokenRun,
    packed: tuple[TokenRun, bool],
    folder: Path,
) -> dict[str, Any] | None:
    """Write the build's samples folder; its manifest entry (None with `inspect:` off).
    `tok`: the build's tokenizer and FIM markers; `read`: the read run (with its dedup
    folder); `packed`: the run the pack stage reads, and whether it is the group stage's."""
    settings = sample_settings(recipe)
    if settings is None:
        return None
    merged = merge_parts([work_folders.samples_parts(read.folder)], settings)
    decode = marked_decoder(*tok)
    extra: dict[str, list[dict[str, Any]]] = {}
    if read.dedup is not None:
        num_perm = recipe.dedup.num_perm if recipe.dedup.near else None
        names = [s.name for s in recipe.sources]
        near, exact = duplicate_samples(
            read.token_dir, read.dedup, read.tasks, settings, decode, names, num_perm
        )
        extra[NEAR_DUPLICATES], extra[EXACT_DUPLICATES] = near, exact
    extra[KEPT] = extra_documents(recipe, *packed, decode, tok[1])
    return write_samples(folder, merged, settings, extra)

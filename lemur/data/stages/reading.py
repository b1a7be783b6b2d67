"""The read stage: every input read, tagged, filtered, signed for dedup and tokenized (one
datatrove pipeline, one token run per task under `<work>/tokens-<key>/`), then dedup's
bucket and cluster tasks (dedup/stage.py), in budgeted rounds when the mix asks (budget.py).

Datatrove's completion markers make a rerun skip finished tasks; the run's key
(`work_key`) is everything its tokens depend on, so another recipe reads again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lemur.data import work as work_folders
from lemur.data.budget import read_sources
from lemur.data.classifier_stage import classifier_filters, classifier_keys
from lemur.data.context import BuildContext, BuildError
from lemur.data.counts import collect_counts
from lemur.data.dedup.signer import DedupSigner
from lemur.data.dedup.stage import run_dedup
from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.template_chat import conversation_steps
from lemur.data.filter.base import EmptyDocumentFilter, LanguageFilter, LemurFilter
from lemur.data.filter.code import code_filters
from lemur.data.filter.decontaminate import decontamination_filter
from lemur.data.filter.pii import PiiRedactor
from lemur.data.filter.tagging import LanguageTagger
from lemur.data.filter.text import (
    C4Filter,
    FineWebFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from lemur.data.read.exclude import exclusions_of
from lemur.data.read.listing import InputFile, Listing
from lemur.data.read.remote_outcome import unfinished_reads
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe.recipe import Recipe
from lemur.data.repos.stage import spill_step
from lemur.data.runs.format import TokenRun
from lemur.data.runs.provenance import provenance_key
from lemur.data.sample_stage import attach_drop_samples, filter_slug, kept_steps, pii_samples
from lemur.data.stages.state import BuildState
from lemur.data.work import settings_sha
from lemur.tokenizer import is_tokenizer_json

# 2: records carry mix language families; 3: a tokenizer.json's not-special added tokens
# (Qwen2.5's <|fim_prefix|>, ...) are encoded as text, so earlier runs of such files differ.
WORK_VERSION = 3


def read_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """Read, filter, tokenize and deduplicate the inputs (in budgeted rounds when the mix
    asks): the read run."""
    listing = state.listing
    reading, run_dir, n_tasks, dd = read_sources(
        ctx.recipe,
        ctx.corpus,
        listing,
        lambda units, kind: read_round(ctx, listing, units, kind),
    )
    run = TokenRun(run_dir, n_tasks, dd)
    return dataclasses.replace(state, read=run, run=run, reading=reading)


def read_round(
    ctx: BuildContext, listing: Listing, units: list[InputFile], kind: str
) -> tuple[Path, int, Path | None]:
    """Tokenize `units` (kind `sample`, or `read`: then checked and deduplicated) under
    `<work root>/<tokens|sample>-<key>`; (work folder, tasks, dedup folder or None)."""
    recipe = ctx.recipe
    run_dir = work_folders.tokenize_run(ctx.work_root, kind, work_key(ctx, inputs_sha256(units)))
    n = tokenize_stage(ctx, units, run_dir)
    if kind != "read":
        return run_dir, n, None
    counts = collect_counts(run_dir, recipe, ctx.corpus, n, listing)
    unfinished = unfinished_reads(recipe, run_dir, n, counts)  # a rerun redoes those tasks
    if unfinished:
        raise BuildError(unfinished)
    _check_sources(counts)
    return run_dir, n, run_dedup(recipe.dedup, run_dir, n, ctx.stage)


def work_key(ctx: BuildContext, inputs_sha: str) -> str:
    """Key of the tokenize stage's work: everything its output depends on."""
    recipe = ctx.recipe
    # A tokenizer.json's framing is the recipe's choice: part of what the token runs depend on.
    tokenizer_sha = ctx.tok.key
    return settings_sha(
        {
            "v": WORK_VERSION,
            "sources": recipe.sources,
            "inputs": inputs_sha,
            "tokenizer": tokenizer_sha,
            "filters": recipe.filters,
            "dedup": recipe.dedup.signer_settings(),
            "rejects": recipe.rejects,
            # The samples' part files are the read tasks' (unset: older keys stay).
            **({"inspect": recipe.inspect.settings(recipe.seed)} if recipe.inspect.enabled else {}),
            "decontaminate": (
                recipe.decontaminate,
                [_stat(b.path) for b in recipe.decontaminate.benchmarks if b.path],
            ),
            "pii": recipe.pii,
            "tasks": recipe.executor.tasks,
            "batch": recipe.tokenize_batch_docs,
            # The models' content, not only their paths (unset: older recipes' keys stay).
            **({"classifiers": classifier_keys(recipe)} if recipe.filters.classifier else {}),
            # Chat tokens depend on the cut (seq_len, long policy); other builds' keys stay.
            **ctx.corpus.work_key(),
            **({"repos": recipe.repos.spill_settings()} if recipe.repos else {}),
            # Provenance rows and the exclude lists' entries (unset: older keys stay).
            **({"provenance": provenance_key(recipe)} if recipe.provenance else {}),
            **({"exclude": exclusions_of(recipe).key()} if recipe.exclude else {}),
        }
    )[:16]


def inputs_sha256(inputs: list[InputFile]) -> str:
    """A digest of the inputs (paths, sizes, mtimes, parts' bounds): any change moves it."""
    # A remote object is known by its listed size and version (ETag): no request here.
    return settings_sha(
        [
            (f.path, *(_stat(f.open_path) if f.size < 0 else (f.size, f.version)), *f.bounds)
            for f in inputs
        ]
    )


def _stat(path: str) -> tuple[int, int]:
    try:
        st = Path(path).stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return -1, -1


def _check_sources(counts: dict[str, Any]) -> None:
    for name, src in counts["sources"].items():
        if src["read"] == 0:
            first = next((e for e in counts["errors"] if e.get("source") == name), None)
            hint = ""
            if first:  # a remote error names its URL itself: not twice
                said = first["error"]
                where = "" if said.startswith(first["file"]) else f"{first['file']}: "
                hint = f"; first error: {where}{said}"
            raise BuildError(
                f"source '{name}' yielded no documents ({src['errors']} input errors{hint})"
            )


def tokenize_stage(ctx: BuildContext, inputs: list[InputFile], run_dir: Path) -> int:
    """Read, filter and tokenize every input file; return the number of tasks."""
    recipe, corpus, tok_path = ctx.recipe, ctx.corpus, ctx.tok.path
    n_tasks = max(1, min(recipe.executor.tasks, len(inputs)))
    pipeline = [
        SourcesReader(
            inputs,
            recipe.sources,
            errors_dir=str(work_folders.errors_dir(run_dir)),
            exclusions=exclusions_of(recipe),  # `exclude:` lists: dropped as they are read
        ),
        LanguageTagger(),
        *make_filters(recipe, inputs, run_dir, corpus.judged_as_text),
        # PII redaction rewrites text, not a conversation's messages (what chat trains on).
        *(
            [PiiRedactor(recipe.pii, pii_samples(recipe, run_dir))]
            if recipe.pii.enabled and recipe.pii.kinds and corpus.judged_as_text
            else []
        ),
        # Chat: render, encode, mask and cut before signing, so dedup sees what is trained on.
        *conversation_steps(corpus, str(tok_path), recipe.tokenize_batch_docs),
        *kept_steps(recipe, run_dir),  # `inspect:`: kept documents, length and language counts
        *(
            [
                DedupSigner(
                    recipe.dedup, str(work_folders.tokens_dir(run_dir)), tuple(recipe.domains())
                )
            ]
            if recipe.dedup.exact or recipe.dedup.near
            else []
        ),
        # Repository documents: files set aside by repository, grouped after dedup.
        *spill_step(recipe, run_dir, n_tasks),
        tokenize_writer(ctx, work_folders.tokens_dir(run_dir)),
    ]
    ctx.stage(pipeline, run_dir, n_tasks, "tokenize")
    missing = [
        r
        for r in range(n_tasks)
        if not (work_folders.tokens_dir(run_dir) / f"{r:05d}.bin").is_file()
    ]
    if missing:
        raise BuildError(
            f"tokenize stage: task {missing[0]} produced no output (see {run_dir / 'logs'})"
        )
    return n_tasks


def make_filters(
    recipe: Recipe,
    inputs: list[InputFile] | None = None,
    run_dir: Path | None = None,
    judged: bool = True,
) -> list[LemurFilter]:
    """The filter steps of a recipe, in order; disabled ones are left out. Classifiers'
    `keep_top` cuts come from a sample of `inputs` (default: all the recipe's), recorded
    under the tokenize run `run_dir` when given; `judged`: whether the code and web-text
    quality rules apply (the corpus's `judged_as_text`)."""
    filters: list[LemurFilter] = [EmptyDocumentFilter()]
    languages = {s.name: s.languages for s in recipe.sources if s.languages}
    if languages:
        filters.append(LanguageFilter(languages))
    # Chat builds skip the code and web-text quality rules: they judge files and web pages,
    # not conversations (and C4's line removal would change the text the messages render to).
    if recipe.filters.code.enabled and judged:
        filters += code_filters(recipe.filters.code)
    t = recipe.filters.text
    for config, cls in (
        (t.c4, C4Filter),
        (t.gopher_quality, GopherQualityFilter),
        (t.fineweb, FineWebFilter),
        (t.gopher_repetition, GopherRepetitionFilter),
    ):
        if t.enabled and config.enabled and judged:
            filters.append(cls(config))
    if recipe.filters.classifier:  # after the heuristics, which its keep_top sample passes
        filters += classifier_filters(recipe, filters, inputs, run_dir)
    if recipe.decontaminate.benchmarks:  # builds the benchmark indexes, once per build
        filters.append(decontamination_filter(recipe.decontaminate, recipe.work_root()))
    if recipe.rejects:
        from datatrove.pipeline.writers import JsonlWriter

        for f in filters:
            f.exclusion_writer = JsonlWriter(
                str(Path(recipe.rejects).expanduser() / filter_slug(f)),
                output_filename="${rank}.jsonl.gz",
            )
    if run_dir is not None:  # `inspect:`: each filter's drops, with what tripped the rule
        attach_drop_samples(recipe, filters, run_dir)
    return filters


def tokenize_writer(ctx: BuildContext, tokens_dir: Path) -> TokenizeWriter:
    """The tokenize tasks' writer: a tokenizer.json's BOS/EOS ids and engine from the
    recipe (a SentencePiece model's are its own); a chat template frames its documents."""
    corpus, tok_path, tokenizer = ctx.corpus, ctx.tok.path, ctx.tok.opened
    masks, batch = corpus.loss_masks, ctx.recipe.tokenize_batch_docs
    provenance = provenance_key(ctx.recipe)  # None: no provenance rows
    if not is_tokenizer_json(tok_path):
        return TokenizeWriter(
            str(tok_path), str(tokens_dir), batch_docs=batch, masks=masks, provenance=provenance
        )
    return TokenizeWriter(
        str(tok_path),
        str(tokens_dir),
        batch_docs=batch,
        masks=masks,
        framing=(tokenizer.bos_id, tokenizer.eos_id),
        engine=tokenizer.engine,
        template=corpus.chat_format == "template",
        provenance=provenance,
    )

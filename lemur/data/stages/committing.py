"""The commit stage: the manifest and its sections, then the output switched to the new build
(shards/commit.py); the previous build stays whole for readers until then.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lemur.data import work as work_folders
from lemur.data.classifier_stage import classifier_section
from lemur.data.context import BuildContext
from lemur.data.counts import collect_counts
from lemur.data.encode.prepare import copy_tokenizer_files
from lemur.data.pack.sections import ManifestSections
from lemur.data.recipe.recipe import Recipe
from lemur.data.sample_stage import SAMPLES_DIR, build_samples
from lemur.data.stages.state import BuildState
from lemur.shards.commit import commit
from lemur.shards.format import FORMAT, atomic_write_json, dtype_name


def commit_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The manifest and its sections (stats, mix, counts, dedup, FIM, classifiers), then
    the output switched to the new build (shards/commit.py)."""
    recipe, out, stages, read = ctx.recipe, ctx.out, state.pack, state.read
    assert stages is not None and read is not None and state.reading is not None
    dups = stages.write_duplicates(out)  # duplicates.jsonl, when the recipe asks
    totals = stages.totals()
    if state.grouped is not None:  # dedup's removals before grouping
        state.grouped.add_removals(totals)
    sections = ManifestSections(
        recipe, ctx.corpus, state.plan, totals, read.dedup, read.tasks, dups
    )
    # What was read of each source, when budgeted reading chose (a full read's counts stay).
    units = state.reading.summary(recipe)["sources"] if ctx.corpus.budgeted_reading() else None
    counts = collect_counts(
        read.folder, recipe, ctx.corpus, read.tasks, state.listing, sections.dedup(), units
    )
    counts |= state.grouped.manifest_counts(recipe) if state.grouped is not None else {}
    prefix = stages.prefix
    tok_file = copy_tokenizer_files(ctx.tok.path, out / prefix)
    atomic_write_json(out / prefix / "stats.json", sections.stats())
    samples = build_samples(
        recipe,
        (ctx.tok.opened, ctx.tok.markers),
        read,
        (state.run, state.grouped is not None),
        out / prefix / SAMPLES_DIR,
    )
    manifest = {
        "format": FORMAT,
        "dtype": dtype_name(stages.dtype),
        "seq_len": recipe.seq_len,
        "tokenizer": {"file": f"{prefix}/{tok_file}", **ctx.tok.info},
        **ctx.corpus.manifest_fields(),  # a chat template's framing: no BOS/EOS added
        "stats": f"{prefix}/stats.json",
        "shards": [s.to_json() for s in state.shards],
        "mix": sections.mix(),
        "counts": counts,
        **classifier_section(recipe, read.folder, read.tasks),  # {} without classifiers
        **({"fim": state.fim} if state.fim is not None else {}),
        **({"samples": {**samples, "dir": f"{prefix}/{SAMPLES_DIR}"}} if samples else {}),
        "recipe": recipe.to_dict(),
        "recipe_sha256": recipe.sha256(),
        "inputs_sha256": state.inputs_sha,
    }
    commit(out, prefix, manifest, work_folders.finished_shuffles(ctx.work_root))
    for warning in val_window_warnings(recipe, manifest["shards"]):
        ctx.note(f"warning: {warning}")
    return dataclasses.replace(state, result=manifest)


def val_window_warnings(recipe: Recipe, shards: list[dict[str, Any]]) -> list[str]:
    """One warning per val domain none of whose shards holds a window of the recipe's
    `seq_len` + 1 tokens: a trainer at that length has nothing to evaluate there."""
    warnings = []
    for domain in sorted({s["domain"] for s in shards if s["split"] == "val"}):
        val = [s for s in shards if s["split"] == "val" and s["domain"] == domain]
        # A shard of T tokens holds (T - 1) // seq_len windows (lemur.shards.windows).
        if max(int(s["tokens"]) for s in val) > recipe.seq_len:
            continue
        docs, tokens = sum(s["documents"] for s in val), sum(s["tokens"] for s in val)
        warnings.append(
            f"val split of domain {domain!r} ({docs:,} documents, {tokens:,} tokens) holds no "
            f"window of seq_len + 1 = {recipe.seq_len + 1} tokens: a trainer at batch.seq_len "
            f"{recipe.seq_len} cannot evaluate it; raise val_fraction (now "
            f"{recipe.val_fraction}) or add documents"
        )
    return warnings

"""`lemur-data build`: sources -> documents -> tokens -> mixed, shuffled, packed shards.

`build` locks the output, lists the inputs, stops when the output already holds this
build, prepares the tokenizer into the one `BuildContext`, then runs `STAGES` (one module
each under stages/), each a `Stage` from the `BuildState` the one before left to the next:
read (read, tag, filter, sign, tokenize; dedup), fim, repos, plan (histograms, the mix),
scatter, gather (the shards), commit (the manifest); then the recipe's exports.
Every stage's tasks run on the recipe's executor through the context (`ctx.stage`)."""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from lemur.atomic_files import remove_stale_temporaries
from lemur.data import work as work_folders
from lemur.data.classifier_stage import classifiers_unchanged
from lemur.data.context import BuildContext, BuildError, BuildTokenizer
from lemur.data.encode.prepare import (
    build_markers,
    build_tokenizer_info,
    check_given_tokenizer,
    open_build_tokenizer,
    prepare_tokenizer,
)
from lemur.data.pack.shuffle import ShuffleError
from lemur.data.read.listing import InputFile, Listing, list_inputs
from lemur.data.read.stack_v2 import check_content_clients
from lemur.data.recipe.recipe import Recipe
from lemur.data.repos.stage import check_repo_format
from lemur.data.run.lock import DirectoryLock, LockedError
from lemur.data.run.stage import executor_session
from lemur.data.run.task import Reporter
from lemur.data.sample_stage import rerun_notice
from lemur.data.stages.committing import commit_stage
from lemur.data.stages.exporting import export_stage
from lemur.data.stages.grouping import repos_stage
from lemur.data.stages.infilling import fim_stage
from lemur.data.stages.planning import plan_stage
from lemur.data.stages.reading import inputs_sha256, read_stage, work_key
from lemur.data.stages.shuffling import gather_stage, scatter_stage
from lemur.data.stages.state import BuildState, Stage
from lemur.progress import format_duration
from lemur.shards.check import check_structure
from lemur.shards.format import MANIFEST, ShardFormatError, read_manifest

__all__ = ["STAGES", "UP_TO_DATE", "BuildError", "build"]
# The stage a build reports when the output already holds it (nothing is written then).
UP_TO_DATE = "up to date"

# The build, stage by stage, once its inputs are listed and its tokenizer prepared: each
# reads the state the one before left (the token run, what the manifest gathers).
STAGES: tuple[Stage, ...] = (
    read_stage,
    fim_stage,
    repos_stage,
    plan_stage,
    scatter_stage,
    gather_stage,
    commit_stage,
)


def build(
    recipe: Recipe,
    report: Reporter | None = None,
    force: bool = False,
    plan_only: bool = False,
    on_plan: Callable[[dict[str, Any]], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every stage of a build and return the manifest written to `<output>/manifest.json`.

    With `plan_only`, stop after tokenizing and deduplicating and return the mix plan
    (`{"plan": ...}`) without writing shards; `on_plan` receives the plan before packing.
    `note` receives the lines a log should show (a stale lock taken over, warnings about
    the result, the wall time; default: loguru at INFO). When the output already holds
    this build, `report` is told stage `UP_TO_DATE` and nothing is written.
    The output directory is locked for the whole build; the previous complete build in it
    stays valid until the new one is complete (see docs/reliability.md).
    """
    report = report or (lambda stage, done, total: None)
    note = note or logger.info
    check_given_tokenizer(recipe)  # a refused tokenizer or FIM markers: nothing made yet
    check_repo_format(recipe)  # and repository markers it lacks
    check_content_clients(recipe.sources)  # a client no task could make: one line, exit 2
    out = Path(recipe.output).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    work_root = recipe.work_root()
    try:
        with (
            DirectoryLock(out) as lock,
            _work_lock(work_root, out) as work_lock,
            executor_session(recipe.executor),
        ):
            for said in (held.taken_over() for held in (lock, work_lock) if held is not None):
                if said:
                    note(said)
            ctx = BuildContext.of(recipe, out, report, note, plan_only, on_plan)
            return _build_locked(ctx, force)
    except (LockedError, ShuffleError) as e:
        raise BuildError(str(e)) from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise BuildError(
                f"{e.filename or out}: no space left on device ({e.strerror}); "
                f"free some space and rerun: finished work is kept"
            ) from None
        raise


def _work_lock(work_root: Path, out: Path) -> contextlib.AbstractContextManager:
    """A lock on a work directory outside the output (`work_dir`), which other builds may
    share: commit() clears its finished shuffles, which must not be another build's."""
    if work_root.resolve() == (out / ".work").resolve():
        return contextlib.nullcontext()  # the output's own lock covers it
    work_root.mkdir(parents=True, exist_ok=True)
    return DirectoryLock(work_root)


def _build_locked(ctx: BuildContext, force: bool) -> dict[str, Any]:
    """`build` while holding the output directory's lock: the inputs listed, nothing done
    when the output is up to date, the tokenizer prepared, then `STAGES` in order."""
    started = time.time()
    listing, inputs_sha = _listed(ctx)
    if not force and not ctx.plan_only and is_up_to_date(ctx.out, ctx.recipe, inputs_sha):
        ctx.report(UP_TO_DATE, 1, 1)
        export_stage(ctx)  # a new or missing export of the build already there
        return json.loads((ctx.out / MANIFEST).read_text())
    ctx = ctx.with_tokenizer(prepared_tokenizer(ctx, listing.files))
    said = rerun_notice(ctx.recipe, _previous_manifest(ctx.out))
    if (
        said
        and not work_folders.tokenize_run(ctx.work_root, "read", work_key(ctx, inputs_sha)).is_dir()
    ):
        ctx.note(said)  # `rejects:`/`inspect:` alone made the read run again: say so first
    state = BuildState(listing, inputs_sha)
    for stage in STAGES:
        state = stage(ctx, state)
        if state.result is not None:
            break
    assert state.result is not None, "the build's last stage sets its result"
    export_stage(ctx)  # the recipe's `export:` formats, from the committed shards
    if not ctx.plan_only:
        ctx.note(f"build done in {format_duration(time.time() - started)}")
    return state.result


def _listed(ctx: BuildContext) -> tuple[Listing, str]:
    """The build's inputs listed, and their digest, once a killed build's temporaries are
    gone (both locks are held: a temporary whose writer is gone is such, atomic_files)."""
    for root in [r for r in dict.fromkeys((ctx.out, ctx.work_root)) if r.is_dir()]:
        remove_stale_temporaries(root)
    ctx.report("list inputs", 0, 1)
    listing = list_inputs(ctx.recipe)
    ctx.report("list inputs", 1, 1)
    return listing, inputs_sha256(listing.files)


def is_up_to_date(out: Path, recipe: Recipe, inputs_sha: str) -> bool:
    """True when the output already holds a complete build of this recipe over these inputs."""
    try:
        manifest = read_manifest(out)
    except (OSError, ShardFormatError):
        return False
    if manifest.get("recipe_sha256") != recipe.sha256():
        return False
    if manifest.get("inputs_sha256") != inputs_sha:
        return False
    if not classifiers_unchanged(recipe, manifest):  # the models' content, not their paths
        return False
    try:
        check_structure(out, manifest=manifest)  # tokenizer and every shard, sizes and index
    except (OSError, ShardFormatError):
        return False
    return True


def prepared_tokenizer(ctx: BuildContext, inputs: list[InputFile]) -> BuildTokenizer:
    """The build's prepared tokenizer: its file, manifest entry, FIM markers, and the
    tokenizer opened once, which every later check and stage of this process uses."""
    recipe = ctx.recipe
    ctx.report("tokenizer", 0, 1)
    tok_path = prepare_tokenizer(recipe, ctx.corpus, inputs, ctx.work_root)
    opened = open_build_tokenizer(recipe, tok_path)
    tok_info = build_tokenizer_info(ctx.corpus, tok_path, opened)
    markers = build_markers(recipe, tok_path, opened) if recipe.fim is not None else None
    check_repo_format(recipe, tok_path, opened)  # a recipe mistake, found before any read
    ctx.report("tokenizer", 1, 1)
    return BuildTokenizer(tok_path, tok_info, markers, opened)


def _previous_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the build the output holds (None: none, or unreadable)."""
    try:
        return read_manifest(out)
    except (OSError, ShardFormatError):
        return None

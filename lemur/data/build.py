"""`lemur-data build`: sources -> documents -> tokens -> mixed, shuffled, packed shards.

`build` lists the inputs, stops when the output already holds this build, prepares the
tokenizer into the one `BuildContext`, then runs `STAGES`, each a `Stage` from the
`BuildState` the one before left to the next:
1. read: read, tag, filter, sign for dedup, tokenize (a datatrove pipeline over all input
   files, one run of tokens per task under `<work>/tokens-<key>/`; `<work>` is
   `<output>/.work`, or the recipe's `work_dir`, which builds into other outputs may share;
   datatrove's completion markers make reruns skip finished tasks), then dedup
   (dedup/stage.py: bucket tasks, then one cluster task), in budgeted rounds when asked;
2. fim: the FIM tasks rewrite the run's code documents (fim/rewrite.py);
3. repos: the group tasks make repository documents (repos/stage.py);
4. plan: the pack stage's histogram tasks, then the mix and val plan (pack/);
5. shuffle: scatter tasks, then gather tasks (one per shard) writing the shards;
6. commit: the manifest, and the output switched to the new build (shards/commit.py).
Every stage's tasks run on the recipe's executor through the context (`ctx.stage`)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from lemur.atomic_files import remove_stale_temporaries
from lemur.data import work as work_folders
from lemur.data.budget import Reading, read_sources
from lemur.data.classifier_stage import (
    classifier_filters,
    classifier_keys,
    classifier_section,
    classifiers_unchanged,
)
from lemur.data.context import BuildContext, BuildError, BuildTokenizer
from lemur.data.counts import collect_counts, drops
from lemur.data.dedup.signer import DedupSigner
from lemur.data.dedup.stage import expected_memory, run_dedup
from lemur.data.encode.prepare import (
    build_markers,
    build_tokenizer_info,
    check_given_tokenizer,
    copy_tokenizer_files,
    open_build_tokenizer,
    prepare_tokenizer,
    sample_texts,
)
from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.template_chat import conversation_steps
from lemur.data.export_stage import export_stage
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
from lemur.data.fim.rewrite import FimJob, FimRewrite, fim_counts
from lemur.data.pack.plan import PackError, PackPlan
from lemur.data.pack.sections import ManifestSections
from lemur.data.pack.shuffle import ShuffleError
from lemur.data.pack.write import PackStages
from lemur.data.read.exclude import exclusions_of
from lemur.data.read.listing import InputFile, Listing, list_inputs
from lemur.data.read.remote_outcome import unfinished_reads
from lemur.data.read.sources import SourcesReader
from lemur.data.read.stack_v2 import check_content_clients
from lemur.data.recipe.recipe import Recipe
from lemur.data.repos.stage import (
    Grouped,
    check_repo_format,
    group_repositories,
    pack_recipe,
    spill_step,
)
from lemur.data.run.lock import DirectoryLock, LockedError
from lemur.data.run.stage import executor_session
from lemur.data.run.task import Reporter
from lemur.data.runs.format import TokenRun
from lemur.data.runs.provenance import provenance_key
from lemur.data.sample_stage import (
    SAMPLES_DIR,
    attach_drop_samples,
    build_samples,
    filter_slug,
    kept_steps,
    pii_samples,
    rerun_notice,
)
from lemur.progress import format_duration
from lemur.shards.check import check_structure
from lemur.shards.commit import commit
from lemur.shards.format import (
    FORMAT,
    MANIFEST,
    ShardFormatError,
    ShardInfo,
    atomic_write_json,
    dtype_name,
    read_manifest,
    token_dtype,
)
from lemur.tokenizer import is_tokenizer_json
from lemur.tokenizer.fim import MARKER_ROLES

# 2: records carry mix language families; 3: a tokenizer.json's not-special added tokens
# (Qwen2.5's <|fim_prefix|>, ...) are encoded as text, so earlier runs of such files differ.
WORK_VERSION = 3
__all__ = ["BuildError", "build", "make_filters", "prepare_tokenizer", "sample_texts"]
# The stage a build reports when the output already holds it (nothing is written then).
UP_TO_DATE = "up to date"


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _stat(path: str) -> tuple[int, int]:
    try:
        st = Path(path).stat()
        return st.st_size, st.st_mtime_ns
    except OSError:
        return -1, -1


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


def inputs_sha256(inputs: list[InputFile]) -> str:
    """A digest of the inputs (paths, sizes, mtimes, parts' bounds): any change moves it."""
    # A remote object is known by its listed size and version (ETag): no request here.
    return _sha(
        [
            (f.path, *(_stat(f.open_path) if f.size < 0 else (f.size, f.version)), *f.bounds)
            for f in inputs
        ]
    )


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


def _work_key(ctx: BuildContext, inputs_sha: str) -> str:
    """Key of the tokenize stage's work: everything its output depends on."""
    recipe = ctx.recipe
    # A tokenizer.json's framing is the recipe's choice: part of what the token runs depend on.
    tokenizer_sha = ctx.tok.key
    return _sha(
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


def read_round(
    ctx: BuildContext, listing: Listing, units: list[InputFile], kind: str
) -> tuple[Path, int, Path | None]:
    """Tokenize `units` (kind `sample`, or `read`: then checked and deduplicated) under
    `<work root>/<tokens|sample>-<key>`; (work folder, tasks, dedup folder or None)."""
    recipe = ctx.recipe
    run_dir = work_folders.tokenize_run(ctx.work_root, kind, _work_key(ctx, inputs_sha256(units)))
    n = tokenize_stage(ctx, units, run_dir)
    if kind != "read":
        return run_dir, n, None
    counts = collect_counts(run_dir, recipe, ctx.corpus, n, listing)
    unfinished = unfinished_reads(recipe, run_dir, n, counts)  # a rerun redoes those tasks
    if unfinished:
        raise BuildError(unfinished)
    _check_sources(counts)
    return run_dir, n, run_dedup(recipe.dedup, run_dir, n, ctx.stage)


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


@dataclass(frozen=True)
class BuildState:
    """What one stage of a build hands the next: the token run so far (the read stage's,
    rewritten by FIM, grouped into repositories) and what the manifest gathers on the way."""

    listing: Listing
    inputs_sha: str
    read: TokenRun | None = None  # the read stage's run (its counts, its dedup)
    run: TokenRun | None = None  # the run the next stage reads
    reading: Reading | None = None  # which units of each source were read
    fim: dict[str, Any] | None = None  # the manifest's `fim` section
    grouped: Grouped | None = None  # the group stage, with `repos:`
    pack: PackStages | None = None
    plan: PackPlan | None = None
    shards: tuple[ShardInfo, ...] = ()
    result: dict[str, Any] | None = None  # set by the stage that ends the build


# A stage of the build: the shared context and the state so far -> the state it leaves.
Stage = Callable[[BuildContext, BuildState], BuildState]


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


def fim_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The FIM tasks over the read run (fim/rewrite.py): the run with its tokens rewritten,
    and the manifest's `fim` section; the state as it is without FIM. They start from the
    run's kept read, filter, dedup and tokenize work (a new rate re-runs only them and
    packing)."""
    recipe, tok, run = ctx.recipe, ctx.tok, state.run
    fim, markers = recipe.fim, tok.markers
    if fim is None or markers is None or run is None:
        return state
    sources = tuple(i for i, s in enumerate(recipe.sources) if s.domain in fim.domains)
    job = FimJob(str(tok.path), tok.info.get("engine", "auto"), fim, recipe.seed, markers, sources)
    folder = work_folders.fim_folder(run.folder, job.key(tok.key, run.dedup))
    out = work_folders.tokens_dir(folder)
    rewrite = FimRewrite(run.token_dir, run.dedup, str(out), job)
    ctx.stage([rewrite], folder, run.tasks, "fim")
    roles = {r: getattr(markers, r) for r in MARKER_ROLES if getattr(markers, r) is not None}
    section = {
        **fim.work_settings(recipe.seed),
        "domains": list(fim.domains),
        "markers": {"style": markers.style, **roles},
        "counts": fim_counts(out, run.tasks),
    }
    return dataclasses.replace(state, run=dataclasses.replace(run, tokens=out), fim=section)


def repos_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """With `repos:`, the group tasks: repository documents and the other documents of the
    run, duplicates already removed (repos/stage.py); the state as it is without."""
    if ctx.recipe.repos is None or state.run is None:
        return state
    grouped = group_repositories(ctx, state.run)
    return dataclasses.replace(state, run=TokenRun(grouped.run, grouped.tasks), grouped=grouped)


def pack_stages(ctx: BuildContext, run: TokenRun, recipe: Recipe | None = None) -> PackStages:
    """The build's pack stage over the token run `run`, tasks run through the context's
    runner, shards under the build's own directory of the output (`PackStages.prefix`);
    `recipe`: the one the run is packed with (default: the build's)."""
    recipe = recipe or ctx.recipe
    key = work_folders.run_key(run.folder)
    # The build's own directory: no file of it shares a path with the previous build's, so
    # that build stays whole for readers until the manifest is replaced.
    # Named by content, not place: the same build in another directory gets the same names.
    skip = ("output", "work_dir", "export")  # where it goes, and what is made of it after
    settings = {k: v for k, v in recipe.to_dict().items() if k not in skip}
    return PackStages(
        recipe,
        ctx.corpus,
        run.token_dir,
        run.tasks,
        token_dtype(ctx.tok.info["vocab_size"]),
        dedup_dir=run.dedup,
        prefix=f"build-{_sha([settings, key])[:12]}",
        tokenizer=ctx.tok.path,
        run_stage=ctx.stage,
    )


def plan_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The pack stage's histogram tasks, then the mix and val plan (in this process); with
    `plan_only` the build ends here with the plan."""
    recipe, read, run = ctx.recipe, state.read, state.run
    assert read is not None and run is not None and state.reading is not None
    # A group run has its duplicates removed already: it is packed without dedup.
    stages = pack_stages(ctx, run, pack_recipe(recipe) if state.grouped else None)
    try:
        plan = stages.plan()
    except PackError as e:  # e.g. nothing left to pack: say what the documents became
        counts = collect_counts(read.folder, recipe, ctx.corpus, read.tasks, state.listing)
        raise PackError(f"{e}; {drops(counts)}") from None
    reading = state.reading.summary(recipe)
    if ctx.on_plan:
        memory = {**expected_memory(recipe.dedup, read.dedup), **plan.memory}
        ctx.on_plan({**plan.mix.to_json(), "memory": memory, "reading": reading})
    result = {"plan": plan.mix.to_json(), "reading": reading} if ctx.plan_only else None
    return dataclasses.replace(state, pack=stages, plan=plan, result=result)


def shuffle_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """Scatter tasks, then gather tasks: the shards, under the build's own directory."""
    assert state.pack is not None and state.plan is not None
    return dataclasses.replace(state, shards=tuple(state.pack.shuffle(state.plan, ctx.out)))


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


# The build, stage by stage, once its inputs are listed and its tokenizer prepared: each
# reads the state the one before left (the token run, what the manifest gathers).
STAGES: tuple[Stage, ...] = (
    read_stage,
    fim_stage,
    repos_stage,
    plan_stage,
    shuffle_stage,
    commit_stage,
)


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


def _listed(ctx: BuildContext) -> tuple[Listing, str]:
    """The build's inputs listed, and their digest, once a killed build's temporaries are
    gone (both locks are held: a temporary whose writer is gone is such, atomic_files)."""
    for root in [r for r in dict.fromkeys((ctx.out, ctx.work_root)) if r.is_dir()]:
        remove_stale_temporaries(root)
    ctx.report("list inputs", 0, 1)
    listing = list_inputs(ctx.recipe)
    ctx.report("list inputs", 1, 1)
    return listing, inputs_sha256(listing.files)


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
        and not work_folders.tokenize_run(
            ctx.work_root, "read", _work_key(ctx, inputs_sha)
        ).is_dir()
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

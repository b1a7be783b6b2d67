"""The build's hooks for repository documents: the read stage's set-aside step, and the
group stage run between dedup and packing (its run replaces the read stage's for the pack
stage; its counts go to the manifest's `counts.repositories`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemur.data import work as work_folders
from lemur.data.context import BuildContext
from lemur.data.encode.prepare import given_model, open_build_tokenizer
from lemur.data.pack.shuffle import ScatterTotals
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.recipe import Recipe
from lemur.data.repos.group import GroupCounts, GroupSettings, RepoGroups, read_counts
from lemur.data.repos.render import RepoFormat
from lemur.data.repos.spill import RepoSpill
from lemur.data.runs.format import TokenRun
from lemur.tokenizer import Tokenizer, TokenizerError, is_tokenizer_json
from lemur.tokenizer.fim import CodeMarkers, find_code_markers
from lemur.tokenizer.hf_files import tokenizer_json_path

GROUP_VERSION = 1


class RepoFormatError(RecipeError):
    """The recipe asks for what the tokenizer lacks (repository markers, named FIM markers):
    a recipe mistake (exit 2), found once the tokenizer is prepared."""


def spill_step(recipe: Recipe, run_dir: Path, tasks: int) -> list[RepoSpill]:
    """The read pipeline's set-aside step (before the token writer); none without `repos:`."""
    repos = recipe.repos
    if repos is None:
        return []
    out = str(work_folders.repos_spill(run_dir))
    return [RepoSpill(out, tuple(recipe.repo_sources()), repos.key, tasks)]


def repo_format(recipe: Recipe, tokenizer: Tokenizer) -> tuple[RepoFormat, CodeMarkers | None]:
    """The repository format the recipe and the tokenizer settle (render.py), and the
    model's code markers (for fill-in-the-middle per file; None when it has none)."""
    assert recipe.repos is not None
    fim = recipe.fim
    try:
        markers = find_code_markers(tokenizer, fim.markers if fim is not None else None)
    except TokenizerError as e:
        raise RepoFormatError(f"recipe: fim.markers: {e}") from None
    fmt = RepoFormat.of(markers, plain=recipe.repos.format == "plain")
    if recipe.repos.format == "markers" and fmt.plain:
        raise RepoFormatError(NO_REPO_MARKERS)
    return fmt, markers


NO_REPO_MARKERS = (
    "recipe: repos.format markers: the tokenizer has no repository markers "
    "(<|repo_name|> and <|file_sep|>, or <repo_name> and <file_sep>); use "
    "repos.format auto or plain"
)


def check_repo_format(
    recipe: Recipe, tok_path: Path | None = None, tok: Tokenizer | None = None
) -> None:
    """Raise RepoFormatError when the recipe's `repos.format` (or `fim.markers`) asks for
    what the tokenizer lacks; nothing to check without `repos:`. `tok_path` None: before
    the tokenizer is prepared (so that a refused build makes nothing): the given one (what
    preparing appends, CodeLlama's FIM pieces, holds no repository marker), or what a
    trained one will hold (a byte-level BPE of a FIM build: Qwen2.5-Coder's markers).
    `tok`: the tokenizer at `tok_path`, if open already."""
    if recipe.repos is None:
        return
    cfg = recipe.tokenizer
    if tok_path is None and cfg.hf is None and cfg.model is None:
        trained_markers = cfg.train.kind == "byte-bpe" and recipe.fim is not None
        if recipe.repos.format == "markers" and not trained_markers:
            raise RepoFormatError(NO_REPO_MARKERS)
        return
    if tok_path is None:
        tok_path = tokenizer_json_path(cfg.hf) if cfg.hf is not None else given_model(cfg.model)
    repo_format(recipe, tok if tok is not None else open_build_tokenizer(recipe, tok_path))


@dataclass
class Grouped:
    """A finished group stage: its run (read by the pack stage), tasks and counts."""

    run: Path
    tasks: int
    counts: GroupCounts
    fmt: RepoFormat
    budget: int

    def add_removals(self, totals: ScatterTotals) -> None:
        """Put dedup's removals, made before grouping, into the pack stage's totals."""
        for source, n in self.counts.removed_exact.items():
            totals.removed_exact[source] += n
        for source, n in self.counts.removed_near.items():
            totals.removed_near[source] += n

    def manifest_counts(self, recipe: Recipe) -> dict[str, Any]:
        """{"repositories": the manifest's `counts.repositories`}: files in = grouped +
        duplicates, repositories, documents."""
        return {"repositories": self._counts(recipe)}

    def _counts(self, recipe: Recipe) -> dict[str, Any]:
        c = self.counts
        assert recipe.repos is not None
        return {
            "order": recipe.repos.order,
            "format": "plain" if self.fmt.plain else "markers",
            "max_tokens": self.budget,
            "files": {"in": c.files_in, "grouped": c.grouped, "duplicates": c.duplicates},
            "repositories": c.repositories,
            "repositories_removed": c.repositories_removed,
            "documents": c.documents,
            "split_repositories": c.split_repositories,
            "files_over_budget": c.files_over_budget,
            "files_without_repository": c.without_repository,
            "by_source": {n: dict(sorted(per.items())) for n, per in sorted(c.by_source.items())},
        }


def pack_recipe(recipe: Recipe) -> Recipe:
    """The recipe the pack stage reads a group run with: dedup is done (removals applied)."""
    dedup = dataclasses.replace(recipe.dedup, exact=False, near=False)
    return dataclasses.replace(recipe, dedup=dedup)


def group_repositories(ctx: BuildContext, read: TokenRun) -> Grouped:
    """Run the group tasks over a finished read (and dedup) run; the group run. The other
    documents are copied from the run's token files (perhaps the FIM stage's rewrite of the
    run, which keeps its documents and their order)."""
    recipe, tok_path, tokenizer = ctx.recipe, ctx.tok.path, ctx.tok.opened
    run_dir, tasks, dedup_dir = read.folder, read.tasks, read.dedup
    tok_dir = read.tokens
    repos = recipe.repos
    assert repos is not None
    fmt, markers = repo_format(recipe, tokenizer)
    budget = repos.max_tokens or recipe.seq_len
    engine = tokenizer.engine if is_tokenizer_json(tok_path) else ""
    fim = recipe.fim
    key = {
        "v": GROUP_VERSION,
        "repos": dataclasses.asdict(repos),
        "budget": budget,
        "seed": recipe.seed,
        "fmt": dataclasses.asdict(fmt),
        "dedup": dedup_dir.name if dedup_dir else None,
        "from": tok_dir.parent.name if tok_dir else None,  # the FIM stage's folder (keyed)
        "engine": engine,
        "fim": fim.work_settings(recipe.seed) if fim is not None else None,
        "markers": dataclasses.asdict(markers) if markers is not None else None,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    run = work_folders.repos_run(run_dir, digest)
    settings = GroupSettings(
        tok_dir=str(read.token_dir),
        spill_dir=str(work_folders.repos_spill(run_dir)),
        dedup_dir=str(dedup_dir) if dedup_dir else None,
        out_dir=str(work_folders.tokens_dir(run)),
        tasks=tasks,
        tokenizer=str(tok_path),
        engine=engine or "auto",
        sources=tuple(s.name for s in recipe.sources),
        grouped=tuple(recipe.repo_sources()),
        order=repos.order,
        fmt=fmt,
        budget=budget,
        seed=recipe.seed,
        fim=fim,
        markers=markers,
        domains=tuple(s.domain for s in recipe.sources),
    )
    ctx.stage([RepoGroups(settings)], run, tasks, "repos: group")
    counts = read_counts(work_folders.tokens_dir(run), tasks)
    return Grouped(run, tasks, counts, fmt, budget)

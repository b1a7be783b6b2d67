"""Pack tokenized documents into shards: the histogram, scatter and gather tasks (`PackStages`).

Every stage but the plan is a set of tasks on the build's executor (steps.py), each holding
one tokenize task's records or one shard; the plan holds one histogram per mix unit. The
manifest's sections are another job: sections.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.corpus import Corpus
from lemur.data.pack.plan import PackError, PackPlan, make_plan
from lemur.data.pack.select import Groups
from lemur.data.pack.settings import PackSettings
from lemur.data.pack.shuffle import (
    DONE,
    ScatterTotals,
    ShardWriter,
    ShuffleError,
    check_scatter,
    read_summaries,
    summary_path,
)
from lemur.data.pack.steps import Duplicates, PackGather, PackPrep, PackScatter
from lemur.data.recipe.recipe import Recipe
from lemur.data.run.task import StageRunner, run_here
from lemur.data.work import shuffle_folder
from lemur.shards.format import ShardInfo, write_shard

__all__ = ["PackError", "PackPlan", "PackStages"]


class PackStages:
    """Runs one build's pack tasks through `run_stage`: histograms and plan, scatter, gather.

    `tok_dir`: the tokenize tasks' runs; `dedup_dir`: the finished dedup tasks' folder (see
    dedup/stage.py); `prefix`: the build's own directory under the output, where its shards
    go; `tokenizer`: the model that decodes `duplicates.jsonl` (when the recipe asks for it).
    """

    def __init__(
        self,
        recipe: Recipe,
        corpus: Corpus,
        tok_dir: Path,
        n_tasks: int,
        dtype: np.dtype,
        *,
        dedup_dir: Path | None = None,
        prefix: str = "",
        tokenizer: Path | None = None,
        run_stage: StageRunner = run_here,
    ) -> None:
        self.recipe = recipe
        self.corpus = corpus
        self.tok_dir = tok_dir
        self.n_tasks = n_tasks
        self.dtype = np.dtype(dtype)
        self.dedup_dir = dedup_dir
        self.prefix = prefix
        self.run_stage = run_stage
        self.duplicates = None
        if recipe.dedup.write_duplicates and dedup_dir is not None:
            if tokenizer is None:
                raise ValueError("PackStages: the recipe writes duplicates: give the tokenizer")
            self.duplicates = Duplicates(str(tokenizer), tuple(s.name for s in recipe.sources))
        key = json.dumps([prefix, str(tok_dir), str(dedup_dir), self.dtype.str, n_tasks])
        # A shuffle folder: commit() removes it once the manifest is written.
        self.shuffle_dir = shuffle_folder(
            recipe.work_root(), hashlib.sha256(key.encode()).hexdigest()[:16]
        )

    def plan(self) -> PackPlan:
        """Histogram tasks, then the plan (no shards written): what `--plan-only` shows."""
        cfg = self.recipe.dedup
        if (cfg.exact or cfg.near) and self.dedup_dir is None:
            raise ValueError("PackStages: dedup is on but no dedup stage folder was given")
        hist = self.shuffle_dir / "hist"
        groups = Groups.of(self.recipe, self.corpus)
        step = PackPrep(self.tok_dir, self.dedup_dir, hist, groups, self.duplicates)
        self.run_stage([step], self.shuffle_dir / "prep", self.n_tasks, "pack: histograms")
        return make_plan(self.recipe, self.corpus, hist, self.n_tasks, self.dtype.itemsize)

    def settings(self, plan: PackPlan) -> PackSettings:
        """What the scatter and gather tasks of `plan` are configured with."""
        masks = self.corpus.loss_masks
        return PackSettings.of(plan, Groups.of(self.recipe, self.corpus), self.dtype, masks)

    def scatter(self, plan: PackPlan) -> None:
        """The scatter tasks: every document of the run to its shard's bucket, in the plan's
        order (a task whose files another process changed is redone on a rerun)."""
        settings, shuffle_dir = self.settings(plan), self.shuffle_dir
        scatter = PackScatter(self.tok_dir, self.dedup_dir, shuffle_dir, settings)
        self.run_stage([scatter], shuffle_dir / "scatter", self.n_tasks, "shuffle: scatter")
        bad = check_scatter(shuffle_dir, self.n_tasks, self.dtype, settings.masks)
        if bad:
            for t, _ in bad:  # a plain rerun redoes these scatter tasks (deterministically)
                (shuffle_dir / "scatter" / "logs" / "completions" / f"{t:05d}").unlink(
                    missing_ok=True
                )
                summary_path(shuffle_dir, t).unlink(missing_ok=True)
            raise ShuffleError(
                f"{bad[0][1]}; the shuffle's work files were changed by another process or a "
                f"damaged disk: rerun the build to redo {len(bad)} scatter task(s)"
            )

    def gather(
        self, plan: PackPlan, out_dir: Path, writer: ShardWriter = write_shard
    ) -> list[ShardInfo]:
        """The gather tasks (one per shard), after `scatter`: the shards under
        `out_dir/prefix`, written by `writer`, the final writer (default: lemur's shards)."""
        settings, shuffle_dir = self.settings(plan), self.shuffle_dir
        shards = [(self._rel(rel), split, d) for rel, split, d in plan.buckets()]
        gather = PackGather(shuffle_dir, self.n_tasks, out_dir, shards, settings, writer)
        self.run_stage([gather], shuffle_dir / "gather", len(shards), "shuffle: write")
        infos = []
        for b in range(len(shards)):
            entry = json.loads((shuffle_dir / DONE / f"{b:05d}.json").read_text())
            if not entry.get("empty"):
                infos.append(ShardInfo(**entry))
        return infos

    def _rel(self, rel: str) -> str:
        """A path under the build's own directory, relative to the output."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def totals(self) -> ScatterTotals:
        """The finished scatter tasks' summaries, summed."""
        return read_summaries(self.shuffle_dir, self.n_tasks, len(self.recipe.sources))

    def write_duplicates(self, out_dir: Path) -> str | None:
        """Join the prep tasks' removed documents into `duplicates.jsonl` when the recipe
        asks for it; its path relative to `out_dir`, or None."""
        if self.duplicates is None:
            return None
        parts = [self.shuffle_dir / "hist" / f"{t:05d}.dups.jsonl" for t in range(self.n_tasks)]
        rel = self._rel("duplicates.jsonl")
        with atomic_open(out_dir / rel) as fh:
            fh.writelines(p.read_bytes() for p in parts)
        return rel

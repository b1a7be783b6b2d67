"""The dedup stage as executor tasks: bucket tasks (one per channel and key range), then one
cluster task. Both are datatrove pipeline steps, so local, Ray and Slurm run them like the
per-file stage, with completion markers (a rerun redoes only unfinished tasks).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from lemur.data import work as work_folders
from lemur.data.dedup.buckets import Priorities, bucket_task
from lemur.data.dedup.cluster import SUMMARY, DedupResult, cluster_task, load_result
from lemur.data.dedup.runs import channels
from lemur.data.recipe.recipe import DedupConfig
from lemur.data.run.task import StageRunner, TaskStep
from lemur.data.runs.format import CLUSTER

BUCKETS = "buckets"  # the bucket stage's folder under the dedup directory (CLUSTER: runs/)
# Peak bytes of the cluster task per document that has a duplicate (codes, keep-order
# fields, ranks, parents and the union-find's temporaries): 128 measured with
# tools/bench_scale.py at 16M documents (docs/benchmarks.md), rounded up.
CLUSTER_BYTES_PER_DOC = 140


def key_ranges(config: DedupConfig) -> int:
    """Key ranges each channel is split into: `bucket_tasks` spread over the bands."""
    return max(1, math.ceil((config.bucket_tasks or config.bands) / config.bands))


def bucket_tasks(config: DedupConfig) -> list[tuple[int, int]]:
    """(channel, key range) of every bucket task, in rank order."""
    parts = key_ranges(config)
    return [(c, p) for c in channels(config) for p in range(parts)]


def dedup_dir(tok_work: Path, config: DedupConfig) -> Path:
    """The dedup stage's folder for this config (beside the tokenize work it reads)."""
    settings = {"sim": config.min_similarity, "ranges": key_ranges(config), "v": 1}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return work_folders.dedup_folder(Path(tok_work), key)


class DedupBuckets(TaskStep):
    """Bucket task `rank`: merge one channel's sorted runs over one key range, verify pairs."""

    name = "🪣 dedup buckets"
    type = "🫂 - DEDUP"

    def __init__(self, config: DedupConfig, tok_dir: str, n_tasks: int, out_dir: str) -> None:
        super().__init__()
        self.config = config
        self.tok_dir = tok_dir
        self.n_tasks = n_tasks
        self.out_dir = out_dir

    def task(self, rank: int) -> None:
        """Bucket task `rank`: its channel and key range."""
        channel, part = bucket_tasks(self.config)[rank]
        tok_dir, ranges = Path(self.tok_dir), (part, key_ranges(self.config))
        bucket_task(tok_dir, self.n_tasks, channel, ranges, self.config, Path(self.out_dir), rank)


class DedupClusters(TaskStep):
    """The one cluster task: union-find over all verified pairs, removals per tokenize task."""

    name = "🧩 dedup clusters"
    type = "🫂 - DEDUP"

    def __init__(self, tok_dir: str, n_tasks: int, pair_dir: str, out_dir: str) -> None:
        super().__init__()
        self.tok_dir = tok_dir
        self.n_tasks = n_tasks
        self.pair_dir = pair_dir
        self.out_dir = out_dir

    def task(self, rank: int) -> None:
        """The cluster task (there is one)."""
        cluster_task(Path(self.pair_dir), Path(self.tok_dir), self.n_tasks, Path(self.out_dir))


def dedup_stages(
    config: DedupConfig, tok_dir: Path, n_tasks: int, ddir: Path
) -> Iterator[tuple[str, PipelineStep, int]]:
    """(stage folder, step, number of tasks) of each dedup stage, in the order to run them."""
    pairs = ddir / BUCKETS / "pairs"
    yield (
        BUCKETS,
        DedupBuckets(config, str(tok_dir), n_tasks, str(pairs)),
        len(bucket_tasks(config)),
    )
    yield CLUSTER, DedupClusters(str(tok_dir), n_tasks, str(pairs), str(ddir / CLUSTER / "out")), 1


def expected_memory(config: DedupConfig, ddir: Path | None) -> dict[str, int]:
    """Expected peak bytes above the interpreter of a bucket task and of the cluster task.

    A bucket task's merge rounds stay within `merge_buffer_mb`; a band's task verifies a
    round's pairs beside it (a second buffer). The cluster task holds its documents that
    have a duplicate, counted by the finished stage.
    """
    if ddir is None:
        return {}
    buffer = int(config.merge_buffer_mb * 2**20)
    summary = Path(ddir) / CLUSTER / "out" / SUMMARY
    clustered = json.loads(summary.read_text())["clustered_documents"] if summary.is_file() else 0
    return {
        "dedup buckets (per task)": buffer * (2 if config.near else 1),
        "dedup cluster": clustered * CLUSTER_BYTES_PER_DOC,
    }


def dedup_result(tok_dir: Path, n_tasks: int, ddir: Path) -> DedupResult:
    """The finished dedup stage's decisions over all records."""
    return load_result(ddir / CLUSTER / "out", Priorities(tok_dir, n_tasks).sizes())


def run_dedup(
    config: DedupConfig, tok_work: Path, n_tasks: int, run_stage: StageRunner
) -> Path | None:
    """Run the bucket tasks, then the cluster task, through `run_stage`; their folder.

    `run_stage(pipeline, folder, tasks, name)` runs a pipeline's tasks on the build's
    executor, logging under `folder/logs` (see build.py); None when dedup is off.
    """
    if not (config.exact or config.near):
        return None
    ddir = dedup_dir(tok_work, config)
    for name, step, tasks in dedup_stages(
        config, work_folders.tokens_dir(Path(tok_work)), n_tasks, ddir
    ):
        run_stage([step], ddir / name, tasks, f"dedup {name}")
    return ddir

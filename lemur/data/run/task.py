"""A stage's tasks: how a stage is run (`StageRunner`), how its progress is told (`Reporter`),
how its finished tasks are counted and how it fails (`StageError`), and a global stage's
task as a datatrove step (`TaskStep`: `run(rank)` does task `rank`, yields nothing).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

# Runs every task of a pipeline to the end: (pipeline, logging folder, tasks, stage name).
StageRunner = Callable[[list, Path, int, str], None]
# Told how far a stage is: (stage name, tasks done, tasks in all).
Reporter = Callable[[str, int, int], None]


class StageError(RuntimeError):
    """A stage that did not finish all its tasks (the message says which and why)."""


def tasks_done(work: Path) -> int:
    """Tasks of a stage (logging under `work/logs`) with a datatrove completion marker."""
    done_dir = work / "logs" / "completions"
    return len(list(done_dir.glob("*"))) if done_dir.is_dir() else 0


class TaskStep(PipelineStep):
    """A step that works on files, not documents: the executor runs task `rank` of a stage.

    Dedup buckets and clusters, pack histograms, scatter and gather are all such steps, so
    they run on any datatrove executor (local, Ray, Slurm) with its completion markers.
    """

    @abstractmethod
    def task(self, rank: int) -> None:
        """Do task `rank`."""

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        """Run task `rank` (a generator that yields nothing, like a writer)."""
        with self.track_time():
            self.task(rank)
        return
        yield


def run_here(pipeline: list, folder: Path, tasks: int, name: str) -> None:
    """Run every task of a one-step pipeline in this process, one after the other.

    The stage runner of tests and benchmarks (the build's runs on its executor); `folder`
    and `name` are the executor's logging folder and stage name, unused here.
    """
    for rank in range(tasks):
        for _ in pipeline[0].run(None, rank, tasks):
            pass

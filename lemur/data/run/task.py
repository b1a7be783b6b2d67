"""A global stage's task as a datatrove step: `run(rank)` does task `rank`, yields nothing."""

from __future__ import annotations

from abc import abstractmethod
from pathlib import Path

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep


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

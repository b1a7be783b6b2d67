"""Executors for the stages' tasks: local processes, a Ray cluster, or Slurm job arrays.

All three are datatrove executors running the same pipeline, with datatrove's per-task
completion markers (a rerun skips finished tasks). For local runs we replace
`LocalPipelineExecutor.run`: it keeps a `multiprocess.Manager` server process alive during
the run, and when the build is killed (SIGKILL, OOM killer) that server is orphaned and
lingers forever, holding the terminal's pipes. Our version runs tasks in this process
(`workers: 1`) or in a `ProcessPoolExecutor` of spawned workers that die with the build
(`lemur.process_guard`): a forkserver would outlive a killed build, and so would workers that
wait on their call queue. Ray and Slurm: `ray_cluster.py`, `slurm_cluster.py`.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor

from lemur.data.run.datatrove_private import LemurExecutor
from lemur.data.run.settings import ExecutorConfig
from lemur.process_guard import die_with_parent


class LemurLocalExecutor(LemurExecutor, LocalPipelineExecutor):
    """datatrove's local executor without a Manager process (see the module docstring)."""

    def run(self) -> None:
        """Run every incomplete task: in this process with one worker, else in a pool."""
        self.mark_launched()
        ranks = self.get_incomplete_ranks(
            range(self.local_rank_offset, self.local_rank_offset + self.local_tasks)
        )
        if not ranks:
            return
        self.save_executor_as_json()
        if self.workers == 1:
            pipeline = self.pipeline
            for rank in ranks:
                self.pipeline = copy.deepcopy(pipeline)
                self.run_task(rank)
            self.pipeline = pipeline
            return
        # Spawned (not forkserver) so that the workers' parent is this process; the pool is
        # started from this thread, which outlives it (PR_SET_PDEATHSIG follows the thread).
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=ctx,
            initializer=die_with_parent,
            initargs=(os.getpid(),),
        ) as pool:
            futures = [
                pool.submit(_run_rank, self, rank, i % self.workers) for i, rank in enumerate(ranks)
            ]
            for f in futures:
                f.result()  # re-raise a task's exception here


def _run_rank(executor: LemurLocalExecutor, rank: int, local_rank: int) -> None:
    # datatrove logs only local_rank 0 to the console; the others go to files only.
    executor.run_task(rank, local_rank)


def make_executor(
    config: ExecutorConfig, pipeline: list, tasks: int, logging_dir: Path, stage: str = "stage"
) -> Any:
    """The executor the recipe asks for: `tasks` tasks of `stage` logging to `logging_dir`."""
    if config.kind == "local":
        return LemurLocalExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=min(config.workers, tasks),
            logging_dir=str(logging_dir),
        )
    if config.kind == "ray":
        from lemur.data.run.ray_cluster import LemurRayExecutor, connect

        connect(config, Path(logging_dir))  # a no-op once connected
        return LemurRayExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=config.workers,
            logging_dir=str(logging_dir),
            stage=stage,
            cpus_per_task=config.cpus_per_task,
            mem_per_cpu_gb=config.mem_per_cpu_gb,
            retries=config.retries,
            time_limit=config.time,
        )
    from lemur.data.run.slurm_cluster import LemurSlurmExecutor

    return LemurSlurmExecutor(config, pipeline, tasks, str(logging_dir))

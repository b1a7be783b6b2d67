"""Executors for the per-file stage: local processes, a Ray cluster, or Slurm job arrays.

All three are datatrove executors running the same pipeline, with datatrove's per-task
completion markers (a rerun skips finished tasks). For local runs we replace
`LocalPipelineExecutor.run`: it keeps a `multiprocess.Manager` server process alive during
the run, and when the build is killed (SIGKILL, OOM killer) that server is orphaned and
lingers forever, holding the terminal's pipes. Our version runs tasks in this process
(`workers: 1`) or in a `ProcessPoolExecutor` of spawned workers that die with the build
(`lemur.process_guard`): a forkserver would outlive a killed build, and so would workers that
wait on their call queue.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor

from lemur.data.recipe import ExecutorConfig
from lemur.process_guard import die_with_parent


class LemurLocalExecutor(LocalPipelineExecutor):
    """datatrove's local executor without a Manager process (see the module docstring)."""

    def run(self) -> None:
        """Run every incomplete task: in this process with one worker, else in a pool."""
        self._launched = True
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
                self._run_for_rank(rank)
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
    executor._run_for_rank(rank, local_rank)


def make_executor(config: ExecutorConfig, pipeline: list, tasks: int, logging_dir: Path) -> Any:
    """The datatrove executor the recipe asks for, with `tasks` tasks logging to `logging_dir`."""
    if config.kind == "local":
        return LemurLocalExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=min(config.workers, tasks),
            logging_dir=str(logging_dir),
        )
    if config.kind == "ray":
        import ray
        from datatrove.executor import RayPipelineExecutor

        if not ray.is_initialized():
            # RAY_ADDRESS (or `address: auto`) joins a running cluster; else a local one starts.
            ray.init(
                address=os.environ.get("RAY_ADDRESS"),
                num_cpus=None if os.environ.get("RAY_ADDRESS") else config.workers,
                include_dashboard=False,
                log_to_driver=False,
            )
        return RayPipelineExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=config.workers,
            logging_dir=str(logging_dir),
            cpus_per_task=config.cpus_per_task,
            mem_per_cpu_gb=config.mem_per_cpu_gb,
        )
    from datatrove.executor import SlurmPipelineExecutor

    return SlurmPipelineExecutor(
        pipeline=pipeline,
        tasks=tasks,
        workers=config.workers,
        logging_dir=str(logging_dir),
        time=config.time,
        partition=config.partition,
        cpus_per_task=config.cpus_per_task,
        mem_per_cpu_gb=int(config.mem_per_cpu_gb),  # sbatch wants whole gigabytes ("3G")
        job_name=config.job_name,
        sbatch_args=dict(config.sbatch_args or {}),
        # datatrove `source`s this path; ours names the virtualenv directory
        venv_path=f"{venv}/bin/activate"
        if (venv := config.venv_path or os.environ.get("VIRTUAL_ENV"))
        else None,
        env_command=config.env_command,
        condaenv=None,
    )

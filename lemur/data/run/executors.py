"""Executors for the stages' tasks: local processes, a Ray cluster, or Slurm job arrays.

All three are datatrove executors running the same pipeline, with datatrove's per-task
completion markers (a rerun skips finished tasks). For local runs we replace
`LocalPipelineExecutor.run`: it keeps a `multiprocess.Manager` server process alive during
the run, and when the build is killed (SIGKILL, OOM killer) that server is orphaned and
lingers forever, holding the terminal's pipes. Our version runs tasks in this process
(`workers: 1`) or in a `WorkerPool` of spawned workers that die with the build
(`lemur.process_guard`): a forkserver would outlive a killed build, and so would workers that
wait on their call queue. Ray and Slurm: `ray_cluster.py`, `slurm_cluster.py`.

One pool serves every stage of a local build (`build_pool`, entered by `executor_session`
around the build): a worker spawned per stage imported lemur and datatrove again (~0.75 CPU
s each), a dozen times a build. The pool is started on the first stage that needs it, from
the thread that entered the session, which outlives it (`PR_SET_PDEATHSIG` follows the
thread that started a worker); a task that kills its worker fails its stage as before, and
the next stage gets a fresh pool. Without a session (an executor run on its own), each
`run()` starts and closes a pool of its own.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor

from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.datatrove_private import LemurExecutor
from lemur.process_guard import die_with_parent


class WorkerPool:
    """`workers` spawned processes that die with this one, started (and replaced) by `ready()`
    from a thread that must outlive them."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.current: ProcessPoolExecutor | None = None

    def ready(self) -> ProcessPoolExecutor:
        """The live pool: started on first use, replaced when a crashed worker broke it."""
        if self.current is not None:
            try:
                self.current.submit(os.getpid)  # submit() is how a pool says it is broken
                return self.current
            except BrokenProcessPool:
                self.current.shutdown(wait=False, cancel_futures=True)
        self.current = _spawn(self.workers)
        return self.current

    def close(self, wait: bool = True) -> None:
        """Let the workers exit (`wait`: once they have; else when their tasks end)."""
        if self.current is not None:
            self.current.shutdown(wait=wait, cancel_futures=True)
            self.current = None


def _spawn(workers: int) -> ProcessPoolExecutor:
    # Spawned (not forkserver) so that the workers' parent is this process. A pool spawns a
    # worker per submit() while none is idle, and later submits come from the stages'
    # threads, whose exit would kill what they spawned: so all of them now, from this
    # thread, each held in the initializer until the last is spawned.
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=ctx,
        initializer=_start_worker,
        initargs=(os.getpid(), started),
    )
    for _ in range(workers):
        pool.submit(os.getpid)
    started.set()
    return pool


def _start_worker(parent: int, started: Any) -> None:
    die_with_parent(parent)
    # Ctrl-C reaches the workers too, idle between stages now: the build says it in one
    # line, so a worker ends at once without a traceback (its stage fails, if one is running).
    signal.signal(signal.SIGINT, _end_quietly)
    started.wait()


def _end_quietly(signum: int, frame: Any) -> None:
    os._exit(128 + signum)


_BUILD_POOL: ContextVar[WorkerPool | None] = ContextVar("lemur_build_pool", default=None)


@contextmanager
def build_pool(config: ExecutorConfig) -> Iterator[None]:
    """One worker pool for every local stage run inside (none for Ray, Slurm, `workers: 1`)."""
    if config.kind != "local" or config.workers < 2:
        yield
        return
    pool = WorkerPool(config.workers)
    token = _BUILD_POOL.set(pool)
    try:
        yield
    except BaseException:
        pool.close(wait=False)  # running tasks end as they did with a pool per stage
        raise
    finally:
        _BUILD_POOL.reset(token)
    pool.close()


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
        shared = _BUILD_POOL.get()
        if shared is not None and shared.current is not None:  # readied by make_executor
            self.run_in(shared.current, ranks)
            return
        own = WorkerPool(self.workers)  # started from this thread, which outlives it
        try:
            self.run_in(own.ready(), ranks)
        finally:
            own.close()

    def run_in(self, pool: ProcessPoolExecutor, ranks: list[int]) -> None:
        """Run tasks `ranks` in `pool`'s workers; a task's exception is raised here."""
        environ = dict(os.environ)
        futures = [
            pool.submit(_run_rank, self, rank, i % self.workers, environ)
            for i, rank in enumerate(ranks)
        ]
        for f in futures:
            f.result()


def _run_rank(
    executor: LemurLocalExecutor, rank: int, local_rank: int, environ: dict[str, str]
) -> None:
    # A worker serves several stages: each task sees the build's environment as it is when
    # its stage starts (a recipe's LEMUR_SECRET_ variables), as a worker spawned then would.
    for key in os.environ.keys() - environ.keys():
        del os.environ[key]
    os.environ.update(environ)
    try:
        # datatrove logs only local_rank 0 to the console; the others go to files only.
        executor.run_task(rank, local_rank)
    finally:  # idle again: Ctrl-C ends it quietly, whatever a module the task imported set
        signal.signal(signal.SIGINT, _end_quietly)


def make_executor(
    config: ExecutorConfig, pipeline: list, tasks: int, logging_dir: Path, stage: str = "stage"
) -> Any:
    """The executor the recipe asks for: `tasks` tasks of `stage` logging to `logging_dir`."""
    if config.kind == "local":
        workers = min(config.workers, tasks)
        shared = _BUILD_POOL.get()
        if shared is not None and workers > 1:
            shared.ready()  # from the session's thread, which outlives the workers
        return LemurLocalExecutor(
            pipeline=pipeline,
            tasks=tasks,
            workers=workers,
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

"""Running one stage's tasks on the recipe's executor: progress, waiting, clear failures.

A stage either finishes every task or raises StageError (run/task.py) with one line naming
the stage and what failed; what the build submitted to Slurm and no longer needs is
cancelled on the way out (a failure or Ctrl-C). `executor_session` holds what lives as long
as a build: its local worker pool or its Ray connection.
"""

from __future__ import annotations

import contextvars
import errno
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.executors import build_pool, make_executor
from lemur.data.run.task import Reporter, StageError, tasks_done

_FULL = (errno.ENOSPC, errno.EDQUOT)


def run_executor(
    executor: Any,
    work: Path,
    n_tasks: int,
    report: Reporter,
    stage: str = "tokenize",
    settle: float = 0.0,
) -> None:
    """Run a datatrove executor in a thread while reporting finished tasks.

    On Ctrl-C, wait up to `settle` seconds for the thread (a Slurm submission in flight),
    so that what it submits is known before the caller cancels it.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            executor.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(e)

    # In this thread's context: the build's worker pool (executors.build_pool) is in it.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,), daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            report(stage, tasks_done(work), n_tasks)
            thread.join(0.5)
    except BaseException:
        thread.join(settle)
        raise
    report(stage, tasks_done(work), n_tasks)
    if failure and isinstance(failure[0], OSError) and failure[0].errno in _FULL:
        raise failure[0]  # build() turns it into its one-line "no space left" error
    if failure:
        raise StageError(f"{stage} stage failed: {failure[0]} (task logs: {work / 'logs'})")


def run_tasks(
    config: ExecutorConfig, pipeline: list, work: Path, tasks: int, stage: str, report: Reporter
) -> None:
    """Run `tasks` tasks of a pipeline on the executor (logs under `work/logs`) to the end."""
    executor = make_executor(config, pipeline, tasks, work / "logs", stage)
    slurm = config.kind == "slurm"
    try:
        run_executor(executor, work, tasks, report, stage, settle=60.0 if slurm else 0.0)
        if slurm:
            executor.wait(work, tasks, report, stage)
    except BaseException:
        if slurm:  # a failed stage or Ctrl-C: nothing it submitted is needed any more
            executor.cancel()
        raise
    left = tasks - tasks_done(work)
    if left > 0:
        raise StageError(
            f"{stage} stage: {left} of {tasks} tasks did not finish (task logs: {work / 'logs'})"
        )


@contextmanager
def executor_session(config: ExecutorConfig) -> Iterator[None]:
    """What lives as long as a build: the local executor's worker pool, or the Ray
    connection its first Ray stage makes."""
    if config.kind != "ray":
        with build_pool(config):
            yield
        return
    from lemur.data.run.ray_cluster import ray_session

    with ray_session():
        yield

"""Quiet datatrove's per-task console logging so that our progress display stays readable.

datatrove's executors log every task at INFO level to stderr and re-add a verbose stderr
handler after each task; we keep its per-task log files (`<work>/logs/logs/`) complete
and only let warnings and errors through to the console. Nothing happens on import:

- `quiet_datatrove()` (from `lemur.process_setup`) sets the console of the process running
  `lemur-data`, installed by its `main()`;
- `task_logs()`, entered by the base of our executors (`datatrove_private.LemurExecutor`)
  around each task, gives the task our task logger in whatever process runs it (the build
  itself, a spawned local worker, a Ray worker, a Slurm array task), for its duration.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

from loguru import logger

from lemur.process_setup import quiet_console, quiet_datatrove

__all__ = ["quiet_datatrove", "task_logs", "where"]


def where() -> str:
    """Where this process runs, for a task log: host, Ray node or Slurm array task, pid."""
    place = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        place += f", ray node {ray.get_runtime_context().get_node_id()}"
    elif "SLURM_ARRAY_JOB_ID" in os.environ:
        place += (
            f", slurm job {os.environ['SLURM_ARRAY_JOB_ID']}_"
            f"{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
        )
    return f"{place}, pid {os.getpid()}"


def _add_task_logger(logging_dir: Any, rank: int, local_rank: int = 0, node_rank: int = -1):
    """datatrove's `add_task_logger`, ours: the task's file at INFO, the console warnings."""
    del local_rank, node_rank  # every task's console shows warnings, with no node prefix
    quiet_console()
    logfile = logging_dir.open(f"logs/task_{rank:05d}.log", "w")
    logger.add(logfile, level="INFO", colorize=False)
    logger.info(f"Launching pipeline for {rank=} on {where()}")
    return logfile


def _close_task_logger(logfile: Any) -> None:
    logger.complete()
    quiet_console()
    logfile.close()


@contextlib.contextmanager
def task_logs() -> Iterator[None]:
    """For one task: datatrove's executor logs through our task logger (see the docstring).

    Tasks of one process run one after the other (each executor runs one task at a time in
    a process), so the executor module's two functions are swapped and put back in turn.
    """
    import datatrove.executor.base as executor_base

    saved = executor_base.add_task_logger, executor_base.close_task_logger
    quiet_datatrove()
    executor_base.add_task_logger = _add_task_logger
    executor_base.close_task_logger = _close_task_logger
    try:
        yield
    finally:
        executor_base.add_task_logger, executor_base.close_task_logger = saved

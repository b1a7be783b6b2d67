"""Quiet datatrove's per-task console logging so that our progress display stays readable.

datatrove's executors log every task at INFO level to stderr and re-add a verbose stderr
handler after each task; we keep its per-task log files (`<work>/logs/logs/`) complete
and only let warnings and errors through to the console. The patch is applied on import,
so worker processes that unpickle our pipeline steps get it too.
"""

from __future__ import annotations

import os
import socket
import sys

import datatrove.executor.base as _executor_base
from loguru import logger

CONSOLE_FORMAT = "{level}: {message}"


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


def _console_only() -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING", format=CONSOLE_FORMAT, colorize=False)


def _add_task_logger(logging_dir, rank: int, local_rank: int = 0, node_rank: int = -1):
    _console_only()
    logfile = logging_dir.open(f"logs/task_{rank:05d}.log", "w")
    logger.add(logfile, level="INFO", colorize=False)
    logger.info(f"Launching pipeline for {rank=} on {where()}")
    return logfile


def _close_task_logger(logfile) -> None:
    logger.complete()
    _console_only()
    logfile.close()


def quiet_datatrove() -> None:
    """Route datatrove's task logging to files, keeping only warnings on the console."""
    _executor_base.add_task_logger = _add_task_logger
    _executor_base.close_task_logger = _close_task_logger
    _console_only()


quiet_datatrove()

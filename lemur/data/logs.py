"""Quiet datatrove's per-task console logging so that our progress display stays readable.

datatrove's executors log every task at INFO level to stderr; we keep its per-task log
files (`<work>/logs/`) complete and only let warnings and errors through to the console.
The patch is applied on import, so worker processes that unpickle our steps get it too.
"""

from __future__ import annotations

import sys

import datatrove.executor.base as _executor_base
from datatrove.utils import logging as _dt_logging
from loguru import logger

_original_add_task_logger = _dt_logging.add_task_logger


def _quiet_add_task_logger(logging_dir, rank: int, local_rank: int = 0, node_rank: int = -1):
    logfile = _original_add_task_logger(logging_dir, rank, local_rank, node_rank)
    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{level}: {message}", colorize=False)
    logger.add(logfile, level="INFO", colorize=False)
    return logfile


def quiet_datatrove() -> None:
    """Route datatrove's task logging to files, keeping only warnings on the console."""
    _executor_base.add_task_logger = _quiet_add_task_logger
    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{level}: {message}", colorize=False)


quiet_datatrove()

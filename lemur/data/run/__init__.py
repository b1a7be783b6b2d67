"""Running the build's stages: datatrove executors, the task step of global stages, quiet
logs, the output lock."""

from lemur.data.run.executors import LemurLocalExecutor, make_executor
from lemur.data.run.lock import DirectoryLock, LockedError
from lemur.data.run.logs import quiet_datatrove
from lemur.data.run.task import TaskStep, run_here

__all__ = [
    "DirectoryLock",
    "LemurLocalExecutor",
    "LockedError",
    "TaskStep",
    "make_executor",
    "quiet_datatrove",
    "run_here",
]

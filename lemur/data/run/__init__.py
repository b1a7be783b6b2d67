"""Running the build's per-file stages: datatrove executors, quiet logs, the output lock."""

from lemur.data.run.executors import LemurLocalExecutor, make_executor
from lemur.data.run.lock import DirectoryLock, LockedError
from lemur.data.run.logs import quiet_datatrove

__all__ = [
    "DirectoryLock",
    "LemurLocalExecutor",
    "LockedError",
    "make_executor",
    "quiet_datatrove",
]

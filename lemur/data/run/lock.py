"""An exclusive lock on an output directory, so two builds never write into one at once.

The lock is `<output>/.lock`, held with `flock` for the life of the build and naming its
holder (pid, host, start time) for the error message of a second build. `flock` is released
by the kernel when its holder dies, so the lock file a killed build (even SIGKILL) leaves
behind is stale and taken over (`taken_over()` names the build that left it, for the log):
no pid guessing, which pid reuse would fool. On a network filesystem `flock` must be shared
between hosts (NFSv4 and Lustre do so) for two builds on different nodes to exclude each
other.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK_NAME = ".lock"


class LockedError(RuntimeError):
    """The output directory is locked by another live build (the message names it)."""


def _holder(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {started})"


class DirectoryLock:
    """`with DirectoryLock(out):` holds `<out>/.lock` or raises LockedError naming the holder."""

    def __init__(self, directory: str | os.PathLike, what: str = "build") -> None:
        self.path = Path(directory) / LOCK_NAME
        self.what = what
        self._fd: int | None = None
        self._stale: dict[str, Any] = {}

    def acquire(self) -> None:
        """Take the lock, breaking a stale one of a dead local process; else raise."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise LockedError(
                    f"{self.path.parent}: another {self.what} is writing here "
                    f"({_describe(_holder(self.path))}); wait for it or stop it"
                ) from None
            # The file may have been unlinked by its previous holder between our open and
            # our flock: then we locked an orphan inode and must retry on the new file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # We hold the lock, so whoever this file names is gone (a killed build): say so.
        self._stale = _holder(self.path)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd

    def taken_over(self) -> str | None:
        """`<dir>/.lock: taking over from a build that is gone: pid N on HOST (since T)`
        when acquiring found the lock file of a dead holder, else None."""
        if not self._stale:
            return None
        return f"{self.path}: taking over from a {self.what} that is gone: {_describe(self._stale)}"

    def release(self) -> None:
        """Remove the lock file and drop the lock."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

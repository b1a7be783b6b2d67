"""One way to write a file that readers see whole or not at all: `atomic_open`.

The file is written under a temporary name in the same directory (dot-prefixed, so no
reader that lists the directory takes it for output; unique per process), and renamed
into place only when the block ends without an exception. Any exception removes the
temporary file and leaves an existing destination as it was; a killed process leaves at
most a dot-temp that nothing reads (a rerun writes its own and replaces the destination).

A killed writer's temporary stays until `remove_stale_temporaries` (a build's resume)
deletes it: the name says which process on which host wrote it (`.NAME.tmp-PID@HOST`), so
the temporaries of writers that are gone can be told from those of live ones. Scratch that
is never renamed into place (`scratch_path`) takes the same name, for the same reason:
every temporary lemur makes goes through this module (tests/test_atomic_files.py lists
the few `tempfile` uses left, each with its reason).

Durability (`durable`, on by default): before the rename the file's data is fsynced, and
after it the directory, so that after a power loss the name never points at a short or
empty file. Every caller in lemur writes files that a later stage or a rerun trusts by
their name alone (shards, manifests, and the work files that completion markers vouch
for), so durable is the default; `durable=False` is for scratch that nothing trusts across
a machine crash. This module imports nothing of lemur: every layer may use it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = [
    "atomic_open",
    "atomic_path",
    "atomic_write_bytes",
    "atomic_write_text",
    "remove_stale_temporaries",
    "scratch_path",
    "temp_name",
]

# `.NAME.tmp-PID@HOST`; names without `@HOST` were written before the host was recorded.
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)(?:@(?P<host>.+))?")
# A temporary of another host is stale once untouched this long: its pid cannot be asked
# about from here, and no live writer leaves its file unwritten for a day.
REMOTE_STALE_S = 24 * 3600


def temp_name(path: str | os.PathLike) -> Path:
    """The temporary name a file or directory `path` is written under by this process
    (`atomic_open`'s; anything renamed into place whole takes it too)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}@{socket.gethostname()}")


def remove_stale_temporaries(root: str | os.PathLike) -> list[Path]:
    """Delete the temporaries (`temp_name`) under `root` whose writers are gone; the paths.

    Only for a caller that holds `root` exclusively (a build holds its output's lock), so
    that the writers left are leftovers of a killed run. What is deleted, decided so that
    a live writer's file is never taken (a leak until the next resume is the lesser harm):
    - this host's temporary whose pid is not alive;
    - this host's temporary whose pid is alive but started after the file was last
      written (the pid was reused: that process is not its writer);
    - another host's, once untouched for REMOTE_STALE_S (a killed build's Slurm task may
      still be writing on its node, and its pid means nothing here).
    A live pid that is ours, or another process's that started before the file was
    written, keeps it (names without a host are taken as this host's).
    """
    removed = []
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(top) / name
            if (match := TEMP_NAME.fullmatch(name)) is None or not _stale(path, match):
                continue
            if name in dirs:
                dirs.remove(name)  # not descended into: it goes whole
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _stale(path: Path, match: re.Match[str]) -> bool:
    """Whether the temporary `path` (its name parsed by TEMP_NAME) has no live writer."""
    try:
        written = path.lstat().st_mtime
    except FileNotFoundError:
        return False  # its writer renamed it into place just now
    host, pid = match["host"], int(match["pid"])
    if host is not None and host != socket.gethostname():
        return time.time() - written > REMOTE_STALE_S
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    started = _process_start(pid)
    return started is not None and started > written + 1.0  # 1 s: clock tick rounding


def _process_start(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch; None where /proc cannot say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    # Field 22 (starttime, clock ticks after boot), counted after the ")" ending the name.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # e.g. Windows: a directory cannot be opened for fsync
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(
    path: str | os.PathLike,
    mode: str = "wb",
    *,
    durable: bool = True,
    encoding: str | None = None,
) -> Iterator[IO[Any]]:
    """Open `path` for writing under a temporary name; rename it into place on a clean exit.

    `mode` is "wb" or "w" (text, with `encoding`); the parent directory is created. On any
    exception inside the block the temporary file is removed and the exception re-raised.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open: mode {mode!r} is not 'wb' or 'w'")
    with atomic_path(path, durable=durable) as tmp, open(tmp, mode, encoding=encoding) as fh:
        yield fh


@contextmanager
def atomic_path(path: str | os.PathLike, *, durable: bool = True) -> Iterator[Path]:
    """The temporary name to write `path` under (`atomic_open` opens it; a library that
    writes by file name, such as safetensors' `save_file`, is given it): renamed into place
    on a clean exit, removed on any exception. The parent directory is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        if durable:  # the data on disk before the name points at it
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk or a failed task leaves nothing behind
        raise
    if durable:
        _fsync_dir(path.parent)


@contextmanager
def scratch_path(path: str | os.PathLike) -> Iterator[Path]:
    """A name for scratch (a file or a directory) that lives only inside the block:
    `temp_name(path)`, removed when the block ends however it ends, and, if the process is
    killed first, by the next `remove_stale_temporaries` over its directory. The parent
    directory is created."""
    tmp = temp_name(path)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield tmp
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def atomic_write_bytes(
    path: str | os.PathLike, data: bytes | memoryview, *, durable: bool = True
) -> None:
    """Write `data` to `path` atomically (see `atomic_open`)."""
    with atomic_open(path, durable=durable) as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically (see `atomic_open`)."""
    with atomic_open(path, "w", encoding=encoding) as fh:
        fh.write(text)

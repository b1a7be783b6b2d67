"""One way to write a file that readers see whole or not at all: `atomic_open`.

The file is written under a temporary name in the same directory (dot-prefixed, so no
reader that lists the directory takes it for output; unique per process), and renamed
into place only when the block ends without an exception. Any exception removes the
temporary file and leaves an existing destination as it was; a killed process leaves at
most a dot-temp that nothing reads (a rerun writes its own and replaces the destination).

Durability (`durable`, on by default): before the rename the file's data is fsynced, and
after it the directory, so that after a power loss the name never points at a short or
empty file. Every caller in lemur writes files that a later stage or a rerun trusts by
their name alone (shards, manifests, and the work files that completion markers vouch
for), so durable is the default; `durable=False` is for scratch that nothing trusts across
a machine crash. This module imports nothing of lemur: every layer may use it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_path", "atomic_write_bytes", "atomic_write_text", "temp_name"]


def temp_name(path: str | os.PathLike) -> Path:
    """The temporary name `atomic_open` writes `path` under in this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


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

"""Where lemur-convert writes: a new directory, built beside DST and renamed into place.

An export never writes into DST itself. Files of an earlier export left in DST would mix two
models (transformers prefers `model.safetensors.index.json` over a stale
`model.safetensors`, or the reverse; old tokenizer files stay when the new export has
none), and a killed export would leave a half-written folder that looks like a model. So:

- DST that is not a directory is refused; a non-empty DST is refused unless `force`;
- everything is written into `.<name>.lemur-partial` beside DST (same filesystem, so the
  final rename is atomic); a failure removes it, a kill leaves it for the next run to remove;
- only when the new directory is complete, the old DST (if any) is renamed to
  `.<name>.lemur-old`, the new one renamed to DST, and the old one deleted.

A run killed between those two renames leaves DST missing and both hidden folders: the next
run puts the old DST back first, so a killed export is as if it had never started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

PARTIAL, OLD = ".lemur-partial", ".lemur-old"


class DestinationError(ValueError):
    """A destination lemur-convert will not write to (one line, naming it)."""


def _remove(path: Path) -> None:
    """Delete a file, a symlink (not its target) or a directory tree, if present."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def recover(dst: Path) -> None:
    """Undo what a killed export left beside `dst` (its partial folder, a swap cut short)."""
    partial, old = _hidden(dst, PARTIAL), _hidden(dst, OLD)
    _remove(partial)
    if old.exists() or old.is_symlink():
        if dst.exists() or dst.is_symlink():
            _remove(old)  # the swap finished; only the clean-up was cut short
        else:
            os.replace(old, dst)  # killed between the renames: the old export comes back


def _hidden(dst: Path, suffix: str) -> Path:
    return dst.with_name(f".{dst.name}{suffix}")


def check_destination(dst: Path, force: bool, sources: tuple[Path, ...] = ()) -> None:
    """Refuse a destination that is a file, is or holds a source (replacing it would delete
    that source), or is not empty (unless `force`); DestinationError names it."""
    if not dst.name:
        raise DestinationError(f"{dst}: not a directory an export can replace")
    real = dst.resolve()  # symlinks followed on both sides: the same folder by any name
    for src in sources:
        source = Path(src).expanduser().resolve()
        if real == source or real in source.parents:
            raise DestinationError(f"{dst}: the destination is or holds the source {src}")
    for p in dst.parents:
        if p.exists() and not p.is_dir():
            raise DestinationError(f"{dst}: {p} exists and is not a directory")
    if not (dst.exists() or dst.is_symlink()):
        return
    if not dst.is_dir():
        raise DestinationError(f"{dst}: exists and is not a directory")
    entries = sorted(p.name for p in dst.iterdir())
    if entries and not force:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise DestinationError(
            f"{dst}: not empty ({len(entries)} entries: {shown}); give --force to replace it "
            "whole, or another directory"
        )


def _remove_when_quiet(path: Path, seconds: float = 5.0) -> None:
    """Remove `path`, again until it stays gone: a writer that failed (orbax's tensorstore on
    a full disk) may still have threads finishing their files in it after the error."""
    deadline = time.monotonic() + seconds
    while True:
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(0.05)  # still gone a moment later: no writer is left in it
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return


@contextlib.contextmanager
def replacing(
    dst: str | os.PathLike[str], force: bool = False, sources: tuple[Path, ...] = ()
) -> Iterator[Path]:
    """Yield an empty directory to write the export into; on success it becomes `dst`.

    Refuses (DestinationError, before anything is written) what `check_destination`
    refuses. On an exception the partial directory is removed and `dst` is untouched.
    """
    target = Path(os.path.abspath(Path(dst).expanduser()))
    if target.parent.is_dir():
        recover(target)  # first: a swap cut short puts the old DST back, to be checked
    check_destination(target, force, sources)
    partial = _hidden(target, PARTIAL)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.mkdir()
    try:
        yield partial
    except BaseException:
        _remove_when_quiet(partial)
        raise
    if target.exists() or target.is_symlink():
        old = _hidden(target, OLD)
        os.replace(target, old)
        os.replace(partial, target)
        _remove(old)
    else:
        os.replace(partial, target)

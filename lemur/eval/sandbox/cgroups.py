"""Per-run cgroups for the sandbox: a cap on processes (pids) and on memory, v1 or v2.

A run's first process joins every cgroup made here before it does anything else, so the
program and all its descendants stay in them (the jail itself stays out, to kill them).
`memory` caps the run's processes together (their anonymous memory and the pages of their
private tmpfs), not each one: the per-process RLIMIT_AS alone let 16 processes hold 16
times the limit. Swap is capped at zero where the kernel accounts it, so the cap cannot be
dodged by swapping.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
# controller -> (file that shows a child cgroup has it, v1 limit files, v2 limit files)
FILES = {
    "pids": ("pids.max", ("pids.max",), ("pids.max",)),
    "memory": (
        "memory.limit_in_bytes",
        ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"),
        ("memory.max", "memory.swap.max"),
    ),
}


def _own_cgroups(controller: str) -> list[tuple[Path, bool]]:
    """Where this process sits for `controller`: (directory, is v2), v1 hierarchy first."""
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(","):
            out.append((ROOT / controllers / rel.lstrip("/"), False))
        elif controllers == "" and (ROOT / "cgroup.controllers").exists():
            out.append((ROOT / rel.lstrip("/"), True))
    return out


@functools.cache
def parent(controller: str) -> tuple[Path, bool] | None:
    """Where child cgroups with `controller` can be made here (directory, is v2), or None."""
    for where, v2 in _own_cgroups(controller):
        probe_dir = where / f"lemur-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe_dir.mkdir()
        except OSError:
            continue
        marker = FILES[controller][2 if v2 else 0]
        usable = (probe_dir / (marker[0] if v2 else marker)).exists()
        with contextlib.suppress(OSError):
            probe_dir.rmdir()
        if usable:
            return where, v2
    return None


def procs(path: Path) -> list[int]:
    """Processes in a cgroup."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _limit(path: Path, controller: str, value: int, *, v2: bool) -> None:
    """Write the cap: pids.max, or the memory limit with swap held to nothing extra."""
    files = FILES[controller][2 if v2 else 1]
    if controller == "pids":
        (path / files[0]).write_text(str(value))
        return
    (path / files[0]).write_text(str(value))
    if (path / files[1]).exists():
        # v1: memory+swap equal to memory (no swap on top); v2: swap.max is swap alone.
        (path / files[1]).write_text("0" if v2 else str(value))


def remove(path: Path, sweep: Callable[[Callable[[], list[int]]], None]) -> None:
    """Kill every process in a cgroup (cgroup.kill where there is one: v2, Linux >= 5.14),
    then remove it (retried for 2 s while its last processes are reaped)."""
    if (path / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
    sweep(lambda: procs(path))
    for _ in range(400):
        try:
            path.rmdir()
            return
        except OSError as e:
            if e.errno != errno.EBUSY:
                return  # gone already, or not ours to remove
            time.sleep(0.005)


@contextlib.contextmanager
def run_cgroups(
    caps: dict[str, int], sweep: Callable[[Callable[[], list[int]]], None], prefix: str
) -> Iterator[list[Path]]:
    """Fresh cgroups named `prefix` + a random part, one per available controller of `caps`
    ({"pids": n, "memory": bytes}).

    Yields their directories (the run's first process joins each); afterwards they are
    `remove`d (`sweep` kills what is left in them).
    """
    made: list[Path] = []
    try:
        for controller, value in caps.items():
            found = parent(controller)
            if found is None:
                continue
            path = found[0] / f"{prefix}{uuid.uuid4().hex}"
            path.mkdir()
            made.append(path)
            _limit(path, controller, value, v2=found[1])
        yield made
    finally:
        for path in made:
            remove(path, sweep)

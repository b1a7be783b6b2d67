"""Finding and killing a sandbox run's processes: by uid (a scan of /proc) or by any list."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# Unprivileged uids for runs: far above any real account (and nobody's 65534).
UID_RANGE = (1 << 30, (1 << 31) - 2)


def proc_ids(uid: int | None = None) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid` (all live ones when None)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue  # a zombie is dead already; its parent (or init) reaps it
        if uid is None or int(fields.get("Uid", "-1").split()[0]) == uid:
            found.append(int(entry.name))
    return found


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, proc(5)), or None: no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[19])


def owner_tag() -> str:
    """This process, as the owner of what its runs leave on the host: pid.start.namespace.

    The start time tells a reused pid apart; the pid namespace, an owner in another one
    (another container sharing /tmp or the cgroups), whose liveness cannot be seen here.
    """
    pid = os.getpid()
    return f"{pid}.{start_time(pid)}.{os.stat('/proc/self/ns/pid').st_ino}"


def owner_alive(tag: str) -> bool | None:
    """Whether the owner `tag` names still runs; None when that cannot be told here (not a
    tag, or an owner in another pid namespace)."""
    parts = tag.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    if int(parts[2]) != os.stat("/proc/self/ns/pid").st_ino:
        return None
    return start_time(int(parts[0])) == int(parts[1])


def free_uid() -> int:
    """A random uid in UID_RANGE that no process uses."""
    rng = random.SystemRandom()
    while True:
        uid = rng.randint(*UID_RANGE)
        if not proc_ids(uid):
            return uid


def sweep(find: Callable[[], list[int]], rounds: int = 500) -> None:
    """SIGKILL what `find()` lists until it lists nothing (a fork loop may add more meanwhile)."""
    for _ in range(rounds):
        pids = find()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the run's process group and, with an own uid, every process of that uid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if uid is not None:
        sweep(lambda: proc_ids(uid))
    proc.wait()

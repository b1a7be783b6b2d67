"""Run untrusted Python (generated code and its tests) in a contained child process.

Every run gets a throw-away working directory, a wall-clock timeout and resource limits
(address space, CPU seconds, file size, open files, processes), and is entered through
lemur/eval/jail.py, which adds what the machine allows (probed once, `probe`):

- network: a new network namespace (what `unshare -n` does): no interface but a
  loopback that is down, so no connection anywhere, the host's localhost included;
- filesystem: a new mount namespace where every mount is read-only and /tmp, /var/tmp
  and /dev/shm are fresh tmpfs that vanish with the run; only the working directory is
  writable (and it is deleted afterwards);
- processes: as root, each run runs under its own unused uid, so RLIMIT_NPROC counts
  that run's processes alone (for root it counts nothing: root is exempt), and cleanup
  can find every process the run made, including ones that left the process group;
  a pids cgroup (when one can be made) caps the count again, independent of uids.

After the program exits or times out, its process group, every process of its uid and
every process of its cgroup are killed with SIGKILL, and the working directory is
removed. Output goes to files, not pipes, so a leftover child holding a pipe open
cannot stall the harness.

Without root some of this is unavailable: unprivileged user namespaces may still give
the network and mount namespaces; RLIMIT_NPROC then counts all of the user's processes
(the limit is set to the user's current count plus the cap). `Isolation.describe` says
what is missing; callers refuse to run without network isolation unless told otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

JAIL = Path(__file__).with_name("jail.py")
PIDS_V1 = Path("/sys/fs/cgroup/pids")
# Unprivileged uids for runs: far above any real account (and nobody's 65534).
UID_RANGE = (1 << 30, (1 << 31) - 2)
TAIL = 4000  # characters of stdout/stderr kept per run


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 << 30
    file_bytes: int = 16 << 20
    processes: int = 16
    open_files: int = 256
    scratch_bytes: int = 64 << 20  # each private tmpfs

    def rlimits(self) -> dict[str, int]:
        """The jail's `limits` entry (processes added separately: it depends on the uid)."""
        return {
            "as": self.memory_bytes,
            "cpu": self.cpu_s,
            "fsize": self.file_bytes,
            "nofile": self.open_files,
            "core": 0,
        }


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What containment this machine gives a run."""

    network: bool
    filesystem: bool
    own_uid: bool
    pids_cgroup: bool

    def describe(self) -> list[str]:
        """One line per mechanism: in force, or missing and why it matters."""
        return [
            "network: "
            + (
                "new network namespace (no network)"
                if self.network
                else "NOT isolated (network namespaces unavailable)"
            ),
            "filesystem: "
            + (
                "read-only mounts, private /tmp, writable workdir only"
                if self.filesystem
                else "NOT isolated (mount namespaces unavailable): the program can "
                "write wherever this user can"
            ),
            "processes: "
            + (
                "own uid per run (RLIMIT_NPROC applies)"
                if self.own_uid
                else "RLIMIT_NPROC on this user's count"
            )
            + (" + pids cgroup" if self.pids_cgroup else ""),
        ]


@dataclasses.dataclass
class Result:
    """Outcome of one run."""

    status: str  # "ok" (exit 0), "failed" (non-zero exit or signal), "timeout", "error"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    uid: int | None = None

    @property
    def ok(self) -> bool:
        """True when the program exited 0 in time."""
        return self.status == "ok"


class SandboxUnavailable(RuntimeError):
    """The machine cannot give the containment asked for."""


def _proc_ids(uid: int | None = None) -> list[int]:
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


def _free_uid() -> int:
    """A random uid in UID_RANGE that no process uses."""
    rng = random.SystemRandom()
    while True:
        uid = rng.randint(*UID_RANGE)
        if not _proc_ids(uid):
            return uid


def _own_cgroups() -> list[Path]:
    """Candidate parents for a pids cgroup: this process's own pids (v1) or unified (v2) group."""
    out = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        if controllers == "pids":
            out.append(PIDS_V1 / rel.lstrip("/"))
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            out.append(Path("/sys/fs/cgroup") / rel.lstrip("/"))
    return out


@functools.cache
def _cgroup_parent() -> Path | None:
    """Where pids cgroups can be made here, or None."""
    for parent in _own_cgroups():
        probe_dir = parent / f"lemur-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe_dir.mkdir()
        except OSError:
            continue
        usable = (probe_dir / "pids.max").exists()
        with contextlib.suppress(OSError):
            probe_dir.rmdir()
        if usable:
            return parent
    return None


@contextlib.contextmanager
def _pids_cgroup(limit: int) -> Iterator[Path | None]:
    """A fresh pids cgroup capped at `limit` processes (None when unavailable); removed after."""
    parent = _cgroup_parent()
    if parent is None:
        yield None
        return
    path = parent / f"lemur-sandbox-{uuid.uuid4().hex}"
    path.mkdir()
    try:
        (path / "pids.max").write_text(str(limit))
        yield path
    finally:
        _sweep(lambda: _cgroup_pids(path))
        with contextlib.suppress(OSError):
            path.rmdir()


def _cgroup_pids(path: Path) -> list[int]:
    """Processes in a cgroup."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _sweep(find: Callable[[], list[int]], rounds: int = 500) -> None:
    """SIGKILL what `find()` lists until it lists nothing (a fork loop may add more meanwhile)."""
    for _ in range(rounds):
        pids = find()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


def _kill_everything(proc: subprocess.Popen, uid: int | None) -> None:
    """Kill the run's process group and, with an own uid, every process of that uid."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if uid is not None:
        _sweep(lambda: _proc_ids(uid))
    proc.wait()


def _spec(
    work: Path,
    argv: list[str],
    limits: Limits,
    uid: int | None,
    cgroup: Path | None,
    isolation: Isolation,
) -> dict:
    """The jail's instructions for one run."""
    rlimits = limits.rlimits()
    # With an own uid the count starts at 0; otherwise every process of the user counts.
    base = 0 if uid is not None else len(_proc_ids(os.getuid()))
    rlimits["nproc"] = base + limits.processes
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(work),
        "TMPDIR": str(work),
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return {
        "workdir": str(work),
        "argv": argv,
        "env": env,
        "uid": uid,
        "cgroup": str(cgroup) if cgroup else None,
        "netns": isolation.network,
        "mountns": isolation.filesystem,
        # The interpreter's prefixes: kept visible under the scratch tmpfs, and opened to
        # the unprivileged uid when there is one.
        "interpreter": interpreter_paths(),
        "expose": uid is not None,
        "scratch_bytes": limits.scratch_bytes,
        "limits": rlimits,
    }


def _tail(path: Path) -> str:
    """The last TAIL characters of a file, decoded leniently."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * TAIL))
        return f.read().decode("utf-8", "replace")[-TAIL:]


def _status(returncode: int | None, timed_out: bool, stderr: str) -> str:
    """ok / failed / timeout / error from how the run ended."""
    if timed_out:
        return "timeout"
    if returncode == 125 and stderr.startswith("lemur-jail:"):
        return "error"
    return "ok" if returncode == 0 else "failed"


def run_python(
    source: str,
    limits: Limits = Limits(),
    *,
    allow_network: bool = False,
    isolation: Isolation | None = None,
) -> Result:
    """Run `source` as program.py in a fresh sandbox; never raises for what the program does.

    Raises SandboxUnavailable when the network cannot be isolated and `allow_network` is
    False.
    """
    iso = probe() if isolation is None else isolation
    if not iso.network and not allow_network:
        raise SandboxUnavailable(
            "this machine cannot isolate the network of untrusted code "
            "(no network namespaces); allow the network explicitly to "
            "run anyway"
        )
    with tempfile.TemporaryDirectory(prefix="lemur-sandbox-", ignore_cleanup_errors=True) as tmp:
        os.chmod(tmp, 0o711)  # the run's uid traverses it; stdout/stderr files stay private
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "program.py").write_text(source)
        uid = _free_uid() if iso.own_uid else None
        if uid is not None:
            for path in (work, work / "program.py"):
                os.chown(path, uid, uid)
        argv = [sys.executable, "-I", "-B", "program.py"]
        cgroups = _pids_cgroup(limits.processes) if iso.pids_cgroup else contextlib.nullcontext()
        with cgroups as cgroup:
            spec = _spec(work, argv, limits, uid, cgroup, iso)
            returncode, timed_out, seconds = _launch(spec, Path(tmp), limits.timeout_s, uid)
        stdout, stderr = _tail(Path(tmp) / "stdout"), _tail(Path(tmp) / "stderr")
    status = _status(returncode, timed_out, stderr)
    return Result(status, returncode, stdout, stderr, seconds, uid)


def _launch(
    spec: dict, tmp: Path, timeout_s: float, uid: int | None
) -> tuple[int | None, bool, float]:
    """Start the jail, wait up to the timeout, kill everything: (returncode, timed out, s)."""
    jail = [sys.executable, "-I", "-S", str(JAIL), json.dumps(spec)]
    with open(tmp / "stdout", "wb") as out, open(tmp / "stderr", "wb") as err:
        start = time.monotonic()
        # No preexec_fn (unsafe in a threaded process): the jail script does the work.
        proc = subprocess.Popen(
            jail,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
        )
        try:
            returncode, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            returncode, timed_out = None, True
        finally:
            _kill_everything(proc, uid)
        return returncode, timed_out, time.monotonic() - start


PROBE_NET = """
import errno, socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", 9))
except OSError as e:
    raise SystemExit(0 if e.errno in (errno.ENETUNREACH, errno.EADDRNOTAVAIL) else 3)
raise SystemExit(4)
"""


def interpreter_paths() -> list[str]:
    """Directories the sandboxed interpreter must read: its prefix, base prefix and venv."""
    real = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted({sys.prefix, sys.base_prefix, real})


def _open_to_others(path: str) -> bool:
    """Whether another uid can traverse every directory down to `path`."""
    p = Path(path).resolve()
    return all(q.stat().st_mode & 0o001 for q in (p, *p.parents))


def _works(network: bool = False, filesystem: bool = False, own_uid: bool = False) -> bool:
    """Whether a run with only these mechanisms starts (and, for the network, isolates)."""
    iso = Isolation(network=network, filesystem=filesystem, own_uid=own_uid, pids_cgroup=False)
    limits = Limits(timeout_s=20, cpu_s=10)
    return run_python(
        PROBE_NET if network else "pass\n", limits, allow_network=True, isolation=iso
    ).ok


@functools.cache
def probe() -> Isolation:
    """The containment this machine gives (each mechanism tried once per process)."""
    root = os.geteuid() == 0
    filesystem = _works(filesystem=True, own_uid=root)
    # Without a private mount namespace the unprivileged uid must reach the interpreter itself.
    own_uid = root and (filesystem or all(map(_open_to_others, interpreter_paths())))
    return Isolation(
        network=_works(network=True),
        filesystem=filesystem,
        own_uid=own_uid,
        pids_cgroup=_cgroup_parent() is not None,
    )

"""Run untrusted Python (generated code and its tests) in a contained child process.

Every run gets a wall-clock timeout and resource limits (address space, CPU seconds, file
size, open files, processes), and is entered through lemur/eval/sandbox/jail.py, which adds what
the machine allows (probed once, `probe`):

- network: a new network namespace (what `unshare -n` does): no interface but a
  loopback that is down, so no connection anywhere, the host's localhost included;
- filesystem: a new mount and pid namespace with a root of its own: the interpreter's
  prefixes and the system's libraries (SYSTEM), read-only, and nothing else of the host
  (no project files, no host Unix sockets under /run or anywhere else); a fresh /proc
  that shows the run's processes only; the working directory, /tmp, /var/tmp and
  /dev/shm are tmpfs of `scratch_bytes` each that vanish with the run;
- processes: as root, each run runs under its own unused uid, so RLIMIT_NPROC counts
  that run's processes alone (for root it counts nothing: root is exempt), and cleanup
  can find every process the run made, including ones that left the process group;
  a pids cgroup (when one can be made) caps the count again, independent of uids;
- memory: a memory cgroup (when one can be made) caps all the run's processes together
  at `memory_bytes`; without one, each process gets `memory_bytes / processes` of
  address space, so that together they stay within it;
- keys: a new, empty session keyring, not the caller's (where Kerberos tickets live);
- the jail: the program's pid 1 shows "lemur-jail" and a minimal environment, nothing of
  the run's host paths, uid or settings; the working directory is SANDBOX_CWD.

After the program exits or times out, its process group, every process of its uid and
every process of its cgroups are killed with SIGKILL (with a pid namespace, the kernel
kills them all when its first process ends), and the run's directory is removed. Output
goes to files, not pipes, so a leftover child holding a pipe open cannot stall the harness.
Should the evaluator die (kill -9), each jail gets a parent-death signal and does the same
itself; what a jail killed as well left is removed at the next start (`leftovers`).

Without root some of this is unavailable: unprivileged user namespaces may still give
the network, mount and pid namespaces; RLIMIT_NPROC then counts all of the user's
processes (the limit is set to the user's current count plus the cap). `Isolation.describe`
says what is missing; callers refuse to run without network isolation unless told otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import marshal
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lemur.eval.sandbox import cgroups, leftovers, procs

JAIL = Path(__file__).with_name("jail.py")
TAIL = 4000  # characters of stdout/stderr kept per run
# What of the host a run's own root shows besides the interpreter (read-only): the system's
# programs and shared libraries, and the loader's cache. Absent ones are skipped; symbolic
# links (a merged /usr) are recreated as links.
SYSTEM = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",  # links some distributions' /usr/bin/python3 goes through
    "/etc/localtime",
)
REPORT_FD = 3  # where a run's program finds its report channel (`run_python(report=True)`)
# The working directory inside a root of its own: not the host's path (nothing there
# tells the program where on the host it is, or which run it is).
SANDBOX_CWD = "/sandbox"
# The jail's own environment (the program gets its spec's `env`): nothing of the caller's,
# which its namespace's init, pid 1 to the program, would otherwise show in /proc/1/environ.
JAIL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one run."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 << 30  # the whole run: all its processes and tmpfs together
    file_bytes: int = 16 << 20
    processes: int = 16
    open_files: int = 256
    scratch_bytes: int = 64 << 20  # each private tmpfs: the workdir, /tmp, /var/tmp, /dev/shm

    def rlimits(self, *, memory_cgroup: bool) -> dict[str, int]:
        """The jail's `limits` entry (processes added separately: it depends on the uid).

        With a memory cgroup capping the run, a process may use all of `memory_bytes`;
        without one, `processes` processes at `memory_bytes / processes` each stay within it.
        """
        per_process = self.memory_bytes if memory_cgroup else self.memory_bytes // self.processes
        return {
            "as": per_process,
            "cpu": self.cpu_s,
            "fsize": self.file_bytes,
            "nofile": self.open_files,
            "core": 0,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class Isolation:
    """What containment this machine gives a run."""

    network: bool
    filesystem: bool
    own_uid: bool
    pids_cgroup: bool
    memory_cgroup: bool

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
                "own root (interpreter and system libraries read-only, nothing else of the "
                "host), own pid namespace and /proc, size-capped tmpfs workdir and /tmp"
                if self.filesystem
                else "NOT isolated (mount or pid namespaces unavailable): the program can "
                "read and write wherever this user can, reach host Unix sockets, see other "
                "processes' command lines, and fill the disk (RLIMIT_FSIZE caps each file only)"
            ),
            "processes: "
            + (
                "own uid per run (RLIMIT_NPROC applies)"
                if self.own_uid
                else "RLIMIT_NPROC on this user's count"
            )
            + (" + pids cgroup" if self.pids_cgroup else ""),
            "memory: "
            + (
                "memory cgroup caps the run as a whole"
                if self.memory_cgroup
                else "no memory cgroup: address space capped per process at the run's "
                "memory divided by its process cap"
            ),
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
    report: bytes = b""  # what the program wrote to REPORT_FD (run_python(report=True))

    @property
    def ok(self) -> bool:
        """True when the program exited 0 in time."""
        return self.status == "ok"


class SandboxUnavailable(RuntimeError):
    """The machine cannot give the containment asked for."""


class Stopped(Exception):
    """A run stopped (or never started) because the evaluation is stopping (`run_pool`)."""


# Set while a `run_pool` unwinds from an exception: runs in flight stop, new ones refuse.
_stopping = threading.Event()
STOP_POLL_S = 0.1  # how often a run's wait looks at `_stopping`


@contextlib.contextmanager
def run_pool(workers: int) -> Iterator[ThreadPoolExecutor]:
    """A thread pool for sandboxed runs. An exception inside (SIGTERM's `Terminated`,
    Ctrl-C) stops every run in flight (killed and cleaned up as at a timeout) and refuses
    the rest before the pool is shut down: otherwise its shutdown would wait out each run's
    timeout (`--timeout 600`: ten minutes after a scheduler's SIGTERM)."""
    pool = ThreadPoolExecutor(max_workers=workers)
    _stopping.clear()
    try:
        yield pool
    except BaseException:
        _stopping.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        _stopping.clear()


def _spec(
    work: Path,
    argv: list[str],
    limits: Limits,
    uid: int | None,
    cgroup_dirs: list[Path],
    isolation: Isolation,
) -> dict:
    """The jail's instructions for one run."""
    rlimits = limits.rlimits(memory_cgroup=isolation.memory_cgroup)
    # With an own uid the count starts at 0; otherwise every process of the user counts.
    base = 0 if uid is not None else len(procs.proc_ids(os.getuid()))
    rlimits["nproc"] = base + limits.processes
    cwd = SANDBOX_CWD if isolation.filesystem else str(work)
    env = JAIL_ENV | {
        "HOME": cwd,
        "TMPDIR": cwd,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return {
        "parent": os.getpid(),  # the jail dies with it (and checks it is still its parent)
        "rundir": str(work.parent),  # the jail removes it should the evaluator die
        "workdir": str(work),
        "cwd": cwd,
        "argv": argv,
        "env": env,
        "uid": uid,
        "cgroups": [str(c) for c in cgroup_dirs],
        "netns": isolation.network,
        "mountns": isolation.filesystem,
        # The run's own root is built on this (empty) directory.
        "root": str(work.parent / "root"),
        "binds": sorted({*interpreter_paths(), *(p for p in SYSTEM if os.path.lexists(p))}),
        "scratch_bytes": limits.scratch_bytes,
        "limits": rlimits,
    }


def _tail(path: Path) -> str:
    """The last TAIL characters of a file, decoded leniently."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4 * TAIL))
        return f.read().decode("utf-8", "replace")[-TAIL:]


def _status(returncode: int | None, stderr: str, *, timed_out: bool) -> str:
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
    stdin: bytes = b"",
    report: bool = False,
) -> Result:
    """Run `source` as program.py in a fresh sandbox; never raises for what the program does.

    `stdin` is the program's standard input (a pipe; nothing else can read it); with
    `report`, the program can write to file descriptor REPORT_FD, and `Result.report`
    holds what it wrote. Raises SandboxUnavailable when the network cannot be isolated
    and `allow_network` is False.
    """
    iso = probe() if isolation is None else isolation
    if not iso.network and not allow_network:
        raise SandboxUnavailable(
            "this machine cannot isolate the network of untrusted code "
            "(no network namespaces); allow the network explicitly to "
            "run anyway"
        )
    if _stopping.is_set():
        raise Stopped("the evaluation is stopping")
    leftovers.remove_once()  # of killed evaluators before this one
    prefix = leftovers.prefix()
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as tmp:
        os.chmod(tmp, 0o711)  # the run's uid traverses it; stdout/stderr files stay private
        work, root = Path(tmp) / "work", Path(tmp) / "root"
        work.mkdir()
        root.mkdir()
        (work / "program.py").write_text(source)
        uid = procs.free_uid() if iso.own_uid else None
        if uid is not None:
            for path in (work, work / "program.py"):
                os.chown(path, uid, uid)
        argv = [sys.executable, "-I", "-B", "program.py"]
        # The namespace's init sits in the cgroups too (with a root of its own).
        extra = 1 if iso.filesystem else 0
        caps = {"pids": limits.processes + extra} if iso.pids_cgroup else {}
        caps |= {"memory": limits.memory_bytes} if iso.memory_cgroup else {}
        made = cgroups.run_cgroups(caps, procs.sweep, prefix)
        with made as cgroup_dirs, tempfile.TemporaryFile() as rep:
            spec = _spec(work, argv, limits, uid, cgroup_dirs, iso)
            spec["report_fd"] = rep.fileno() if report else None
            returncode, timed_out, seconds = _launch(spec, Path(tmp), limits, uid, stdin)
            rep.seek(0)
            reported = rep.read(limits.file_bytes)
        stdout, stderr = _tail(Path(tmp) / "stdout"), _tail(Path(tmp) / "stderr")
    status = _status(returncode, stderr, timed_out=timed_out)
    return Result(status, returncode, stdout, stderr, seconds, uid, reported)


def _launch(
    spec: dict, tmp: Path, limits: Limits, uid: int | None, stdin: bytes
) -> tuple[int | None, bool, float]:
    """Start the jail, wait up to the timeout, kill everything: (returncode, timed out, s)."""
    # The spec goes through a file, not the command line, which the run's pid 1 (a fork of
    # the jail) would show the program.
    spec_file = os.fdopen(os.memfd_create("lemur-jail-spec"), "wb")
    spec_file.write(marshal.dumps(spec))
    spec_file.flush()
    jail = [sys.executable, "-I", "-S", str(JAIL), str(spec_file.fileno())]
    keep = (spec_file.fileno(),)
    keep += (spec["report_fd"],) if spec["report_fd"] is not None else ()
    with spec_file, open(tmp / "stdout", "wb") as out, open(tmp / "stderr", "wb") as err:
        start = time.monotonic()
        # No preexec_fn (unsafe in a threaded process): the jail script does the work.
        proc = subprocess.Popen(
            jail,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            pass_fds=keep,
            env=JAIL_ENV,
        )
        try:
            if stdin:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.write(stdin)  # small: the pipe's buffer takes it at once
                proc.stdin.close()
            returncode, timed_out = _wait(proc, start + limits.timeout_s), False
        except subprocess.TimeoutExpired:
            returncode, timed_out = None, True
        finally:
            # Every descendant stays in the run's cgroups, which are swept when removed;
            # without one, the sweep goes by uid (a scan of every process: slower).
            procs.kill_everything(proc, None if spec["cgroups"] else uid)
        return returncode, timed_out, time.monotonic() - start


def _wait(proc: subprocess.Popen, deadline: float) -> int:
    """The jail's exit status; TimeoutExpired at `deadline` (monotonic), `Stopped` as soon
    as the evaluation stops (`run_pool`): the caller kills the run either way."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, 0)
        try:
            return proc.wait(timeout=min(left, STOP_POLL_S))
        except subprocess.TimeoutExpired:
            if _stopping.is_set():
                raise Stopped("the evaluation is stopping") from None


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


def open_to_others(path: str) -> bool:
    """Whether another uid can traverse every directory down to `path`."""
    p = Path(path).resolve()
    return all(q.stat().st_mode & 0o001 for q in (p, *p.parents))


def _works(*, network: bool = False, filesystem: bool = False, own_uid: bool = False) -> bool:
    """Whether a run with only these mechanisms starts (and, for the network, isolates)."""
    iso = Isolation(
        network=network,
        filesystem=filesystem,
        own_uid=own_uid,
        pids_cgroup=False,
        memory_cgroup=False,
    )
    limits = Limits(timeout_s=20, cpu_s=10)
    return run_python(
        PROBE_NET if network else "pass\n", limits, allow_network=True, isolation=iso
    ).ok


@functools.cache
def probe() -> Isolation:
    """The containment this machine gives (each mechanism tried once per process)."""
    root = os.geteuid() == 0
    filesystem = _works(filesystem=True, own_uid=root)
    # Without a root of its own the unprivileged uid must reach the interpreter itself.
    own_uid = root and (filesystem or all(map(open_to_others, interpreter_paths())))
    return Isolation(
        network=_works(network=True),
        filesystem=filesystem,
        own_uid=own_uid,
        pids_cgroup=cgroups.parent("pids") is not None,
        memory_cgroup=cgroups.parent("memory") is not None,
    )

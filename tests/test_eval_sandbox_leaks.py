"""lemur.eval.sandbox + jail: what of the evaluator a run can reach or outlive (issue #33):
the caller's session keyring, pid 1's command line and environment, a SIGKILLed evaluator."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from lemur.eval import sandbox
from lemur.eval.sandbox import cgroups, leftovers, procs

REPO = Path(__file__).resolve().parents[1]
isolation = sandbox.probe()
# (add_key, keyctl) system call numbers: glibc wraps neither.
KEY_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219), "riscv64": (217, 219)}
needs_keys = pytest.mark.skipif(
    platform.machine() not in KEY_SYSCALLS, reason="key system call numbers unknown here"
)
needs_filesystem = pytest.mark.skipif(
    not isolation.filesystem, reason="no mount and pid namespaces here"
)

KEYS = """\
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
ADD_KEY, KEYCTL = {syscalls}
SESSION, JOIN, SEARCH, READ = -3, 1, 10, 11  # KEY_SPEC_SESSION_KEYRING, KEYCTL_*

def keyctl(*args):
    return libc.syscall(KEYCTL, *args)

def add_key(name, payload):
    return libc.syscall(ADD_KEY, b"user", name, payload, len(payload), SESSION)

def read(key):
    buf = ctypes.create_string_buffer(4096)
    n = keyctl(READ, key, buf, len(buf))
    return buf.raw[: max(n, 0)]

def session_keys():
    raw = read(SESSION)
    return sorted(int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4))
"""

# In the sandbox: everything of the session keyring it can read, a search for the secret,
# and a key planted in it.
STEAL = (
    KEYS
    + """
payloads = [read(key).decode("latin-1") for key in session_keys()]
found = keyctl(SEARCH, SESSION, b"user", b"lemur-test-secret", 0)
search_errno = ctypes.get_errno()
planted = add_key(b"lemur-planted", b"planted")
print(json.dumps([payloads, found, search_errno, planted, session_keys()]))
"""
)

# In a subprocess of the test: a fresh session keyring holding a secret (as pam_keyinit
# makes one at login), then one sandboxed run of STEAL.
CALLER = (
    KEYS
    + """
import sys
from lemur.eval import sandbox
if keyctl(JOIN, None) == -1:  # a kernel without keyrings, or keyctl filtered out
    print(json.dumps({{"skip": errno.errorcode[ctypes.get_errno()]}}))
    raise SystemExit(0)
secret = sys.argv[1].encode()
key = add_key(b"lemur-test-secret", secret)
before = session_keys()
result = sandbox.run_python(sys.argv[2], sandbox.Limits(timeout_s=20, cpu_s=10))
print(json.dumps({{"key": key, "before": before, "after": session_keys(),
                  "out": result.stdout, "err": result.stderr[-500:]}}))
"""
)


@needs_keys
def test_the_callers_session_keyring_is_out_of_reach() -> None:
    """A run reads nothing of the evaluator's session keyring and plants nothing there: it
    has a new, empty one of its own (issue #33: it read a planted secret and added a key)."""
    syscalls = repr(KEY_SYSCALLS[platform.machine()])
    secret = f"secret-{uuid.uuid4().hex}"
    steal = STEAL.format(syscalls=syscalls)
    out = subprocess.run(
        [sys.executable, "-c", CALLER.format(syscalls=syscalls), secret, steal],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(out.stdout.splitlines()[-1]) if out.stdout else {}
    if "skip" in report:
        pytest.skip(f"no session keyrings here ({report['skip']})")
    assert report.get("key", -1) > 0, out.stderr[-800:]
    payloads, found, search_errno, planted, own_keys = json.loads(report["out"])
    assert secret not in "".join(payloads)
    assert found == -1 and search_errno == 126  # ENOKEY: not in its session keyring
    assert planted > 0 and own_keys == [planted]  # it has a keyring: its own, empty one
    assert report["before"] == report["after"] == [report["key"]]  # nothing planted


# In the sandbox: what it can read of pid 1 (the namespace's init) and of itself.
LOOK = """\
import json, os
def read(path):
    try:
        return open(path, "rb").read().decode("latin-1")
    except OSError as e:
        return f"unreadable: {e.strerror}"
views = {p: read(p) for p in ("/proc/1/cmdline", "/proc/1/environ", "/proc/self/cmdline",
                              "/proc/self/environ", "/proc/self/mountinfo", "/proc/1/cgroup",
                              "/proc/self/cgroup")}
views["cwd"] = os.getcwd()
os.write(3, json.dumps(views).encode())  # the report channel: stdout keeps only its tail
"""


@needs_filesystem
@pytest.mark.parametrize("own_uid", [True, False], ids=["own-uid", "callers-uid"])
def test_pid_1_shows_nothing_of_the_run(own_uid: bool, monkeypatch) -> None:
    """/proc/1/cmdline is "lemur-jail" and no view of pid 1 or of the program itself holds
    the run's host path, uid or settings (issue #33: pid 1's command line held them all;
    its /proc/PID/cgroup, the run's cgroup paths, named the evaluator and the host's own
    cgroup). Run under the caller's uid too, where /proc/1/environ is readable."""
    if own_uid and not isolation.own_uid:
        pytest.skip("not root: no per-run uid")
    token = uuid.uuid4().hex
    own_tmp = Path(tempfile.mkdtemp(prefix=f"lemur-test-{token}-"))
    own_tmp.chmod(0o711)  # the run's uid traverses it, as it does /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(own_tmp))
    iso = dataclasses.replace(isolation, filesystem=True, own_uid=own_uid)
    limits = sandbox.Limits(timeout_s=20, cpu_s=10, memory_bytes=1234567 << 10)
    try:
        result = sandbox.run_python(LOOK, limits, isolation=iso, allow_network=True, report=True)
    finally:
        own_tmp.rmdir()
    assert result.ok, result.stderr[-800:]
    views = json.loads(result.report)
    assert views["/proc/1/cmdline"] == "lemur-jail\0"
    assert views["cwd"] == sandbox.SANDBOX_CWD
    environ = views["/proc/1/environ"]
    if not own_uid:  # root in the sandbox reads it; a run's own uid may not
        assert {v.split("=")[0] for v in environ.split("\0") if v} == set(sandbox.JAIL_ENV)
    secrets = [token, str(own_tmp), "lemur-sandbox", str(limits.memory_bytes)]
    secrets += [str(result.uid)] if own_uid else []
    for where, text in views.items():
        assert not [s for s in secrets if s in text], where


# Run by a process the test then SIGKILLs: one run whose program leaves a child that left
# its session (so only the pid namespace or the cgroup reaches it), both sleeping forever.
# The run is started from a worker thread, as `humaneval.check` starts them, beside many
# idle threads (as JAX's): a kill -9 ends them one by one, the starting thread first.
EVALUATOR = """\
import json, os, sys, threading
from lemur.eval import sandbox
token = os.environ["SLEEPER_TOKEN"]
sleep = [sys.executable, "-c", "import time; time.sleep(600)", token]
program = f'''
import os
if os.fork() == 0:
    os.setsid()
    os.execv({sleep[0]!r}, {sleep!r})
os.execv({sleep[0]!r}, {sleep!r})
'''
iso = sandbox.Isolation(**json.loads(sys.argv[1]))
limits = sandbox.Limits(timeout_s=300, cpu_s=300)
run = lambda: sandbox.run_python(program, limits, isolation=iso, allow_network=True)
idle = threading.Event()
for _ in range(64):
    threading.Thread(target=idle.wait, daemon=True).start()
worker = threading.Thread(target=run)
worker.start()
worker.join()
"""


def _sleepers(token: str) -> list[int]:
    """The processes whose command line ends with `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if token.encode() in args:
            found.append(int(pid))
    return found


def _cgroup_parents() -> list[Path]:
    """Where the sandbox makes its cgroups here."""
    return sorted({where for where, _ in filter(None, map(cgroups.parent, ("pids", "memory")))})


def _wait_for(condition, seconds: float) -> bool:  # noqa: ANN001 - a function of nothing
    """Whether `condition()` became true within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


ISOLATIONS = {
    "own-root": isolation,
    "cgroups-only": dataclasses.replace(isolation, filesystem=False, own_uid=False),
}


@pytest.mark.parametrize("name", sorted(ISOLATIONS))
def test_a_killed_evaluator_leaves_nothing_running(name: str, tmp_path: Path) -> None:
    """SIGKILL of the evaluating process mid-run: within seconds no process of the run, no
    cgroup and no directory of it is left (issue #33: 30 s after a kill -9, its processes,
    cgroups and /tmp/lemur-sandbox-* directories were all there; sleepers ran forever)."""
    iso = ISOLATIONS[name]
    if name == "own-root" and not iso.filesystem:
        pytest.skip("no mount and pid namespaces here")
    if name == "cgroups-only" and not (iso.pids_cgroup or iso.memory_cgroup):
        pytest.skip("no writable cgroups here: nothing but the pid namespace finds the child")
    token = f"sleeper-{uuid.uuid4().hex}"
    iso_json = json.dumps(dataclasses.asdict(iso))
    tmp_path.chmod(0o711)  # the run's uid traverses it, as it does /tmp
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)}
    evaluator = subprocess.Popen(  # the token in its environment: not in its command line
        [sys.executable, "-c", EVALUATOR, iso_json], env=env | {"SLEEPER_TOKEN": token}
    )
    try:
        assert _wait_for(lambda: len(_sleepers(token)) == 2, 60), "the run never started"
        runs = list(tmp_path.glob("lemur-sandbox-*"))
        sleepers = set(_sleepers(token))
        groups = [  # the run's cgroups: those holding its processes
            group
            for parent in _cgroup_parents()
            for group in parent.glob("lemur-sandbox-*")
            if sleepers & set(cgroups.procs(group))
        ]
        assert len(runs) == 1 and len(groups) == iso.pids_cgroup + iso.memory_cgroup
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait()
        gone = _wait_for(
            lambda: not _sleepers(token) and not any(p.exists() for p in runs + groups), 10
        )
        assert gone, (_sleepers(token), [p for p in runs + groups if p.exists()])
    finally:
        evaluator.kill()
        evaluator.wait()
        for pid in _sleepers(token):
            os.kill(pid, signal.SIGKILL)


def _owner(process: subprocess.Popen) -> str:
    """The owner tag of a running process (as procs.owner_tag gives it for itself)."""
    namespace = os.stat(f"/proc/{process.pid}/ns/pid").st_ino
    return f"{process.pid}.{procs.start_time(process.pid)}.{namespace}"


def test_a_next_start_removes_what_dead_runs_left(tmp_path: Path) -> None:
    """Leftovers of an owner that no longer runs (its directory, its cgroups and the process
    in them) are removed at the next start; those of a live owner are not touched."""
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    dead_owner, live_owner, victim = (subprocess.Popen(sleep) for _ in range(3))
    made: list[Path] = []
    try:
        dead, live = _owner(dead_owner), _owner(live_owner)
        dead_owner.kill()
        dead_owner.wait()
        for parent in [tmp_path, *_cgroup_parents()]:
            for tag in (dead, live):
                made.append(parent / f"{leftovers.PREFIX}{tag}-{uuid.uuid4().hex[:8]}")
                made[-1].mkdir()
        (made[0] / "work").mkdir()  # a run's directory holds its work and root
        (made[0] / "work" / "program.py").write_text("pass\n")
        for group in made[2::2]:  # the dead owner's cgroups
            (group / "cgroup.procs").write_text(str(victim.pid))
        removed = leftovers.remove(tmp_path, _cgroup_parents())
        # (Other dead owners' leftovers may go too: the cgroup parents are shared.)
        assert set(made[0::2]) <= set(removed) and not set(made[1::2]) & set(removed)
        assert [p.exists() for p in made] == [False, True] * (len(made) // 2)
        assert victim.poll() == (-signal.SIGKILL if len(made) > 2 else None)
    finally:
        for process in (live_owner, victim):
            process.kill()
            process.wait()
        for path in made[1::2]:
            path.rmdir()

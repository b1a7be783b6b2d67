"""lemur.eval.humaneval + lemur.eval.sandbox: the harness scores right and contains bad code."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lemur.eval import humaneval as he
from lemur.eval import sandbox

REPO = Path(__file__).resolve().parents[1]
FAST = sandbox.Limits(timeout_s=4, cpu_s=3)
# A stand-in task: the test passes only if the completion's function returns 1.
PROBE_TASK = he.Task("probe/0", "def f():\n", "def check(c):\n    assert c() == 1\n", "f")

isolation = sandbox.probe()
needs = {
    "network": pytest.mark.skipif(not isolation.network, reason="no network namespaces here"),
    "filesystem": pytest.mark.skipif(not isolation.filesystem, reason="no mount namespaces"),
    "uid": pytest.mark.skipif(not isolation.own_uid, reason="not root: no per-run uid"),
}


@pytest.fixture(scope="module")
def tasks() -> list[he.Task]:
    return he.humaneval_tasks()


def test_canonical_solutions_score_one(tasks: list[he.Task]) -> None:
    assert len(tasks) == 164
    records = he.check(
        tasks, [(t.task_id, t.canonical_solution) for t in tasks], FAST, allow_network=True
    )
    failed = [(r["task_id"], r["error"]) for r in records if not r["passed"]]
    assert not failed
    assert he.summarize(records, [1])["pass@1"] == 1.0


def test_return_none_scores_zero(tasks: list[he.Task]) -> None:
    records = he.check(
        tasks, [(t.task_id, "    return None\n") for t in tasks], FAST, allow_network=True
    )
    summary = he.summarize(records, [1])
    assert summary["pass@1"] == 0.0 and summary["statuses"] == {"failed": 164}


def _one(completion: str, limits: sandbox.Limits = FAST) -> dict:
    """Check one completion of PROBE_TASK in the sandbox."""
    [record] = he.check([PROBE_TASK], [("probe/0", completion)], limits)
    return record


@needs["network"]
def test_socket_is_contained() -> None:
    """Neither the host's localhost nor the outside world can be reached."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        for address in (("127.0.0.1", port), ("1.1.1.1", 53)):
            record = _one(
                "    import socket\n"
                f"    s = socket.create_connection({address!r}, timeout=2)\n"
                "    s.sendall(b'escaped')\n"
                "    return 1\n"
            )
            assert not record["passed"] and record["status"] == "failed"
            assert "unreachable" in record["error"] or "not available" in record["error"]
            assert record["seconds"] < FAST.timeout_s
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected


@needs["filesystem"]
def test_writes_outside_the_workdir_are_contained(tmp_path: Path) -> None:
    token = uuid.uuid4().hex[:12]
    host_targets = [
        tmp_path / "escape.txt",
        REPO / f"escape-{token}.txt",
        Path(f"/etc/lemur-escape-{token}"),
        Path("..") / f"escape-{token}.txt",
    ]
    scratch_targets = [Path(f"/tmp/lemur-escape-{token}"), Path(f"/var/tmp/lemur-escape-{token}")]
    try:
        for target in host_targets:
            record = _one(f"    open({str(target)!r}, 'w').write('escaped')\n    return 1\n")
            assert not record["passed"], target
            assert any(e in record["error"] for e in ("Read-only", "No such file", "Permission"))
        for target in scratch_targets:  # allowed, but only in the run's own tmpfs
            _one(f"    open({str(target)!r}, 'w').write('escaped')\n    return 1\n")
        left = [t for t in host_targets[:3] + scratch_targets if t.exists()]
        assert not left
        assert not list(Path("/tmp").glob("lemur-sandbox-*/work"))  # workdirs removed
    finally:
        for target in host_targets[:3] + scratch_targets:
            target.unlink(missing_ok=True)


BOMB = """\
    import os, time
    made = 0
    for _ in range(150):  # at most 150 children even with no containment at all
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            os.setsid()  # leave the process group: only the uid/cgroup sweep finds it
            time.sleep(60)
            os._exit(0)
        made += 1
    print("forked", made, flush=True)
    time.sleep(60)
    return 1
"""


@needs["uid"]
def test_fork_bomb_is_capped_and_swept() -> None:
    limits = sandbox.Limits(timeout_s=3, cpu_s=3, processes=8)
    result = sandbox.run_python(he.program(PROBE_TASK, BOMB), limits)
    assert result.status == "timeout" and result.seconds < limits.timeout_s + 2
    assert result.stdout.strip() == "forked 7"  # 8 processes in all, the program included
    assert result.uid is not None and not sandbox._proc_ids(result.uid)  # none survived


def test_infinite_loop_is_stopped() -> None:
    limits = sandbox.Limits(timeout_s=2, cpu_s=1)
    record = _one("    while True:\n        pass\n", limits)
    assert not record["passed"] and record["seconds"] < 4


def test_refuses_without_network_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    weak = sandbox.Isolation(network=False, filesystem=False, own_uid=False, pids_cgroup=False)
    monkeypatch.setattr(sandbox, "probe", lambda: weak)
    with pytest.raises(sandbox.SandboxUnavailable, match="allow-network"):
        he.check([PROBE_TASK], [("probe/0", "    return 1\n")])
    assert any("NOT isolated" in line for line in weak.describe())


def test_pass_at_k_and_summary() -> None:
    assert he.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert he.pass_at_k(5, 0, 3) == 0.0 and he.pass_at_k(5, 3, 3) == 1.0
    assert he.pass_at_k(10, 1, 5) == pytest.approx(0.5)
    records = [
        {"task_id": t, "passed": p, "status": "ok" if p else "failed"}
        for t, p in [("a", True), ("a", False), ("b", False), ("b", False)]
    ]
    summary = he.summarize(records, [1, 2, 5])
    assert summary["pass@1"] == pytest.approx(0.25) and summary["pass@2"] == pytest.approx(0.5)
    assert "pass@5" not in summary  # more than the 2 samples per task


def test_task_file_and_truncation(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": "def double(x):\n",
            "test": "def check(f):\n    assert f(2) == 4\n",
            "entry_point": "double",
        },
        {
            "task_id": "mine/1",
            "prompt": "def neg(x):\n",
            "test": "def check(f):\n    assert f(1) == -1\n",
            "entry_point": "neg",
        },
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = he.load_tasks(path)
    assert [t.task_id for t in tasks] == ["task/0", "mine/1"]
    completion = he.truncate("    return 2 * x\n\ndef other():\n    pass\n")
    assert completion == "    return 2 * x\n"
    records = he.check(
        tasks, [("task/0", completion), ("mine/1", "    return x\n")], FAST, allow_network=True
    )
    assert [r["passed"] for r in records] == [True, False]
    samples, summary = he.write_results(tmp_path / "out", records, he.summarize(records, [1]))
    assert len(samples.read_text().splitlines()) == 2
    assert json.loads(summary.read_text())["pass@1"] == 0.5
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="test, entry_point"):
        he.load_tasks(bad)


@needs["filesystem"]
def test_an_interpreter_under_tmp_keeps_the_private_filesystem(tmp_path: Path) -> None:
    """A venv under /tmp (CI clones live there) survives the scratch tmpfs laid over /tmp."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    show = "from lemur.eval import sandbox; i = sandbox.probe(); print(i.filesystem, i.own_uid)"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", show], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["True", str(isolation.own_uid)], out.stderr[-500:]

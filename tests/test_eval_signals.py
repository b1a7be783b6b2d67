"""`lemur-eval` stopped by SIGTERM (a scheduler's preemption: SIGTERM, then SIGKILL after a
grace period), as a real process: during its imports, and with sandboxed runs in flight
(#44 item 22). Both end 143 with one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lemur.eval import sandbox
from lemur.eval.sandbox.leftovers import PREFIX

LEMUR_EVAL = [sys.executable, "-c", "import sys; from lemur.eval.cli import main; sys.exit(main())"]
needs_network = pytest.mark.skipif(
    not sandbox.probe().network, reason="no network namespaces: the sandbox refuses"
)


def _wait_for(condition, seconds: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.005)


def _maps(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return ""


def test_sigterm_during_the_imports_is_143_and_one_line(tmp_path: Path) -> None:
    """SIGTERM while `lemur-eval` imports what its command needs (numpy, JAX: 19 s on a
    loaded machine) ended the process by the signal (status -15), without a line."""
    proc = subprocess.Popen(
        [*LEMUR_EVAL, "humaneval", "--canonical", "--limit", "1", "--out", str(tmp_path / "o")],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: "numpy" in _maps(proc.pid), 60, "numpy import")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (143, "lemur-eval: terminated (SIGTERM)\n"), err
    assert not (tmp_path / "o").exists()


@needs_network
def test_sigterm_with_sandboxed_runs_in_flight_stops_them_and_writes_what_is_done(
    tmp_path: Path,
) -> None:
    """`humaneval --timeout 600` with two runs sleeping: SIGTERM was ignored until their
    timeout (still running 109 s later, no line). Now the runs are stopped, the checked
    sample is written with a summary saying the run was interrupted, no run leaves a
    process or directory behind, and the exit is 143 with one line, within seconds."""
    check = "def check(f):\n    assert f() == 1\n"
    sleep = "def check(f):\n    import time\n    time.sleep(1000)\n"
    rows = [
        {"task_id": "quick", "prompt": "def f():\n", "test": check, "entry_point": "f"},
        {"task_id": "slow/1", "prompt": "def f():\n", "test": sleep, "entry_point": "f"},
        {"task_id": "slow/2", "prompt": "def f():\n", "test": sleep, "entry_point": "f"},
    ]
    for r in rows:
        r["canonical_solution"] = "    return 1\n"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    argv = ["humaneval", "--canonical", "--tasks", str(tasks), "--timeout", "600"]
    env = {**os.environ, "LEMUR_PROGRESS_INTERVAL": "0.1"}
    proc = subprocess.Popen(
        [*LEMUR_EVAL, *argv, "--workers", "3", "--out", str(out)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: any("check: 1/3 samples" in x for x in lines), 120, "checked sample")
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        proc.wait(timeout=30)
        took = time.monotonic() - began
    finally:
        proc.kill()
    reader.join(10)
    assert proc.returncode == 143 and took < 10, (proc.returncode, took)
    assert lines[-1] == "lemur-eval: terminated (SIGTERM)\n", lines
    records = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["passed"]) for r in records] == [("quick", True)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "terminated (SIGTERM)"
    assert (summary["samples_checked"], summary["samples"]) == (1, 3)
    assert not any(k.startswith("pass@") for k in summary)
    left = [p for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}{proc.pid}.*")]
    assert left == []


@needs_network
def test_a_run_pool_left_by_an_exception_stops_its_runs_at_once() -> None:
    """What `humaneval`, `infill` and `agent` check in (`sandbox.run_pool`): an exception
    inside (SIGTERM's Terminated) stops the run in flight, long before its timeout, and
    refuses the queued one; a later pool runs normally."""
    from lemur.cli_common import Terminated

    limits = sandbox.Limits(timeout_s=600, cpu_s=600)
    began = time.monotonic()
    with pytest.raises(Terminated), sandbox.run_pool(1) as pool:
        futures = [pool.submit(sandbox.run_python, "import time\ntime.sleep(1000)\n", limits)]
        futures.append(pool.submit(sandbox.run_python, "pass\n", limits))
        time.sleep(1)
        raise Terminated
    assert time.monotonic() - began < 10
    assert isinstance(futures[0].exception(), sandbox.Stopped)
    assert futures[1].cancelled()  # queued behind the busy worker: never started
    with sandbox.run_pool(1) as pool:
        assert pool.submit(sandbox.run_python, "pass\n").result().ok

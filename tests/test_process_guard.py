"""No process outlives a SIGKILLed `lemur-data build` or `lemur-train`.

Each CLI runs with a marker variable in its environment; every process it starts inherits
it. After a SIGKILL of the CLI, no live process may still carry the marker 10 s later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl
from test_train_distributed import write_config
from test_train_loop import build_corpus, tiny_config

MARKER = "LEMUR_TEST_PROCESS_MARKER"
pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")


def marked_pids(token: str) -> list[int]:
    """Live (not zombie) processes whose environment carries `MARKER=token`."""
    needle = f"{MARKER}={token}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in ("Z", "X"):
            pids.append(int(d.name))
    return pids


def start(args: list[str], token: str, log: Path) -> subprocess.Popen:
    """Start a CLI with the marker in its environment, output to `log`."""
    env = {**os.environ, MARKER: token}
    with open(log, "w") as fh:
        return subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=fh, stderr=fh)


def wait_for(condition, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    """Poll `condition` until true; fail if the CLI exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"exited early ({proc.returncode}): {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"condition not reached: {log.read_text()[-2000:]}"
        time.sleep(0.05)


def kill_and_check(proc: subprocess.Popen, token: str) -> None:
    """SIGKILL the CLI; within 10 s nothing it started may be alive."""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while (left := marked_pids(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # don't leak them into the rest of the suite, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the killed CLI: {left}"


@pytest.fixture(scope="module")
def build_recipe(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("guard_src")
    code = root / "code"
    code.mkdir()
    for p in real_python_files(120):
        (code / p.name).write_bytes(p.read_bytes())
    text = write_jsonl(root / "text.jsonl", real_text_docs(80))
    return base_recipe(
        root, code, [text], filters=NO_FILTERS, executor={"kind": "local", "tasks": 8, "workers": 2}
    )


@pytest.mark.parametrize("phase", ["tokenize", "shuffle"])
def test_killed_build_leaves_no_process(build_recipe: dict, tmp_path: Path, phase: str) -> None:
    out = tmp_path / "out"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**build_recipe, "output": str(out)}))
    token, log = uuid.uuid4().hex, tmp_path / "build.log"
    proc = start(["lemur.data.cli", "build", str(path)], token, log)
    if phase == "tokenize":  # workers are alive and tasks are running
        wait_for(
            lambda: len(marked_pids(token)) >= 3 and list(out.glob(".work/tokens-*/logs")),
            120,
            proc,
            log,
        )
    else:
        wait_for(lambda: list(out.glob(".work/shuffle-*")), 180, proc, log)
    kill_and_check(proc, token)
    assert not (out / "manifest.json").exists()


def test_killed_trainer_leaves_no_loader_worker(tmp_path_factory, tmp_path: Path) -> None:
    corpus = build_corpus(tmp_path_factory.mktemp("guard_corpus"))
    run = tmp_path / "run"
    config = tiny_config(
        corpus, run, "steps=100000", "data.num_workers=2", "checkpoint.every=100000"
    )
    path = write_config(config, tmp_path / "config.yaml")
    token, log = uuid.uuid4().hex, tmp_path / "train.log"
    proc = start(["lemur.train.cli", str(path)], token, log)
    metrics = run / "metrics.jsonl"
    # Training steps are being logged and the loader's worker processes are up.
    wait_for(
        lambda: metrics.is_file() and metrics.stat().st_size > 0 and len(marked_pids(token)) >= 2,
        240,
        proc,
        log,
    )
    kill_and_check(proc, token)


def test_guarded_child_dies_with_parent(tmp_path: Path) -> None:
    # A parent that starts a guarded grandchild and is then SIGKILLed: the grandchild goes.
    script = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, time; from lemur.process_guard import die_with_parent; "
    "die_with_parent({{ppid}}); open({str(tmp_path / "ready")!r}, 'w').close(); time.sleep(600)"
    .replace("{{ppid}}", str(__import__("os").getpid()))])
print(child.pid, flush=True)
time.sleep(600)
"""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, MARKER: token},
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(proc.stdout.readline())
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert child in marked_pids(token)
    kill_and_check(proc, token)

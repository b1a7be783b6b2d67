"""Ctrl-C before training starts: `lemur-train` exits 130 with one line, every time, from any
moment of set-up (imports, data checks, restore, compilation), and leaves nothing half-written.

Each try is a real `lemur-train` subprocess sent SIGINT at a chosen moment; compilation is
not cached, so a signal after the set-up line lands in restore or compilation.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_train_loop import build_corpus, tiny_config

from lemur.train.loop import train

SETUP_LINE = "params, mesh"  # printed once the data is checked, before restore and compile
STARTED_LINE = "compiled in"  # printed when training starts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("int_corpus"))


@pytest.fixture(scope="module")
def checkpointed(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped with a checkpoint at step 10 (the next run resumes from it)."""
    run = tmp_path_factory.mktemp("int_ckpt") / "run"
    train(tiny_config(corpus, run, "steps=10", "eval.at_start=false"))
    return run


def interrupt(
    config_file: Path, *, after_start: float | None = None, after_setup_line: float | None = None
) -> tuple[int, str, bool]:
    """Run lemur-train, SIGINT it at a moment: (exit code, stderr, signal sent in set-up)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lemur.train.cli", str(config_file)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[str] = []
    setup = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if SETUP_LINE in line:
                setup.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if after_start is not None:
        time.sleep(after_start)
    else:
        assert setup.wait(120), "".join(lines)
        time.sleep(after_setup_line or 0.0)
    in_setup = not any(STARTED_LINE in line for line in lines)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(120)
    reader.join(10)
    return code, "".join(lines), in_setup


def assert_nothing_half_written(run: Path, config_text: str) -> None:
    """What set-up writes is either absent or whole; no temporary files are left."""
    if (run / "config.yaml").exists():
        assert (run / "config.yaml").read_text() == config_text
    leftovers = [p for p in run.rglob("*") if ".tmp" in p.name or "orbax-checkpoint-tmp" in p.name]
    assert not leftovers, leftovers


@pytest.mark.parametrize(
    "moment",
    [
        {"after_start": 0.3},
        {"after_start": 2.0},
        {"after_setup_line": 0.0},
        {"after_setup_line": 0.4},
        {"after_setup_line": 1.0},
    ],
)
def test_ctrl_c_during_setup_exits_130_cleanly(moment: dict, corpus: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tiny_config(corpus, run)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    code, err, in_setup = interrupt(config_file, **moment)
    check(code, err, in_setup)
    assert_nothing_half_written(run, config.to_yaml())
    if code == 130:
        assert not (run / "metrics.jsonl").exists() and not list(run.glob("checkpoints/*"))


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_ctrl_c_while_resuming_exits_130_cleanly(
    delay: float, corpus: Path, checkpointed: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    before = (run / "metrics.jsonl").read_text()
    config = tiny_config(corpus, run, "eval.at_start=false")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    code, err, in_setup = interrupt(config_file, after_setup_line=delay)
    check(code, err, in_setup)
    assert_nothing_half_written(run, config.to_yaml())
    if code == 130:
        assert (run / "metrics.jsonl").read_text() == before
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10"]


def check(code: int, err: str, in_setup: bool) -> None:
    """Exit 130 with the one line when the signal came in set-up; never a crash."""
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    if code == 0:  # training had started (a race only when in_setup): stopped at a step
        assert "stopped at step" in err and STARTED_LINE in err, (code, err)
        return
    assert code == 130, (code, in_setup, err)
    assert err.strip().splitlines()[-1] == "lemur-train: interrupted before training started", err


def test_jax_cache_writes_are_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX writes a persistent-cache entry in place: while armed, an exit waits for it."""
    from jax._src import compilation_cache as cache

    from lemur.train import interrupt

    seen: list[int] = []

    def put(*args: object) -> str:
        seen.append(interrupt.INTERRUPTS.depth())  # inside `critical()` when guarded
        return "written"

    monkeypatch.setattr(cache, "put_executable_and_time", put)
    interrupt.guard_jax_cache_writes()
    assert cache.put_executable_and_time is put  # not armed (library use): untouched
    assert interrupt.arm()
    try:
        interrupt.guard_jax_cache_writes()
        assert cache.put_executable_and_time("key") == "written"
    finally:
        interrupt.restore()
    assert cache.put_executable_and_time is put and seen == [1]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

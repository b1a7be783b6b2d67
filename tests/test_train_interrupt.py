"""Ctrl-C before training starts: `lemur-train` exits 130 with one line, every time, from any
moment of set-up (imports, data checks, restore, compilation), and leaves nothing half-written.

Each try is a real `lemur-train` subprocess (PAUSER) that stops at a chosen moment of its
set-up and says so on stdout; the test then sends the signal, so it always lands there.
The process waits for it either in Python (`time.sleep`: the Python-level handler and the
watcher thread race to exit) or, like the main thread inside XLA's compiler, in C with the
signal blocked in the main thread (only the watcher thread can end the process).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_train_loop import build_corpus, tiny_config

from lemur.train.loop import train

SETUP_LINE = "params, mesh"  # printed once the data is checked, before restore and compile
STARTED_LINE = "compiled in"  # printed when training starts
PAUSED = "paused at "  # PAUSER's line on stdout: the moment has come, send the signal

PAUSER = r"""
import ctypes, signal, sys, time

config, moment, how = sys.argv[1:4]
SETUP_LINE = "params, mesh"


def pause():
    if how == "native":  # the main thread in C, where no Python handler runs
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print(f"paused at {moment}", flush=True)
    if how == "native":
        ctypes.CDLL(None).sleep(120)
    else:
        time.sleep(120)
    # Only reached when the signal did not end the process: the run goes on (and fails the test).


if moment == "import":  # the slow imports of set-up: pause as jax starts to load
    import importlib.abc

    class PauseAtJax(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "jax":
                sys.meta_path.remove(self)
                pause()

    sys.meta_path.insert(0, PauseAtJax())
elif moment == "setup line":  # right after the set-up line is printed

    class Stream:
        def __init__(self, stream):
            self.stream = stream

        def write(self, text):
            n = self.stream.write(text)
            if SETUP_LINE in text:
                self.stream.flush()
                pause()
            return n

        def __getattr__(self, name):
            return getattr(self.stream, name)

    sys.stderr = Stream(sys.stderr)
elif moment == "restore":  # resuming: as the checkpoint is about to be read
    from lemur.train.checkpoint import Checkpointer

    restore = Checkpointer.restore

    def paused_restore(self, *args, **kwargs):
        pause()
        return restore(self, *args, **kwargs)

    Checkpointer.restore = paused_restore
elif moment == "compile":  # as XLA is about to compile the first step
    import jax.stages

    compile_ = jax.stages.Lowered.compile

    def paused_compile(self, *args, **kwargs):
        pause()
        return compile_(self, *args, **kwargs)

    jax.stages.Lowered.compile = paused_compile
from lemur.train.cli import main

sys.exit(main([config]))
"""


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
    config_file: Path, moment: str, how: str, sig: signal.Signals = signal.SIGINT
) -> tuple[int, str]:
    """Run lemur-train, send `sig` once it has paused at `moment`: (exit code, stderr)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSER, str(config_file), moment, how],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the process says it is there (or ends)
            if line.startswith(PAUSED):
                assert line.strip() == PAUSED + moment
                break
        else:
            proc.wait(60)
            reader.join(10)
            pytest.fail(f"never paused at {moment}: {''.join(lines)[-3000:]}")
        proc.send_signal(sig)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 120 s after the signal at {moment}: {''.join(lines)}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    return code, "".join(lines)


def assert_nothing_half_written(run: Path, config_text: str) -> None:
    """What set-up writes is either absent or whole; no temporary files are left."""
    if (run / "config.yaml").exists():
        assert (run / "config.yaml").read_text() == config_text
    leftovers = [p for p in run.rglob("*") if ".tmp" in p.name or "orbax-checkpoint-tmp" in p.name]
    assert not leftovers, leftovers


@pytest.mark.parametrize(
    "moment, how, sig",
    [
        ("import", "python", signal.SIGINT),
        ("setup line", "python", signal.SIGINT),
        ("setup line", "python", signal.SIGTERM),
        ("compile", "native", signal.SIGINT),
    ],
)
def test_ctrl_c_during_setup_exits_130_cleanly(
    moment: str, how: str, sig: signal.Signals, corpus: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    config = tiny_config(corpus, run)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    code, err = interrupt(config_file, moment, how, sig)
    check(code, err, sig)
    assert_nothing_half_written(run, config.to_yaml())
    assert not (run / "metrics.jsonl").exists() and not list(run.glob("checkpoints/*"))


@pytest.mark.parametrize("moment, how", [("restore", "python"), ("compile", "native")])
def test_ctrl_c_while_resuming_exits_130_cleanly(
    moment: str, how: str, corpus: Path, checkpointed: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(checkpointed, run)
    before = (run / "metrics.jsonl").read_text()
    config = tiny_config(corpus, run, "eval.at_start=false")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config.to_yaml())
    code, err = interrupt(config_file, moment, how)
    check(code, err)
    assert_nothing_half_written(run, config.to_yaml())
    assert (run / "metrics.jsonl").read_text() == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10"]


def check(code: int, err: str, sig: signal.Signals = signal.SIGINT) -> None:
    """Exit 130 (SIGTERM: 143) with the one line, before training started; never a crash."""
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    assert STARTED_LINE not in err, err
    line = {
        signal.SIGINT: ("interrupted before training started", 130),
        signal.SIGTERM: ("terminated (SIGTERM) before training started", 143),
    }[sig]
    assert (code, err.strip().splitlines()[-1]) == (line[1], f"lemur-train: {line[0]}"), err


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

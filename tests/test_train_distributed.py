"""Sharded and multi-process runs match one device: a (2, 2, 2) mesh on 8 emulated devices,
and two jax.distributed processes on localhost (gloo collectives), 2 devices each.

Runs happen in subprocesses (this file as a script: `run CONFIG [--kill-at STEP]`),
because XLA_FLAGS and jax.distributed must be set up before jax is first imported.
tests/test_train_resume.py uses the same script mode for its SIGKILL run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for the script mode
from test_train_loop import build_corpus, compile_cache, tiny_config, train_losses  # noqa: E402

from lemur.train.checkpoint import Checkpointer  # noqa: E402

HERE = Path(__file__).resolve()
STEPS = 6  # compared over the first 5; the schedule is pinned (decay_steps), so these 6
# steps are the first 6 of the shared 30-step config


def run_script(
    config_file: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 240
) -> subprocess.CompletedProcess:
    """Train CONFIG in a fresh CPU-only Python (see `_script`)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    return subprocess.run(
        [sys.executable, str(HERE), "run", str(config_file), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_config(config: object, path: Path) -> Path:
    """Write a TrainConfig as YAML and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_yaml())  # type: ignore[attr-defined]
    return path


def rel_diff(a: dict[int, float], b: dict[int, float], steps: range) -> float:
    """Largest relative difference of two loss series over `steps`."""
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("dist_corpus"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(
    corpus: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, float]:
    """Per-step losses of the shared config on one device, in this process."""
    from lemur.train.loop import train

    run = tmp_path_factory.mktemp("reference") / "run"
    train(tiny_config(corpus, run, f"steps={STEPS}", "checkpoint.every=0", cache=cache))
    return train_losses(run)


def test_mesh_2x2x2_on_8_devices_matches_one_device(
    corpus: Path, cache: Path, reference: dict[int, float], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    config = tiny_config(
        corpus,
        run,
        f"steps={STEPS}",
        "mesh.data=2",
        "mesh.fsdp=2",
        "mesh.tensor=2",
        "checkpoint.every=0",
        cache=cache,
    )
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    result = run_script(write_config(config, tmp_path / "config.yaml"), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "'data': 2, 'fsdp': 2, 'tensor': 2" in result.stderr and "8 cpu" in result.stderr
    diff = rel_diff(train_losses(run), reference, range(1, 6))
    assert diff <= 1e-4, diff


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_processes_with_jax_distributed_train_and_checkpoint(
    corpus: Path, cache: Path, reference: dict[int, float], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    # data across the two hosts, tensor within each: every host reads its own rows, and
    # both of its devices hold the same rows.
    config = tiny_config(
        corpus,
        run,
        f"steps={STEPS}",
        "mesh.data=2",
        "mesh.fsdp=1",
        "mesh.tensor=2",
        "checkpoint.every=3",
        cache=cache,
    )
    config_file = write_config(config, tmp_path / "config.yaml")
    outputs = _two_processes([sys.executable, str(HERE), "run", str(config_file)])
    assert "4 cpu device(s), 2 process(es)" in outputs[0]
    assert "lemur-train:" not in outputs[1]  # only process 0 reports
    ckpt = Checkpointer(run / "checkpoints")
    assert ckpt.all_steps() == [3, 6]
    ckpt.close()
    # Each host read half of every global batch; together the same records as one host
    # (summed in another order, hence not bitwise).
    diff = rel_diff(train_losses(run), reference, range(1, 6))
    assert diff <= 1e-4, diff
    losses = train_losses(run)

    # Process 1's part of checkpoint 6 truncated: both processes skip it, agree on 3.
    files = sorted(
        (run / "checkpoints/6/state").glob("ocdbt.process_1/d/*"), key=lambda f: f.stat().st_size
    )
    os.truncate(files[-1], files[-1].stat().st_size // 2)
    outputs = _two_processes([sys.executable, "-m", "lemur.train.cli", str(config_file)])
    assert "skipped checkpoint 6" in outputs[0] and "resumed from step 3" in outputs[0]
    assert "Traceback" not in outputs[0] + outputs[1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["3", "6", "6.damaged"]
    assert train_losses(run) == losses


def _two_processes(command: list[str]) -> list[str]:
    """Run `command` as processes 0 and 1 of a jax.distributed job; their outputs."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            command,
            env={
                **os.environ,
                "JAX_PLATFORMS": "cpu",
                "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": str(i),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out
    return outputs


def _script(argv: list[str]) -> None:
    """Subprocess body: train a config file, optionally SIGKILL-ing ourselves at a step."""
    import argparse

    from lemur.train.config import load_train_config
    from lemur.train.loop import train

    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--kill-at", type=int, default=None)
    args = p.parse_args(argv)

    def on_metrics(record: dict) -> None:
        if record["step"] == args.kill_at and "loss" in record:
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no pending save finished

    train(load_train_config(args.config), on_metrics=on_metrics)


if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    _script(sys.argv[2:])

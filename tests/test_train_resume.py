"""Never lose progress: SIGKILL + resume, and SIGTERM (preemption) + resume, give the same
per-step losses as an uninterrupted run, bit for bit.

The SIGKILL run happens in a subprocess (tests/test_train_distributed.py's script mode)
that kills itself right after logging a step, with an async save possibly in flight.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from test_train_distributed import rel_diff, run_script, write_config
from test_train_loop import build_corpus, compile_cache, tiny_config, train_losses

from lemur.train.checkpoint import Checkpointer
from lemur.train.loop import train
from lemur.train.metrics import read_records


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("resume_corpus"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(corpus: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared config trained uninterrupted (30 steps) on one device, in this process."""
    run = tmp_path_factory.mktemp("reference") / "run"
    train(tiny_config(corpus, run, cache=cache))
    return run


def test_sigkill_then_resume_equals_uninterrupted(
    corpus: Path, cache: Path, reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    config = tiny_config(corpus, run, cache=cache)
    result = run_script(write_config(config, tmp_path / "config.yaml"), "--kill-at", "24")
    assert result.returncode == -signal.SIGKILL, result.stdout + result.stderr
    assert max(train_losses(run)) == 24  # died right after logging step 24
    # Step 10 is complete (saving 20 waited for it); 20 may have been cut mid-write, and
    # then resume must ignore its temporary directory.
    ckpt = Checkpointer(run / "checkpoints")
    latest = ckpt.latest_step()
    ckpt.close()
    assert latest in (10, 20)
    summary = train(config)
    assert summary.resumed_from == latest and summary.step == 30
    resumed, expected = train_losses(run), train_losses(reference)
    assert sorted(resumed) == list(range(1, 31))
    # The acceptance bound is 1e-6 relative; on one machine it is bitwise.
    assert rel_diff(resumed, expected, range(1, 31)) <= 1e-6, (resumed, expected)
    assert resumed == expected
    evals = [r for r in read_records(run / "metrics.jsonl") if "eval/code/loss" in r]
    ref_evals = [r for r in read_records(reference / "metrics.jsonl") if "eval/code/loss" in r]
    assert [(r["step"], r["eval/code/loss"], r["eval/text/loss"]) for r in evals] == [
        (r["step"], r["eval/code/loss"], r["eval/text/loss"]) for r in ref_evals
    ]


def test_sigterm_checkpoints_and_stops_then_resumes(
    corpus: Path, cache: Path, reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    config = tiny_config(corpus, run, cache=cache)

    def preempt(record: dict) -> None:
        if record["step"] == 12 and "loss" in record:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends before preempting

    summary = train(config, on_metrics=preempt)
    assert summary.stopped_early and 12 <= summary.step < 30
    ckpt = Checkpointer(run / "checkpoints")
    assert ckpt.latest_step() == summary.step
    ckpt.close()
    resumed = train(config)
    assert resumed.resumed_from == summary.step and resumed.step == 30
    assert train_losses(run) == train_losses(reference)

"""Trainer reliability: damaged checkpoints, corrupt shards, steps behind a checkpoint, and
metrics across a resume. Every bad input is one line and an exit code, never a traceback.

Checkpoints are damaged the way disks and kills damage them, on orbax's real files. Ctrl-C
during set-up is tested in tests/test_train_interrupt.py (subprocesses).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_train_loop import build_corpus, compile_cache, tiny_config, train_losses

from lemur.train.checkpoint import Checkpointer
from lemur.train.cli import main
from lemur.train.config import TrainConfig
from lemur.train.loader import make_train_iterator
from lemur.train.loop import train
from lemur.train.metrics import read_records
from lemur.train.old_loader_state import LAST_COMMIT, content_id_with_build_folder

# Fields of a metrics record that time the run: they differ between any two runs.
TIMING = {"tokens_per_s", "mfu", "step_s", "data_wait_frac", "batch_put_frac", "eval_s"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("rel_corpus"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def finished(corpus: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared config trained to the end: checkpoints at 10, 20, 30."""
    run = tmp_path_factory.mktemp("rel_finished") / "run"
    train(tiny_config(corpus, run, cache=cache))
    return run


def run_cli(
    capsys: pytest.CaptureFixture, config: TrainConfig, *sets: str
) -> tuple[int, list[str]]:
    """`lemur-train CONFIG --set ...` in this process: (exit code, stderr lines)."""
    path = Path(config.run_dir).parent / f"{Path(config.run_dir).name}.yaml"
    path.write_text(config.to_yaml())
    capsys.readouterr()
    code = main([str(path)] + [x for s in sets for x in ("--set", s)])
    return code, capsys.readouterr().err.strip().splitlines()


def the_error(err: list[str], *, in_setup: bool = True) -> str:
    """The one error line: the last, after the set-up line (and records); no traceback."""
    assert err and err[-1].startswith("lemur-train: "), err
    assert all(line.startswith(("lemur-train: ", "step ")) for line in err), err
    if in_setup:
        assert len(err) <= 2, err  # the set-up line ("... params, mesh ...") may come first
    return err[-1]


def copy_run(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


def _truncate_array(step_dir: Path) -> None:
    files = sorted((step_dir / "state").rglob("d/*"), key=lambda p: p.stat().st_size)
    os.truncate(files[-1], files[-1].stat().st_size // 2)  # the largest array file


def _delete_metadata(step_dir: Path) -> None:
    (step_dir / "state/_METADATA").unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated_array": _truncate_array,
    "deleted_metadata": _delete_metadata,
    "deleted_loader_state": lambda d: (d / "data/metadata").unlink(),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_latest_checkpoint_falls_back_to_the_previous(
    damage: str,
    finished: Path,
    corpus: Path,
    cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    run = copy_run(finished, tmp_path)
    DAMAGE[damage](run / "checkpoints/30")
    code, err = run_cli(capsys, tiny_config(corpus, run, cache=cache))
    text = "\n".join(err)
    assert code == 0 and "Traceback" not in text, text
    skipped = [line for line in err if "skipped checkpoint 30" in line]
    assert len(skipped) == 1 and "30.damaged" in skipped[0], err
    assert "resumed from step 20" in text
    # Moved aside (never deleted), and the run continued exactly as the uninterrupted one.
    assert (run / "checkpoints/30.damaged").is_dir()
    assert train_losses(run) == train_losses(finished)
    ckpt = Checkpointer(run / "checkpoints")
    assert ckpt.all_steps() == [10, 20, 30]
    ckpt.close()


def test_damaged_checkpoint_through_the_cli_prints_no_traceback(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path
) -> None:
    run = copy_run(finished, tmp_path)
    _truncate_array(run / "checkpoints/30")
    (run / "checkpoints/999").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(tiny_config(corpus, run, cache=cache).to_yaml())
    # A real process: orbax's leftovers of the failed read (pending coroutines, callbacks
    # into its closed event loop) would print tracebacks at any later moment, exit included.
    result = subprocess.run(
        [sys.executable, "-m", "lemur.train.cli", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    err = result.stderr.strip().splitlines()
    assert result.returncode == 0, result.stderr
    assert all(line.startswith(("lemur-train: ", "step ")) for line in err), result.stderr
    assert [line.split(" (")[0] for line in err if "skipped" in line] == [
        "lemur-train: skipped checkpoint 999",
        "lemur-train: skipped checkpoint 30",
    ]
    assert "resumed from step 20" in result.stderr


def test_an_empty_step_directory_is_skipped(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = copy_run(finished, tmp_path)
    (run / "checkpoints/999").mkdir()
    code, err = run_cli(capsys, tiny_config(corpus, run, cache=cache))
    text = "\n".join(err)
    assert code == 0 and "Traceback" not in text, text
    assert "skipped checkpoint 999" in text and "nothing to train" in text, text
    assert (run / "checkpoints/999.damaged").is_dir()


def test_no_checkpoint_restores_is_one_line_exit_2(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = copy_run(finished, tmp_path)
    for step in (10, 20, 30):
        _truncate_array(run / "checkpoints" / str(step))
    code, err = run_cli(capsys, tiny_config(corpus, run, cache=cache))
    line = the_error(err)
    assert code == 2 and "no checkpoint" in line, err
    for step in (10, 20, 30):
        assert f"{step}: " in line, err
    # Nothing was moved: the user decides what to do with them.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["10", "20", "30"]


def test_resume_on_shards_of_another_vocab_is_one_line(
    finished: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    other = build_corpus(tmp_path / "other", vocab=700)
    run = copy_run(finished, tmp_path)
    code, err = run_cli(capsys, tiny_config(other, run, cache=cache))
    line = the_error(err)
    assert code == 2 and "vocab_size 600" in line and "model 700" in line, err
    assert (run / "checkpoints/30").is_dir() and not list(run.glob("checkpoints/*.damaged"))


def test_loader_state_of_another_pipeline_names_the_setting(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = copy_run(finished, tmp_path)
    config = tiny_config(corpus, run, "steps=32", cache=cache)
    code, err = run_cli(capsys, config, "data.seed=5")
    line = the_error(err)
    assert code == 2 and "--set data.strict_state=false" in line, err
    assert "strict_state=False" not in line  # the Python argument means nothing to a CLI user
    code, err = run_cli(capsys, config, "data.seed=5", "data.strict_state=false")
    assert code == 0, err
    assert max(train_losses(run)) == 32


def test_loader_state_saved_before_the_build_folder_left_the_ids_is_one_line(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A run checkpointed by lemur before 2026-11-25, whose loader ids held `build-<id>/`: its
    # shuffle order is gone, so resuming is refused, naming the two ways on.
    run = copy_run(finished, tmp_path)
    config = tiny_config(corpus, run, "steps=32", cache=cache)
    [saved] = [
        p
        for p in (run / "checkpoints/30/data").rglob("*")
        if p.is_file() and "fingerprint" in p.read_text()
    ]
    state = json.loads(saved.read_text())
    it = make_train_iterator(
        corpus, seq_len=32, batch_size=8, seed=config.data_seed, process_index=0, process_count=1
    )
    assert it.fingerprint == state["fingerprint"]  # the run's own pipeline, rebuilt here
    ids = [content_id_with_build_folder(s.shards) for s in it.identity.sources]
    saved.write_text(json.dumps({**state, "fingerprint": it.identity.fingerprint(ids)}))
    code, err = run_cli(capsys, config)
    line = the_error(err)
    assert code == 2 and "saved by lemur before 2026-11-25" in line, err
    assert f"at commit {LAST_COMMIT}" in line and "--set data.strict_state=false" in line, err
    code, err = run_cli(capsys, config, "data.strict_state=false")
    assert code == 0, err
    assert max(train_losses(run)) == 32


def test_steps_below_the_latest_checkpoint(
    finished: Path, corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = copy_run(finished, tmp_path)
    code, err = run_cli(capsys, tiny_config(corpus, run, "steps=25", cache=cache))
    line = the_error(err)
    assert code == 2 and "steps (25)" in line and "step 30" in line, err
    # Equal: the run is finished; say so and exit 0.
    code, err = run_cli(capsys, tiny_config(corpus, run, cache=cache))
    assert code == 0 and any("nothing to train" in line for line in err), err
    assert train_losses(run) == train_losses(finished)


# ---------------------------------------------------------------------- corrupt shards


def _train_shard(directory: Path) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text())
    return next(s for s in manifest["shards"] if s["split"] == "train")


def test_corrupt_middle_index_entry_is_refused_at_start(
    corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = _train_shard(bad)
    ends = np.fromfile(bad / shard["index"], "<u8")
    ends[len(ends) // 2] = ends[-1] + 10_000  # past the shard's end, mid-index
    ends.tofile(bad / shard["index"])
    code, err = run_cli(capsys, tiny_config(bad, tmp_path / "run", cache=cache))
    assert code == 2 and len(err) == 1, err
    assert shard["index"] in err[0] and f"entry {len(ends) // 2}" in err[0], err
    assert not (tmp_path / "run/checkpoints").exists()


def test_token_ids_beyond_the_vocab_are_refused_at_start(
    corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    shard = _train_shard(bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    tokens = np.fromfile(bad / shard["file"], manifest["dtype"])
    tokens[100] = 60_000  # vocab is 600; the sample always reads the shard's start
    tokens.tofile(bad / shard["file"])
    code, err = run_cli(capsys, tiny_config(bad, tmp_path / "run", cache=cache))
    assert code == 2 and len(err) == 1, err
    assert shard["file"] in err[0] and "token id 60000 at offset 100" in err[0], err


def test_token_ids_the_sample_missed_stop_the_run_naming_the_shard(
    corpus: Path, cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from lemur.shards import check as data

    bad = tmp_path / "bad"
    shutil.copytree(corpus, bad)
    manifest = json.loads((bad / "manifest.json").read_text())
    for shard in manifest["shards"]:
        if shard["split"] != "train":
            continue
        tokens = np.fromfile(bad / shard["file"], manifest["dtype"])
        # Every id outside the blocks the start-up sample reads is out of range.
        sampled = np.zeros(len(tokens), bool)
        for start in np.linspace(
            0, max(len(tokens) - data.SAMPLE_LEN, 0), data.SAMPLE_BLOCKS
        ).astype(np.int64):
            sampled[start : start + data.SAMPLE_LEN] = True
        tokens[~sampled] = 60_000
        tokens.tofile(bad / shard["file"])
    code, err = run_cli(capsys, tiny_config(bad, tmp_path / "run", cache=cache))
    line = the_error(err, in_setup=False)
    # Usually step 1 and id 60000; once under heavy load the run stopped at step 5 naming
    # an id that was never planted (to investigate): the contract is one line naming the
    # shard and an id beyond the vocabulary, never "loss is nan".
    m = re.match(r"lemur-train: step (\d+): .*\.bin: token id (\d+) at offset", line)
    assert code == 2 and m and int(m.group(2)) >= 600, err
    assert "vocab_size 600" in line, err


# ---------------------------------------------------------------------- metrics on resume


def _strip(path: Path) -> list[dict]:
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses: none torn or glued
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


INTERVALS = ("steps=30", "log.every=4", "checkpoint.every=5", "checkpoint.keep=10", "eval.every=9")


def test_resumed_metrics_equal_an_uninterrupted_run_line_for_line(
    corpus: Path, cache: Path, tmp_path: Path
) -> None:
    reference = tmp_path / "reference"
    train(tiny_config(corpus, reference, *INTERVALS, cache=cache))
    expected = _strip(reference / "metrics.jsonl")
    assert [r["step"] for r in expected if "loss" in r] == [4, 8, 12, 16, 20, 24, 28, 30]

    # A kill: the run logged to step 28 and died writing a record; checkpoint 10 (not a
    # multiple of log.every) is the newest complete one.
    killed = tmp_path / "killed"
    shutil.copytree(reference, killed)
    for step in (15, 20, 25, 30):
        shutil.rmtree(killed / "checkpoints" / str(step))
    with open(killed / "metrics.jsonl", "a") as f:
        f.write('{"step": 29, "lo')
    summary = train(tiny_config(corpus, killed, *INTERVALS, cache=cache))
    assert summary.resumed_from == 10
    assert _strip(killed / "metrics.jsonl") == expected

    # A preemption (SIGTERM) after step 13: checkpoint 13, no extra eval record.
    stopped = tmp_path / "stopped"

    def preempt(record: dict) -> None:
        if record["step"] == 12 and "loss" in record:
            os.kill(os.getpid(), signal.SIGTERM)

    first = train(tiny_config(corpus, stopped, *INTERVALS, cache=cache), on_metrics=preempt)
    assert first.stopped_early and first.step == 13
    train(tiny_config(corpus, stopped, *INTERVALS, cache=cache))
    assert _strip(stopped / "metrics.jsonl") == expected


def test_truncate_after_drops_a_torn_line(tmp_path: Path) -> None:
    from lemur.train.metrics import MetricsWriter

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.truncate_after(5)  # nothing past step 5, but the torn line must go
    writer.write({"step": 3, "loss": 1.0})
    assert [r["step"] for r in read_records(path)] == [1, 2, 3]
    assert path.read_text().endswith('{"step": 3, "loss": 1.0}\n')

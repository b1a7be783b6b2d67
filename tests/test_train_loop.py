"""lemur.train.loop on a tiny real corpus: the loss falls, evals per domain, metrics, plots,
a diverging run stops with its last checkpoint intact, setup errors are one line.

`build_corpus` and `tiny_config` are shared with tests/test_train_distributed.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from lemur.train.checkpoint import Checkpointer
from lemur.train.cli import main
from lemur.train.config import TrainConfig, apply_overrides, config_from_dict
from lemur.train.errors import RunError, TrainingDiverged
from lemur.train.loop import Hook, train
from lemur.train.metrics import read_records


def build_corpus(root: Path, vocab: int = 600) -> Path:
    """A real two-domain shard directory (stdlib code + pydoc text, `vocab` tokens): ~3 s.

    Built by `lemur-data build` in a subprocess: the build forks workers, and forking a
    process that already runs JAX's threads can deadlock. The recipe's paths are relative
    to `root` (the build runs there), so the shards are the same bytes wherever pytest's
    temporary folder is: a recipe naming another folder is another recipe, whose seeded
    choices differ, and the loss thresholds below were met or missed by the folder's name.
    """
    import conftest

    code = root / "code"
    code.mkdir(parents=True)
    for p in conftest.real_python_files(40):
        (code / p.name).write_bytes(p.read_bytes())
    conftest.write_jsonl(root / "text.jsonl", conftest.real_text_docs(60))
    recipe = root / "recipe.yaml"
    raw = conftest.base_recipe(
        Path("."), Path("code"), [Path("text.jsonl")], filters=conftest.NO_FILTERS
    )
    raw["tokenizer"]["train"]["vocab_size"] = vocab
    recipe.write_text(yaml.safe_dump(raw))
    result = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", recipe.name],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert result.returncode == 0, result.stderr
    return root / "out"


def tiny_config(
    data_dir: Path, run_dir: Path, *overrides: str, cache: Path | None = None
) -> TrainConfig:
    """A 2-layer d_model 32 model, batch 8 x 32 in 2 microbatches, every step logged.

    Tests share this one config where they can: the schedule's constants are compiled into
    the step, so every other steps/lr value costs a compile (seconds on 2 busy cores).
    """
    raw = {
        "run_dir": str(run_dir),
        "seed": 0,
        "steps": 30,
        "compile_cache_dir": None if cache is None else str(cache),
        "model": {
            "preset": "tiny",
            "overrides": {
                "d_model": 32,
                "n_heads": 4,
                "n_kv_heads": 2,
                "d_ff": 64,
                "max_seq_len": 64,
            },
        },
        "data": {"dirs": [str(data_dir)]},
        "batch": {"size": 8, "seq_len": 32, "microbatches": 2},
        # decay_steps pinned: runs of fewer steps share the schedule (and the compiled step).
        "schedule": {"peak_lr": 1e-2, "warmup_steps": 3, "decay_steps": 30},
        "checkpoint": {"every": 10, "keep": 3},
        "eval": {"every": 15, "batches": 2, "at_start": True},
        "log": {"every": 1, "progress": False, "tensorboard": False, "peak_tflops": 0.1},
    }
    return config_from_dict(apply_overrides(raw, list(overrides)))


def train_losses(run_dir: Path) -> dict[int, float]:
    """Per-step train losses from a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_records(run_dir / "metrics.jsonl") if "loss" in r}


def compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One persistent compilation cache for every test process of this pytest session."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is a child of the session's directory.
    session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return session / "lemur-jax-cache"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("train_corpus"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def finished_run(
    corpus: Path, cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict]]:
    """The shared config trained to the end (30 steps), with every record it emitted."""
    run = tmp_path_factory.mktemp("finished") / "run"
    seen: list[dict] = []
    summary = train(tiny_config(corpus, run, cache=cache), on_metrics=seen.append)
    assert summary.step == 30 and not summary.stopped_early and summary.resumed_from is None
    return run, seen


def test_loss_falls_on_real_shards_with_evals_metrics_and_plots(
    finished_run: tuple[Path, list[dict]], corpus: Path, cache: Path
) -> None:
    run, seen = finished_run
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, 31))
    first, last = losses[1], np.mean([losses[s] for s in range(26, 31)])
    assert first == pytest.approx(math.log(600), abs=0.3)  # uniform over the 600-token vocab
    assert last < first - 1.0, losses
    # Code and text are evaluated separately, at the start, every 15 steps and at the end.
    evals = [r for r in read_records(run / "metrics.jsonl") if "eval/code/loss" in r]
    assert [r["step"] for r in evals] == [0, 15, 30]
    assert all("eval/text/loss" in r for r in evals)
    assert evals[-1]["eval/code/loss"] < evals[0]["eval/code/loss"] - 1.0
    record = next(r for r in seen if r["step"] == 30 and "loss" in r)
    assert record["tokens_per_s"] > 0 and 0 < record["mfu"] and record["tokens_seen"] == 30 * 256
    assert 0 < record["lr"] < 1e-2 and 0 < record["valid_tokens"] <= 256
    # Checkpoints at 10, 20, 30 with the loader position (records consumed by the job).
    ckpt = Checkpointer(run / "checkpoints")
    assert ckpt.all_steps() == [10, 20, 30]
    ckpt.close()
    assert (
        json.loads((run / "checkpoints/30/data/metadata").read_text())["global_next_index"]
        == 30 * 8
    )
    assert (run / "config.yaml").is_file()
    # A finished run resumed does nothing more; with resume off it refuses to overwrite.
    assert train(tiny_config(corpus, run, cache=cache)).step == 30
    assert train_losses(run) == losses
    with pytest.raises(RunError, match="checkpoint.resume"):
        train(tiny_config(corpus, run, "checkpoint.resume=false", cache=cache))
    assert main(["plot", str(run)]) == 0
    for name in ("loss.png", "lr.png", "throughput.png"):
        assert (run / "plots" / name).stat().st_size > 5000


def test_divergence_stops_with_last_checkpoint_intact(
    finished_run: tuple[Path, list[dict]],
    corpus: Path,
    cache: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    import shutil

    from lemur.train.loop import Trainer

    run = tmp_path / "run"
    shutil.copytree(finished_run[0], run)
    good = Trainer(tiny_config(corpus, run, cache=cache))
    ckpt = Checkpointer(run / "checkpoints")
    before, _, _ = ckpt.restore(30, _target(good))
    ckpt.close()
    # The finished run continued with an absurd learning rate blows up at once.
    bad = ["steps=34", "schedule.peak_lr=1e30", "checkpoint.every=1"]
    with pytest.raises(
        TrainingDiverged,
        match=r"step 31: .* is (nan|inf).*last checkpoint: "
        r"step 30",
    ):
        train(tiny_config(corpus, run, *bad, cache=cache))
    ckpt = Checkpointer(run / "checkpoints")
    assert ckpt.latest_step() == 30
    after, _, _ = ckpt.restore(30, _target(good))
    ckpt.close()
    for a, b in zip(_leaves(before), _leaves(after), strict=True):
        assert np.isfinite(a).all() and np.array_equal(a, b)
    # Through the CLI: exit 1 and one line naming the step.
    capsys.readouterr()
    code = main([str(run / "config.yaml")] + [x for o in bad for x in ("--set", o)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("lemur-train: step 31:"), err


def _target(trainer: object) -> object:
    return trainer.layout.target()  # type: ignore[attr-defined]


def _leaves(state: object) -> list[np.ndarray]:
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(state)]


def test_setup_errors_are_one_line(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cases = [
        (["data.dirs=" + str(tmp_path / "missing")], "manifest"),
        (["model.vocab_size=1000"], "vocab_size"),
        (["mesh.data=3"], "mesh"),
        (["batch.size=6", "batch.microbatches=4"], "batch.microbatches"),
        (["model.init_from=" + str(tmp_path / "nope")], "model.init_from"),
        (["run_dir=" + str(tmp_path / "c.yaml")], "run_dir"),  # a file, not a directory
        (["checkpoint.dir=" + str(tmp_path / "c.yaml")], "checkpoint.dir"),
    ]
    for overrides, needle in cases:
        config_file = tmp_path / "c.yaml"
        config_file.write_text(tiny_config(corpus, tmp_path / "r").to_yaml())
        args = [str(config_file)] + [x for o in overrides for x in ("--set", o)]
        assert main(args) == 2, overrides
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("lemur-train: ") and needle in err[0], err


def test_init_from_a_converted_checkpoint(corpus: Path, cache: Path, tmp_path: Path) -> None:
    import jax

    from lemur.model.checkpoint import save_params
    from lemur.model.config import param_shapes
    from lemur.train.loop import Trainer

    config = tiny_config(corpus, tmp_path / "run", cache=cache)
    model = config.model.llama(600)
    rng = np.random.default_rng(3)
    params = jax.tree.map(
        lambda s: rng.standard_normal(s).astype(np.float32),
        param_shapes(model),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    save_params(tmp_path / "pretrained", params, model)
    trainer = Trainer(
        tiny_config(
            corpus, tmp_path / "run", f"model.init_from={tmp_path / 'pretrained'}", cache=cache
        )
    )
    first = trainer.initial_state()
    state, start, resumed = first.state, first.step, first.resumed_from
    trainer.checkpointer.close()
    assert (start, resumed, int(state["step"])) == (0, None, 0)
    for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
    # A checkpoint of another shape is refused, naming the field.
    save_params(tmp_path / "other", params, model)
    (tmp_path / "other/config.json").write_text(
        (tmp_path / "other/config.json").read_text().replace('"d_model": 32', '"d_model": 48')
    )
    with pytest.raises(RunError, match="has d_model 48, the config gives 32"):
        Trainer(
            tiny_config(
                corpus, tmp_path / "run2", f"model.init_from={tmp_path / 'other'}", cache=cache
            )
        )


def test_evals_report_bits_per_byte_by_hand(
    finished_run: tuple[Path, list[dict]], corpus: Path
) -> None:
    """eval/<domain>/bpb = summed NLL / ln 2 / UTF-8 bytes of the scored target text."""
    import sentencepiece as spm

    from lemur.train.loader import make_eval_iterators

    run, _ = finished_run
    config = tiny_config(corpus, run)
    last = [r for r in read_records(run / "metrics.jsonl") if "eval/code/loss" in r][-1]
    manifest = json.loads((corpus / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(corpus / manifest["tokenizer"]["file"]))
    streams = make_eval_iterators(
        corpus,
        seq_len=config.batch.seq_len,
        batch_size=config.eval_batch_size,
        max_batches=config.eval.batches,
    )
    for domain, stream in streams.items():
        n_tokens = n_bytes = 0
        for batch in stream:
            for targets, mask in zip(batch["targets"], batch["loss_mask"], strict=True):
                scored = targets[mask.astype(bool)]
                n_tokens += scored.size
                # lemur's tokenizer has no dummy prefix: the decoded pieces are the text
                n_bytes += len(sp.decode(scored.tolist()).encode())
        loss = last[f"eval/{domain}/loss"]
        expected = loss * n_tokens / math.log(2) / n_bytes
        assert last[f"eval/{domain}/bpb"] == pytest.approx(expected, rel=1e-9), domain
        assert 0 < expected < loss / math.log(2)  # more than one byte per token


def test_the_record_and_the_closing_line_label_their_two_losses() -> None:
    # For the same step the record shows the mean over the window, the closing line that
    # step's own loss: two numbers, so each says which it is.
    from lemur.train.cli import closing_line
    from lemur.train.metrics import format_record
    from lemur.train.setup import RunSummary

    record = {
        "step": 20,
        "loss": 4.5,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "tokens_per_s": 9.0,
        "mfu": 0.1,
    }
    assert "step     20  mean loss 4.5000  lr" in format_record(record)
    summary = RunSummary(
        step=20, loss=4.25, evals={"code": 4.0}, resumed_from=None, stopped_early=False, run_dir="r"
    )
    assert closing_line(summary, 7385.0) == (
        "lemur-train: step 20  last step's loss 4.2500  val code 4.0000  in 2h03m  (r)"
    )


def test_train_lines_give_elapsed_time_and_eta(capsys: pytest.CaptureFixture) -> None:
    """In a log file (no bar), each train record says how long the run has trained and how
    long it has left, at the rate of this process's steps (#44 item 9)."""
    from lemur.train.metrics import Reporter

    now = [100.0]
    reporter = Reporter(100, 0, clock=lambda: now[0])
    record = {"lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 9.0, "mfu": 0.1}
    reporter.step(40)  # resumed at step 40: the rate counts this run's steps only
    now[0] += 65.0
    reporter.record({"step": 50, "loss": 4.5, **record})
    now[0] += 3000.0
    reporter.record({"step": 100, "loss": 4.0, **record})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("MFU 10.0%  1m05s elapsed  ETA 5m25s"), lines
    assert lines[1].endswith("MFU 10.0%  51m05s elapsed"), lines


def test_a_hook_is_due_by_count_at_the_last_step_and_at_a_stop_when_named_so() -> None:
    """Hook's two flags are named where a hook is made (#35: `Hook(f, n, False, True)`)."""
    evals = Hook(print, 10, pauses_clock=True)
    saves = Hook(print, 10, on_stop=True)
    assert evals.pauses_clock and not evals.on_stop
    assert [s for s in (7, 10, 13, 40) if evals.due(s, 40, stop=s == 13)] == [10, 40]
    assert [s for s in (7, 10, 13, 40) if saves.due(s, 40, stop=s == 13)] == [10, 13, 40]
    with pytest.raises(TypeError):
        Hook(print, 10, False, True)  # type: ignore[misc]


def test_tensorboard_is_written_when_installed_and_said_when_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`log.tensorboard` defaults to "when installed", and the run says when it writes no
    events; asked for explicitly without a writer installed, the run refuses up front
    (the base install has none, and wrote no events without a word) (#44 item 12)."""
    from lemur.train import metrics
    from lemur.train.config import LogConfig

    assert LogConfig().tensorboard is None
    monkeypatch.setattr(metrics, "tensorboard_available", lambda: False)
    assert metrics.MetricsWriter(tmp_path, tensorboard=None).note == (
        "lemur-train: no TensorBoard events (neither tensorboardX nor torch's tensorboard is "
        "installed: pip install tensorboardX); metrics.jsonl holds every record"
    )
    assert metrics.MetricsWriter(tmp_path, tensorboard=False).note is None
    with pytest.raises(RunError) as e:
        metrics.MetricsWriter(tmp_path, tensorboard=True)
    assert str(e.value) == (
        "log.tensorboard: true, but neither tensorboardX nor torch's tensorboard is "
        "installed: pip install tensorboardX, or set log.tensorboard: false"
    )
    assert not (tmp_path / "tensorboard").exists()

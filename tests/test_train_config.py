"""lemur.train.config and the CLI's config handling: shipped configs, overrides, bad configs,
paths stored absolute."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lemur.train.cli import main
from lemur.train.config import (
    CONFIGS_DIR,
    ConfigError,
    TrainConfig,
    config_from_dict,
    load_train_config,
    shipped_configs,
    with_absolute_paths,
    with_steps,
)


def test_shipped_configs_include_the_presets() -> None:
    assert {"tiny", "demo", "lemur-70b", "llama-1b"} <= set(shipped_configs())


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))
def test_every_shipped_config_parses_and_round_trips(name: str) -> None:
    config = load_train_config(name)
    assert isinstance(config, TrainConfig)
    # The resolved YAML loads back to the same config, and names every key.
    again = config_from_dict(yaml.safe_load(config.to_yaml()))
    assert again == config
    raw = yaml.safe_load((CONFIGS_DIR / f"{name}.yaml").read_text())
    assert set(raw) <= set(config.to_dict())


def test_lemur_70b_is_the_paper_recipe() -> None:
    c = load_train_config("lemur-70b")
    assert c.model.preset == "llama2-70b" and c.model.vocab_size == 32000
    assert c.model.init_from  # continued pre-training from converted Llama-2-70B weights
    assert (c.batch.size, c.batch.seq_len) == (1024, 4096) and c.tokens_per_step == 4 * 2**20
    assert (c.optimizer.b1, c.optimizer.b2, c.optimizer.grad_clip) == (0.9, 0.95, 1.0)
    s = c.schedule
    assert (s.peak_lr, s.warmup_steps, s.decay, s.final_lr_ratio) == (4e-5, 2000, "cosine", 0.1)
    assert c.steps * c.tokens_per_step == pytest.approx(90e9, rel=1e-4)  # 90B tokens
    llama = c.model.llama()
    assert (llama.d_model, llama.n_layers, llama.n_kv_heads) == (8192, 80, 8)


def test_tiny_preset_is_small() -> None:
    c = load_train_config("tiny")
    llama = c.model.llama(600)
    assert llama.d_model <= 64 and llama.n_layers == 2 and llama.vocab_size == 600


def test_overrides_types_and_lists() -> None:
    c = load_train_config(
        "tiny",
        [
            "steps=7",
            "schedule.peak_lr=4e-5",
            "data.dirs=some/dir",
            "model.overrides.d_model=32",
            "mesh.fsdp=2",
            "mesh.data=-1",
            "data.weights=[1]",
            "eval.batches=null",
        ],
    )
    assert c.steps == 7 and c.schedule.peak_lr == 4e-5  # YAML 1.1 reads 4e-5 as a string
    assert c.data.dirs == ["some/dir"] and c.data.weights == [1.0]
    assert c.model.llama(100).d_model == 32 and c.eval.batches is None
    assert (c.mesh.data, c.mesh.fsdp) == (-1, 2)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optimizer.b3=1"], "unknown key 'optimizer.b3'"),
        (["stepz=1"], "unknown key 'stepz'"),
        (["steps=ten"], "steps must be an integer"),
        (["steps=1.5"], "steps must be an integer"),
        (["log.progress=maybe"], "log.progress must be true or false"),
        (["batch=4"], "batch must be a mapping"),
        (["schedule.decay=exp"], "schedule.decay must be one of"),
        (["mesh.data=-1", "mesh.fsdp=-1"], "mesh may use -1 on one axis only"),
        (["batch.size=6", "batch.microbatches=4"], "batch.microbatches (4) must divide"),
        (["model.preset=llama9"], "model.preset must be one of"),
        (["model.overrides.n_heads=3"], "model"),
        (["model.overrides.vocab_size=8"], "model.overrides.vocab_size"),
        (["model.overrides.dtype=int8"], "dtype"),
        (["data.weights=[1, 2]"], "data.weights has 2 entries"),
        (["batch.seq_len=4096"], "exceeds the model's max_seq_len"),
        (["optimizer.b2=1"], "optimizer.b2 must be in [0, 1)"),
        (["steps"], "expected KEY=VALUE"),
        # Non-finite numbers: refused at validation, naming the key (not an OverflowError later).
        (
            ["data.dirs=[a, b]", "data.weights=[.inf, 1]"],
            "data.weights[0] must be a finite number, got inf",
        ),
        (["schedule.peak_lr=.nan"], "schedule.peak_lr must be a finite number, got nan"),
        (["optimizer.eps=-.inf"], "optimizer.eps must be a finite number, got -inf"),
        (["log.peak_tflops=inf"], "log.peak_tflops must be a finite number"),
        (["steps=inf"], "steps must be an integer, got 'inf'"),
        (["eval.batches=.nan"], "eval.batches must be an integer"),
    ],
)
def test_bad_configs_name_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_train_config("tiny", overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["tiny", "--set", "optimizer.b3=1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "lemur-train: config: unknown key 'optimizer.b3' (known: b1, b2, eps, "
        "grad_clip, weight_decay)"
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1\n")
    assert main([str(bad)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["no-such-config"]) == 2
    assert "no such file or shipped config" in capsys.readouterr().err
    # Through the installed entry point: no traceback.
    result = subprocess.run(
        [sys.executable, "-m", "lemur.train.cli", "tiny", "--set", "steps=x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "lemur-train: config: steps must be an integer, got 'x'"
    assert main(["tiny", "--set", "data.weights=[.inf]"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "lemur-train: config: data.weights[0] must be a finite number, got inf"
    ]


def test_dry_run_prints_the_resolved_config(capsys: pytest.CaptureFixture) -> None:
    assert main(["lemur-70b", "--dry-run", "--set", "steps=10"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["steps"] == 10 and resolved["optimizer"]["b2"] == 0.95
    assert "# parameters: 68,976,648,192" in out and "# tokens per step: 4,194,304" in out


def test_every_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_train_config(
        "tiny",
        [
            "run_dir=runs/x",
            "compile_cache_dir=../cache",
            "model.init_from=ckpt/base",
            "data.dirs=[out/a, /abs/b]",
            "data.eval_dirs=[out/./val]",
            "checkpoint.dir=~/ckpts",
        ],
    )
    got = with_absolute_paths(config)
    assert got.run_dir == str(tmp_path / "runs" / "x")
    assert got.compile_cache_dir == str(tmp_path.parent / "cache")
    assert got.model.init_from == str(tmp_path / "ckpt" / "base")
    assert got.data.dirs == [str(tmp_path / "out" / "a"), "/abs/b"]
    assert got.data.eval_dirs == [str(tmp_path / "out" / "val")]
    assert got.checkpoint.dir == os.path.expanduser("~/ckpts")
    assert with_absolute_paths(got) == got  # what a run stores stays as it is
    unset = with_absolute_paths(load_train_config("tiny"))
    assert unset.model.init_from is None and unset.checkpoint.dir is None
    assert unset.data.eval_dirs is None and unset.compile_cache_dir is None


def test_with_steps_counts_epochs_and_the_warmup_fraction_in_steps() -> None:
    """The one place after validation that sets steps and warmup (#35): the trainer's start-up
    and `plan` both go through it."""
    by_epochs = load_train_config("continue")  # epochs: 1, warmup_fraction: 0.03
    assert by_epochs.steps is None and by_epochs.schedule.warmup_steps is None
    run = with_steps(by_epochs, 1000)
    assert (run.steps, run.epochs) == (1000, None)
    assert (run.schedule.warmup_steps, run.schedule.warmup_fraction) == (30, None)
    tiny = load_train_config("tiny")  # steps and warmup_steps given: only steps changes
    assert with_steps(tiny, 7) == dataclasses.replace(tiny, steps=7)
    default = load_train_config(None)  # neither of either pair: validation's defaults
    assert (default.steps, default.schedule.warmup_steps) == (1000, 2000)

"""Steps of an end-to-end continued pre-training shared by the e2e tests: `lemur-data build`
with `tokenizer: {hf: FOLDER}` and two steps of `lemur-train continue` from that folder, each
through its command's `main()` in this process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from conftest import NO_FILTERS

from lemur.data import cli as data_cli
from lemur.train import cli as train_cli


def build_corpus(root: Path, tokenizer: Path, sources: list[dict], **keys) -> Path:
    """`lemur-data build` of a recipe file over `sources`; the shard directory."""
    recipe = {
        "output": str(root / "data"),
        "seed": 3,
        "seq_len": 64,
        "tokenizer": {"hf": str(tokenizer)},
        "filters": NO_FILTERS,
        "pii": {"enabled": False},
        "dedup": {"exact": False, "near": False},
        "executor": {"kind": "local", "tasks": 1, "workers": 1},
        "sources": sources,
        **keys,
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    assert data_cli.main(["build", str(path)]) == 0
    return root / "data"


def train_two_steps(hf_folder: Path, data: Path, run: Path) -> Path:
    """`lemur-train continue` from the HF folder: 2 steps of 2 x 64 tokens; the run dir."""
    sets = {
        "model.init_from": hf_folder,
        # fp32 without scan or remat: the shipped bf16/scan/remat step compiles 2x slower here.
        "model.overrides": "{dtype: float32}",
        "data.dirs": f"[{data}]",
        "run_dir": run,
        "steps": 2,
        "batch.size": 2,
        "batch.seq_len": 64,
        "schedule.warmup_steps": 0,
        "schedule.peak_lr": 1e-2,
        "checkpoint.every": 0,
        "eval.batches": 1,
        "log.every": 1,
        "log.progress": "false",
        "log.tensorboard": "false",
    }
    argv = ["continue", *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))]
    assert train_cli.main(argv) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    assert sorted(losses) == [1, 2] and all(np.isfinite(v) for v in losses.values())
    return run

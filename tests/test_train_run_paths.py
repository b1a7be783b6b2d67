"""lemur.train.run_paths: every path of a run's config is stored absolute."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lemur.train.config import load_train_config
from lemur.train.run_paths import with_absolute_paths


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

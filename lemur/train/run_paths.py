"""A run's paths made absolute when it starts, as its `config.yaml` and checkpoints hold them.

A run is read later from other working directories (`lemur-eval`, `lemur-convert from-run`
find the tokenizer in its first data directory): a path relative to where it was started
would point elsewhere, or nowhere, from there.
"""

from __future__ import annotations

import dataclasses
import os

from lemur.train.config import TrainConfig


def absolute(path: str) -> str:
    """`path` made absolute against the working directory (`~` expanded; a URL as it is)."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def with_absolute_paths(config: TrainConfig) -> TrainConfig:
    """The config with every path absolute: run_dir, compile_cache_dir, model.init_from,
    data.dirs, data.eval_dirs and checkpoint.dir."""
    data, model, ckpt = config.data, config.model, config.checkpoint
    return dataclasses.replace(
        config,
        run_dir=absolute(config.run_dir),
        compile_cache_dir=config.compile_cache_dir and absolute(config.compile_cache_dir),
        model=dataclasses.replace(model, init_from=model.init_from and absolute(model.init_from)),
        data=dataclasses.replace(
            data,
            dirs=[absolute(d) for d in data.dirs],
            eval_dirs=None if data.eval_dirs is None else [absolute(d) for d in data.eval_dirs],
        ),
        checkpoint=dataclasses.replace(ckpt, dir=ckpt.dir and absolute(ckpt.dir)),
    )

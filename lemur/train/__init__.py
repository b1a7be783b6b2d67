"""Training (`lemur-train`): config, mesh, jitted step, loop, checkpoints, metrics, and the
Grain streams over shard directories.

| module | what it holds |
|---|---|
| `config` | `TrainConfig` and its sections, `load_config` |
| `loop`, `inputs`, `resume`, `setup` | `Trainer`, `train`; its data, start state, errors |
| `step`, `mesh` | schedule, optimizer, the train/eval step; devices, mesh, global batches |
| `windows`, `train_stream`, `eval_stream` | windows of shards; the train and eval streams |
| `checkpoint`, `metrics`, `progress`, `plot`, `interrupt` | run state on disk and its reporting |

The names below are importable from `lemur.train` directly, each loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "config",
    "ConfigError": "config",
    "load_config": "config",
    "Trainer": "loop",
    "train": "loop",
    "RunError": "setup",
    "TrainingDiverged": "setup",
    "make_train_iterator": "train_stream",
    "make_eval_iterators": "eval_stream",
    "ShardSource": "windows",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module that defines `name` on first access."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lemur.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lemur.train.{_EXPORTS[name]}"), name)

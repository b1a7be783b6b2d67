"""Training (`lemur-train`): config, mesh, jitted step, loop, checkpoints, metrics, and the
Grain streams over shard directories.

| module | what it holds |
|---|---|
| `config`, `run_paths` | `TrainConfig`, its sections, `load_train_config`; paths made absolute |
| `loop`, `inputs`, `resume`, `setup` | `Trainer`, `train`; its data, start state, errors |
| `step`, `mesh` | schedule, optimizer, the train/eval step; devices, mesh, global batches |
| `train_stream`, `eval_stream` | the train and eval streams (over lemur.shards.windows) |
| `checkpoint`, `metrics`, `progress`, `plot`, `interrupt` | run state on disk and its reporting |

The names below are importable from `lemur.train` directly, each loaded on first use.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "TrainConfig": "config",
    "ConfigError": "config",
    "load_train_config": "config",
    "Trainer": "loop",
    "train": "loop",
    "RunError": "setup",
    "TrainingDiverged": "setup",
    "make_train_iterator": "train_stream",
    "make_eval_iterators": "eval_stream",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

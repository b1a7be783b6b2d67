"""Training (`lemur-train`): config, set-up, state, jitted step, loop, checkpoints, metrics,
and the Grain loader over shard directories.

| module | what it holds |
|---|---|
| `config` | `TrainConfig` and its sections, `load_train_config`; paths stored absolute |
| `errors` | `RunError` (a run that cannot start, exit 2), `TrainingDiverged` (exit 1) |
| `setup` | `plan_run` (the config and model resolved and checked), the data opened |
| `state` | processes and the mesh; where a run starts (checkpoint, pretrained, fresh) |
| `step` | the state's layout, schedule, optimizer, the train/eval steps compiled |
| `batch` | global batches: their sharding on the mesh, the rows this process reads |
| `loader` | the Grain train stream and eval streams over shard directories |
| `old_loader_state` | loader states of lemur before 2026-11-25, recognized to be refused |
| `loop` | `Trainer`, `train`: the loop and its hooks (evals, checkpoints) |
| `metrics` | metrics.jsonl, TensorBoard, the progress bar, the train records, MFU |
| `checkpoint`, `interrupt`, `plot` | run state on disk; signals before training; plots |

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
    "RunError": "errors",
    "TrainingDiverged": "errors",
    "make_train_iterator": "loader",
    "make_eval_iterators": "loader",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

"""Around a run: its errors and summary, the model from config and data, process agreement."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from lemur.model import checkpoint as model_checkpoint
from lemur.model.config import LlamaConfig
from lemur.shards.check import ShardDir
from lemur.shards.format import ShardFormatError
from lemur.train import mesh as mesh_lib
from lemur.train.checkpoint import CheckpointDamaged, Checkpointer
from lemur.train.config import ConfigError, TrainConfig

# LlamaConfig fields that define the parameter shapes: a pretrained checkpoint must match.
# (tie_embeddings decides whether there is an lm_head at all.)
_SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "d_ff",
    "tie_embeddings",
)


class RunError(ValueError):
    """A run that cannot start (data, pretrained weights, checkpoints); one line."""


class TrainingDiverged(RuntimeError):
    """The loss, gradient norm or parameter norm stopped being finite."""


@dataclasses.dataclass
class RunSummary:
    """What a finished (or stopped) run reports."""

    step: int
    loss: float | None
    evals: dict[str, float]
    resumed_from: int | None
    stopped_early: bool
    run_dir: str


class DataDirs:
    """The run's shard directories, each opened once (`ShardDir`: one manifest read, one
    tokenizer hash, checks run once) on first use, shared by the loader and the evals."""

    def __init__(self) -> None:
        self._open: dict[str, ShardDir] = {}

    def __getitem__(self, directory: str) -> ShardDir:
        """The opened directory; RunError (one line) when its manifest cannot be read."""
        if directory not in self._open:
            try:
                self._open[directory] = ShardDir(directory)
            except (ShardFormatError, OSError) as e:
                raise RunError(str(e).splitlines()[0]) from None
        return self._open[directory]


def data_vocab(config: TrainConfig, dirs: DataDirs) -> tuple[int, str | None]:
    """The vocab size (the model's, else the shards') and the tokenizer hash of the data."""
    tok = dirs[config.data.dirs[0]].tokenizer
    return config.model.vocab_size or int(tok["vocab_size"]), tok.get("sha256")


def agree(problem: str | None) -> None:
    """Raise CheckpointDamaged on every process when any process found `problem`."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        # Every host must pick the same checkpoint: one host's unreadable shard skips it.
        flags = multihost_utils.process_allgather(np.array(problem is not None))
        if problem is None and bool(np.any(flags)):
            problem = "unreadable on another process"
    if problem is not None:
        raise CheckpointDamaged(problem)


def check_writable_dir(path: Path, key: str) -> None:
    """Refuse (one line) a directory path that is, or lies under, an existing non-directory."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise RunError(f"{key}: {p} exists and is not a directory")
            return


def resolve_model(config: TrainConfig, vocab_size: int) -> LlamaConfig:
    """The model of the run; with `init_from`, checked against the checkpoint's shapes."""
    model = config.model.llama(vocab_size)
    if config.model.init_from:
        try:
            saved = model_checkpoint.load_config(config.model.init_from)
        except OSError as e:
            raise RunError(f"model.init_from: {e}") from None
        for name in _SHAPE_FIELDS:
            if getattr(saved, name) != getattr(model, name):
                raise RunError(
                    f"model.init_from: {config.model.init_from} has {name} "
                    f"{getattr(saved, name)}, the config gives {getattr(model, name)}"
                )
    return model


def sum_over_processes(value: int) -> int:
    """The sum of an integer over every JAX process (itself with one process)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.asarray(multihost_utils.process_allgather(np.int64(value))).sum())


def make_mesh(config: TrainConfig) -> Mesh:
    """The run's device mesh, checked to fit the batch (ConfigError naming `mesh` if not)."""
    try:
        mesh = mesh_lib.make_mesh(config.mesh)
        mesh_lib.check_batch_fits(mesh, config.batch.size, config.batch.microbatches)
    except ValueError as e:
        raise ConfigError(f"config: mesh: {e}") from None
    return mesh


def open_checkpointer(config: TrainConfig) -> Checkpointer:
    """The run's checkpointer (RunError naming `checkpoint.dir` if it cannot be opened)."""
    try:
        return Checkpointer(
            config.checkpoint_dir,
            keep=config.checkpoint.keep,
            async_save=config.checkpoint.async_save,
        )
    except OSError as e:
        raise RunError(f"checkpoint.dir: {config.checkpoint_dir}: {e.strerror or e}") from None

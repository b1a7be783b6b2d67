"""The train state on the devices: the processes and the mesh it lives on, and where a run
starts: the newest good checkpoint, a pretrained model, or a fresh init (its layout, the
shapes and shardings, is lemur.train.step.StateLayout).

`initial_state` returns a `Start`; it reads the checkpointer and sets the loader's position,
nothing else.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from lemur.model import checkpoint as model_checkpoint
from lemur.model import llama, pretrained
from lemur.model import sharding as model_sharding
from lemur.model.config import Params
from lemur.model.grow import grow_vocab
from lemur.train import interrupt, old_loader_state
from lemur.train import step as step_lib
from lemur.train.checkpoint import CheckpointDamaged, Checkpointer
from lemur.train.config import ConfigError, TrainConfig
from lemur.train.errors import RunError
from lemur.train.loader import LoaderStateMismatch, TrainIterator
from lemur.train.step import State, StateLayout

Say = Callable[[str], None]  # prints one log line


# ---------------------------------------------------------------------------- processes, mesh


def _multi_process_env() -> bool:
    """Whether the environment describes a job of more than one process: the launchers
    under which jax.distributed.initialize() finds its coordinator by itself (Cloud TPU
    pods, Slurm, Open MPI) or from ours (JAX_*)."""
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS") or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return True
    if "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return True
    for name in ("SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE"):
        if int(env.get(name, "1") or 1) > 1:
            return True
    return False


def initialize_distributed(mode: str = "auto") -> bool:
    """Start jax.distributed when the job has several processes; True if it did.

    `auto` starts it when the environment describes a multi-process job (see
    docs/train.md: JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID, or a
    TPU pod, Slurm or Open MPI launch); `on` always does; `off` never does. Must run
    before anything touches the devices.
    """
    if mode == "off" or (mode == "auto" and not _multi_process_env()):
        return False
    if jax.distributed.is_initialized():
        return True
    kwargs: dict[str, Any] = {}
    # jax reads JAX_COORDINATOR_ADDRESS itself but takes the process count and id only as
    # arguments (or from a cluster it recognises); read ours for plain multi-host launches.
    if "JAX_NUM_PROCESSES" in os.environ:
        kwargs["num_processes"] = int(os.environ["JAX_NUM_PROCESSES"])
    if "JAX_PROCESS_ID" in os.environ:
        kwargs["process_id"] = int(os.environ["JAX_PROCESS_ID"])
    jax.distributed.initialize(**kwargs)
    return True


def start_processes(config: TrainConfig) -> None:
    """`jax.distributed` when the job has several processes, and the persistent compilation
    cache (a restarted run skips compiling); before anything touches the devices."""
    initialize_distributed(config.mesh.distributed)
    if config.compile_cache_dir and not jax.config.jax_compilation_cache_dir:
        jax.config.update(
            "jax_compilation_cache_dir", str(Path(config.compile_cache_dir).expanduser())
        )


def make_run_mesh(config: TrainConfig, devices: Sequence[Any] | None = None) -> Mesh:
    """The run's (data, fsdp, tensor) mesh over `devices` (default: all of this job's),
    checked to fit the batch (ConfigError naming `mesh` if not)."""
    m = config.mesh
    try:
        mesh = model_sharding.make_mesh(m.data, m.fsdp, m.tensor, devices)
        parallel = mesh.shape["data"] * mesh.shape["fsdp"]
        micro = config.batch.size // config.batch.microbatches
        if micro % parallel:
            raise ValueError(
                f"batch.size / batch.microbatches = {micro} windows is not a multiple of "
                f"mesh data x fsdp = {parallel} devices"
            )
    except ValueError as e:
        raise ConfigError(f"config: mesh: {e}") from None
    return mesh


# ---------------------------------------------------------------------------- start


@dataclasses.dataclass
class Start:
    """Where a run starts: the state (None: the newest checkpoint is already at `steps`),
    its step, the step it resumed from (None: a fresh or pretrained start), and the losses
    logged since the checkpoint's last train record."""

    state: State | None
    step: int
    resumed_from: int | None = None
    log_window: list[float] = dataclasses.field(default_factory=list)


def initial_state(
    config: TrainConfig,
    layout: StateLayout,
    checkpointer: Checkpointer,
    loader: TrainIterator,
    say: Say,
    *,
    is_main: bool,
) -> Start:
    """The newest checkpoint that restores completely (the loader set to its position),
    else `model.init_from`'s params, else a fresh init."""
    steps = checkpointer.all_steps()
    if steps and not config.checkpoint.resume:
        raise RunError(
            f"{checkpointer.directory} holds checkpoints (latest step "
            f"{steps[-1]}); set checkpoint.resume=true or use another run_dir"
        )
    if steps:
        return _resume(steps[::-1], config, layout, checkpointer, loader, say, is_main=is_main)
    init = functools.partial(step_lib.init_state, model=layout.model, tx=layout.tx)
    if config.model.init_from:
        params = _pretrained_params(config.model.init_from, layout, say)
        state = jax.jit(
            lambda key, p: init(key, params=p), out_shardings=layout.shardings, donate_argnums=1
        )(layout.key, params)
    else:
        state = jax.jit(init, out_shardings=layout.shardings)(layout.key)
    return Start(state, 0)


def _pretrained_params(path: str, layout: StateLayout, say: Say) -> Params:
    """`model.init_from`'s params on the mesh, its vocabulary grown to the model's."""
    model, shardings = layout.model, layout.shardings["params"]
    if pretrained.kind(path) == "hf":
        return _hf_params(path, layout, say)
    saved = model_checkpoint.load_checkpoint_config(path).vocab_size  # checked by resolve_model
    if saved == model.vocab_size:
        target = step_lib.with_shardings(layout.abstract["params"], shardings)
        return model_checkpoint.load_params(path, target)[0]
    small = dataclasses.replace(model, vocab_size=saved)
    abstract = jax.eval_shape(functools.partial(llama.init_params, small), layout.key)
    small_shardings = model_sharding.param_shardings(abstract, small, layout.mesh)
    target = step_lib.with_shardings(abstract, small_shardings)
    params, _ = model_checkpoint.load_params(path, target)
    say(
        f"lemur-train: {path}: vocabulary grown from {saved:,} to {model.vocab_size:,} "
        "ids (the tokenizer's added pieces); new rows = the mean of the existing ones"
    )
    # Eagerly, on the sharded arrays: only the embedding and the head are new arrays;
    # every other leaf passes through as it is (a jit would copy them).
    grown, _ = grow_vocab(params, small, model.vocab_size)
    return jax.tree.map(jax.device_put, grown, shardings)


def _hf_params(path: str, layout: StateLayout, say: Say) -> Params:
    """An HF folder's params converted on load (host numpy, one tensor at a time), grown
    to the model's vocabulary, then each process puts its own shards on its devices."""
    model = layout.model
    say(f"lemur-train: {path}: converting the HF checkpoint on load")
    _, params = pretrained.load_hf(path, model.param_dtype)
    saved = dataclasses.replace(model, vocab_size=params["embed"].shape[0])
    if saved.vocab_size != model.vocab_size:  # checked by resolve_model
        params, _ = grow_vocab(params, saved, model.vocab_size)
        say(
            f"lemur-train: {path}: vocabulary grown from {saved.vocab_size:,} to "
            f"{model.vocab_size:,} ids; new rows = the mean of the existing ones"
        )
    return jax.tree.map(
        lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]),
        params,
        layout.shardings["params"],
    )


def _resume(
    candidates: list[int],
    config: TrainConfig,
    layout: StateLayout,
    checkpointer: Checkpointer,
    loader: TrainIterator,
    say: Say,
    *,
    is_main: bool,
) -> Start:
    """Restore the newest checkpoint that restores completely; set damaged ones aside."""
    skipped: list[tuple[int, str]] = []
    for step in candidates:
        try:
            start = _restore(step, config, layout, checkpointer, loader)
        except CheckpointDamaged as e:
            skipped.append((step, str(e)))
            continue
        _set_aside(skipped, checkpointer, say, is_main=is_main)
        return start
    listing = "; ".join(f"{step}: {reason}" for step, reason in skipped)
    raise RunError(
        f"no checkpoint in {checkpointer.directory} restores ({listing}); "
        "move them away, or use another run_dir or checkpoint.dir"
    )


def _restore(
    step: int,
    config: TrainConfig,
    layout: StateLayout,
    checkpointer: Checkpointer,
    loader: TrainIterator,
) -> Start:
    """Checkpoint `step` into the mesh (state None: it is at `steps`); CheckpointDamaged if
    it does not restore."""
    agree(checkpointer.problem(step))
    _check_shapes(step, config, layout, checkpointer)
    if step > config.steps:
        raise RunError(
            f"steps ({config.steps}) is below the latest checkpoint, step "
            f"{step} in {checkpointer.directory}: nothing to train; raise steps, or "
            "use another run_dir or checkpoint.dir"
        )
    problem, restored = None, None
    try:
        restored = checkpointer.restore(step, layout.target())
    except CheckpointDamaged as e:
        problem = str(e)
    agree(problem)
    state, data_state, meta = restored
    if step == config.steps:
        # Restored all the same: a finished run's last checkpoint is checked.
        return Start(None, step, step)
    where = checkpointer.step_dir(step)
    try:
        loader.set_state(data_state)
    except LoaderStateMismatch:
        if old_loader_state.saved_before_rename(data_state, loader.identity):
            raise RunError(old_loader_state.refusal(str(where))) from None
        raise RunError(
            f"{where}: the loader state comes from another data pipeline "
            "(directories' contents, weights, seed or seq_len differ); --set "
            "data.strict_state=false continues from its position anyway"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise RunError(f"{where}: loader state: {e}") from None
    # The losses logged since the last record: the next record averages the same steps
    # as in an uninterrupted run.
    return Start(state, step, step, [float(x) for x in meta.get("log_window", [])])


def _check_shapes(
    step: int, config: TrainConfig, layout: StateLayout, checkpointer: Checkpointer
) -> None:
    """Refuse (one line) a checkpoint of another model or vocabulary than this run's."""
    problem, saved = None, {}
    try:
        saved = checkpointer.param_shapes(step)
    except CheckpointDamaged as e:
        problem = str(e)
    agree(problem)
    flat = jax.tree_util.tree_flatten_with_path(layout.abstract["params"])[0]
    want = {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in flat}
    if saved == want:
        return
    where = checkpointer.step_dir(step)
    embed = "['embed']"
    if embed in saved and embed in want and saved[embed][0] != want[embed][0]:
        source = (
            "model.vocab_size"
            if config.model.vocab_size
            else f"the tokenizer of {config.data.dirs[0]}"
        )
        raise RunError(
            f"{where}: the checkpoint has vocab_size {saved[embed][0]}, the "
            f"model {want[embed][0]} (from {source}); resuming needs the "
            "tokenizer it was trained with (or another run_dir)"
        )
    key = next(k for k in sorted(set(saved) | set(want)) if saved.get(k) != want.get(k))
    raise RunError(
        f"{where}: parameter {key} has shape {saved.get(key)} in the checkpoint, "
        f"{want.get(key)} in the model; resuming needs the same model (or "
        "another run_dir)"
    )


def _set_aside(
    skipped: list[tuple[int, str]], checkpointer: Checkpointer, say: Say, *, is_main: bool
) -> None:
    """Rename checkpoints newer than the restored one that failed, and say so."""
    for step, reason in skipped:
        if is_main:
            with interrupt.critical():
                moved = checkpointer.move_aside(step)
            say(f"lemur-train: skipped checkpoint {step} ({reason}); moved to {moved}")
    if skipped and jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("lemur-train: damaged checkpoints set aside")
        checkpointer.manager.reload()


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

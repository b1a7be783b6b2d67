"""Processes and devices: `jax.distributed` start-up, the mesh, and global batches.

One process per host. Each process reads its own rows of the global batch (the loader
slices the stream per process) and `jax.make_array_from_process_local_data` assembles
the global array. Which rows a process must read follows from the batch sharding: the
rows its devices hold (`HostSlice`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from lemur.model import sharding as model_sharding
from lemur.train.config import MeshConfig

# Environment variables of launchers under which jax.distributed.initialize() finds its
# coordinator by itself (Cloud TPU pods, Slurm, Open MPI) or from ours (JAX_*).
_LAUNCHER_ENV = (
    "JAX_COORDINATOR_ADDRESS",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "TPU_WORKER_HOSTNAMES",
    "SLURM_STEP_NUM_TASKS",
    "OMPI_COMM_WORLD_SIZE",
)


def _multi_process_env() -> bool:
    """Whether the environment describes a job of more than one process."""
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


def make_mesh(config: MeshConfig, devices: list[Any] | None = None) -> Mesh:
    """The (data, fsdp, tensor) mesh over all devices of the job (or `devices`)."""
    return model_sharding.make_mesh(config.data, config.fsdp, config.tensor, devices=devices)


@dataclasses.dataclass(frozen=True)
class HostSlice:
    """The rows of a global batch that this process holds: block `index` of `count`."""

    index: int
    count: int
    rows: int  # rows per block (the per-host batch size)


def host_slice(sharding: NamedSharding, global_shape: tuple[int, ...]) -> HostSlice:
    """Which contiguous block of the batch's rows this process's devices hold.

    Processes that share a block (a tensor axis spanning hosts) read the same rows:
    they get the same block index, so the loader gives them identical batches.
    """
    indices = sharding.addressable_devices_indices_map(global_shape).values()
    starts = sorted({idx[0].indices(global_shape[0])[0] for idx in indices})
    stops = sorted({idx[0].indices(global_shape[0])[1] for idx in indices})
    lo, hi = starts[0], stops[-1]
    rows = hi - lo
    covered = sum(b - a for a, b in zip(starts, stops, strict=True))
    if covered != rows or global_shape[0] % rows or lo % rows:
        raise ValueError(
            f"this process's devices hold rows {starts}..{stops} of a batch of "
            f"{global_shape[0]}: not one aligned block; reorder the mesh so each host's "
            "devices are adjacent on the batch axes"
        )
    return HostSlice(index=lo // rows, count=global_shape[0] // rows, rows=rows)


def batch_sharding(mesh: Mesh, batch_size: int, seq_len: int) -> NamedSharding:
    """Sharding of a [batch, seq_len] int batch over the mesh's batch axes."""
    return model_sharding.batch_sharding(mesh, (batch_size, seq_len))


def check_batch_fits(mesh: Mesh, batch_size: int, microbatches: int) -> None:
    """Refuse a (micro)batch that the data-parallel axes cannot split evenly."""
    parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    micro = batch_size // microbatches
    if micro % parallel:
        raise ValueError(
            f"batch.size / batch.microbatches = {micro} windows is not a multiple of "
            f"mesh data x fsdp = {parallel} devices"
        )


def global_batch(
    local: dict[str, np.ndarray], sharding: NamedSharding, global_shape: tuple[int, ...]
) -> dict[str, jax.Array]:
    """Assemble per-process numpy batches into global jax arrays on the mesh."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, global_shape)
        for k, v in local.items()
    }

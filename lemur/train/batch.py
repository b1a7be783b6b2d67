"""The global batches the train and eval steps take: their shape and sharding on the mesh,
and the rows of them this process reads.

One process per host. Each process reads its own rows of a global batch (the loader
slices the stream per process) and `jax.make_array_from_process_local_data` assembles
the global array. Which rows a process must read follows from the batch sharding: the
rows its devices hold (`HostSlice`, `BatchLayout`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from lemur.model import sharding as model_sharding
from lemur.shards.windows import BATCH_KEYS

Batch = dict[str, jax.Array]  # a global batch: every key of BATCH_KEYS, [batch, seq_len]


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


def global_batch(
    local: dict[str, np.ndarray], sharding: NamedSharding, global_shape: tuple[int, ...]
) -> dict[str, jax.Array]:
    """Assemble per-process numpy batches into global jax arrays on the mesh."""
    return {
        k: jax.make_array_from_process_local_data(sharding, v, global_shape)
        for k, v in local.items()
    }


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """A global [batch, seq_len] batch on the mesh: its sharding, and this process's rows."""

    shape: tuple[int, int]
    sharding: NamedSharding
    host: HostSlice

    @classmethod
    def on(cls, mesh: Mesh, batch_size: int, seq_len: int) -> BatchLayout:
        """The layout of a batch of `batch_size` windows split over the mesh's batch axes."""
        shape = (batch_size, seq_len)
        sharding = model_sharding.batch_sharding(mesh, shape)
        return cls(shape, sharding, host_slice(sharding, shape))

    def abstract(self) -> Batch:
        """ShapeDtypeStructs of a batch (every key of `BATCH_KEYS`), for compiling."""
        spec = jax.ShapeDtypeStruct(self.shape, np.int32, sharding=self.sharding)
        return dict.fromkeys(BATCH_KEYS, spec)

    def put(self, local: dict[str, np.ndarray]) -> Batch:
        """This process's rows (a loader batch) assembled into the global batch."""
        return global_batch(local, self.sharding, self.shape)

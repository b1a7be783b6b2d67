"""Sharding in one table: every Llama parameter and activation mapped to mesh axes.

The mesh has three axes (the MaxText/nanodo split, minus the axes we do not need):
  data    pure data parallelism: parameters replicated, batch split.
  fsdp    ZeRO-3 style: batch split *and* parameters split along their d_model side.
  tensor  Megatron tensor parallelism: heads, d_ff and vocab split.
The batch is split over ("data", "fsdp"), so `data * fsdp` must divide the global batch.

Activations are constrained at block boundaries only when a mesh is active (set with
`jax.set_mesh(mesh)`); without one `constrain` returns its input, so the same forward
runs on a single CPU device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

if TYPE_CHECKING:
    from lemur.model.config import LlamaConfig

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
BATCH: tuple[str, str] = ("data", "fsdp")

# The table. Shapes are those of one layer (stacked layer params get a leading None, as
# the layer axis is never split: scan slices it). D=d_model, H=heads, G=kv heads,
# K=head_dim, F=d_ff, V=vocab.
PARAM_SPECS: dict[str, P] = {
    "embed": P("tensor", "fsdp"),  # VxD
    "attn_norm": P(None),  # D (tiny: replicated)
    "wq": P("fsdp", "tensor", None),  # DxHxK
    "wk": P("fsdp", "tensor", None),  # DxGxK
    "wv": P("fsdp", "tensor", None),  # DxGxK
    "wo": P("tensor", None, "fsdp"),  # HxKxD
    # Qwen2's q/k/v biases: split by head like the projections they add to, so each
    # tensor shard adds its own heads' biases with no communication; too small for fsdp.
    "bq": P("tensor", None),  # HxK
    "bk": P("tensor", None),  # GxK
    "bv": P("tensor", None),  # GxK
    "mlp_norm": P(None),  # D
    "w_gate": P("fsdp", "tensor"),  # DxF
    "w_up": P("fsdp", "tensor"),  # DxF
    "w_down": P("tensor", "fsdp"),  # FxD
    "final_norm": P(None),  # D
    "lm_head": P("fsdp", "tensor"),  # DxV
}

# Activations, by the shape letters of their names in llama.py.
ACTIVATION_SPECS: dict[str, P] = {
    "BL": P(BATCH, None),  # tokens, segment ids, positions
    # The embedding table as the lookup reads it: gathered over fsdp first, as FSDP does for
    # every weight, so the gathered rows come out batch-sharded like the tokens.
    "VD": P("tensor", None),
    "BLD": P(BATCH, None, None),  # residual stream: replicated over tensor (Megatron)
    "BLHK": P(BATCH, None, "tensor", None),  # q, k, v, attention output
    "BLF": P(BATCH, None, "tensor"),  # SwiGLU hidden
    "BLV": P(BATCH, None, "tensor"),  # logits
}


def make_mesh(
    data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """Build a (data, fsdp, tensor) mesh with Auto axes; -1 takes the remaining devices."""
    devices = list(jax.devices() if devices is None else devices)
    shape = [data, fsdp, tensor]
    asked = dict(zip(MESH_AXES, shape, strict=True))
    if shape.count(-1) > 1:
        raise ValueError(f"at most one mesh axis may be -1, got {asked}")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices do not split into {asked}")
        shape[shape.index(-1)] = len(devices) // known
    if int(np.prod(shape)) != len(devices):
        raise ValueError(f"mesh {asked} needs {int(np.prod(shape))} devices, have {len(devices)}")
    # Auto axes: the model states shardings as constraints and lets GSPMD propagate
    # (jax.make_mesh defaults to Explicit axes, where constraints become assertions).
    auto = (AxisType.Auto,) * 3
    if len({d.process_index for d in devices}) > 1:
        # The trainer's loader gives each process one contiguous block of a batch's rows,
        # so each process's devices must be adjacent in the mesh: jax.make_mesh orders a
        # TPU pod's chips along ICI rings, which puts one host's 4 chips of a v4-512 at
        # rows 0, 32, 256 and 288 of an fsdp axis of 256 (found by `lemur-train plan`).
        ordered = sorted(
            devices, key=lambda d: (getattr(d, "slice_index", 0), d.process_index, d.id)
        )
        return Mesh(np.array(ordered).reshape(shape), MESH_AXES, axis_types=auto)
    return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=auto, devices=devices)


def fit_spec(spec: P, shape: Sequence[int], mesh: Mesh | AbstractMesh) -> P:
    """Drop from `spec` the mesh axes that are absent, not Auto, or do not divide the dim."""
    sizes = dict(mesh.shape)
    auto = {n for n, t in zip(mesh.axis_names, mesh.axis_types, strict=True) if t == AxisType.Auto}
    out: list[Any] = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        kept: list[str] = []
        for name in names:
            # Splitting a dim unevenly is an error for device_put; replicate instead
            # (e.g. 2 KV heads on a tensor axis of 4, or a batch of 1).
            if name in sizes and name in auto and dim % (sizes[name] * _prod(sizes, kept)) == 0:
                kept.append(name)
        out.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return P(*out)


def _prod(sizes: dict[str, int], names: list[str]) -> int:
    """Product of the sizes of mesh axes `names`."""
    return int(np.prod([sizes[n] for n in names])) if names else 1


def param_partition_specs(
    params: Any, config: LlamaConfig, mesh: Mesh | AbstractMesh | None = None
) -> Any:
    """Map a params pytree (arrays or ShapeDtypeStructs) to a same-shaped pytree of specs.

    With `mesh`, axes that do not divide a dimension are dropped (that dim replicated).
    """

    def spec_for(path: tuple[Any, ...], leaf: Any) -> P:
        keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        name = keys[-1]
        if name not in PARAM_SPECS:
            raise KeyError(f"no sharding rule for parameter {'/'.join(map(str, keys))}")
        spec = PARAM_SPECS[name]
        if keys[0] == "layers":
            if leaf.shape[0] != config.n_layers:
                raise ValueError(
                    f"layers/{name} has leading dim {leaf.shape[0]}, "
                    f"config.n_layers is {config.n_layers}"
                )
            spec = P(None, *spec)
        if len(spec) != len(leaf.shape):
            raise ValueError(f"rule {spec} for {'/'.join(keys)} does not fit shape {leaf.shape}")
        return spec if mesh is None else fit_spec(spec, leaf.shape, mesh)

    return jax.tree_util.tree_map_with_path(spec_for, params)


def param_shardings(params: Any, config: LlamaConfig, mesh: Mesh) -> Any:
    """NamedShardings for a params pytree on `mesh` (for jit out_shardings / device_put)."""
    specs = param_partition_specs(params, config, mesh)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def batch_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
    """Sharding of a BxL integer batch (tokens, targets, segment ids, positions)."""
    return NamedSharding(mesh, fit_spec(ACTIVATION_SPECS["BL"], shape, mesh))


def constrain(x: jax.Array, kind: str) -> jax.Array:
    """Sharding constraint for activation `kind` (a key of ACTIVATION_SPECS) under a mesh.

    A no-op when no mesh is set (single device, or jit with explicit shardings only).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = fit_spec(ACTIVATION_SPECS[kind], x.shape, mesh)
    if all(entry is None for entry in spec):
        # Nothing to split (a 1-sized batch, or no Auto axes: under Explicit axes a
        # constraint is an assertion, and the model is written for Auto sharding).
        return x
    return jax.lax.with_sharding_constraint(x, spec)

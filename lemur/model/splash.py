"""Pallas splash attention (TPU): causal, grouped-query, document-masked, without L x L memory.

`jax.nn.dot_product_attention`'s XLA path materialises the B x H x L x L fp32 scores (16 GiB
per chip per layer for 4 x 64 heads x 4096^2); splash attention
(`jax.experimental.pallas.ops.tpu.splash_attention`) streams blocks of keys through VMEM
with an online softmax, skipping the blocks the causal mask removes, and recomputes what
the backward needs from the log-sum-exp.

Mosaic kernels are not partitioned by the compiler, so under a mesh the kernel runs in a
`jax.shard_map` over the batch axes (data, fsdp) and the head axis (tensor) of the
context mesh (the one `jax.set_mesh` set, as for every constraint in lemur.model): each
device computes its own rows and heads, which needs no communication.

The kernel takes one example as heads x length x head_dim; grouped-query attention is its
multi-head path with fewer kv heads (query head h reads kv head h // (H / G), the grouping
of `jax.nn.dot_product_attention` and Hugging Face's `repeat_kv`). Documents are
`SegmentIds`: a token attends to earlier tokens of its own segment. The query is scaled by
1/sqrt(head_dim) before the kernel (it has no scale of its own); scores, softmax and
accumulation are fp32 inside it, and the output has the query's dtype, as on the XLA path.

Off TPU the kernel runs in Pallas' interpret mode (`interpret=True`): the same program
executed by XLA on the host, slow, and how its numerics are tested on CPU.

Shape letters: B batch, L sequence, H query heads, G kv heads, K head_dim.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from lemur.model.sharding import ACTIVATION_SPECS, fit_spec

# Query and key block lengths, largest first: the kernel needs L to be a multiple of
# both, and its key blocks are at least one 128-lane vector. 512 is MaxText's default
# (fewer grid steps, and VMEM still holds the blocks at head_dim 128 in bf16).
BLOCK_SIZES = (512, 256, 128)


def block_size(seq_len: int) -> int | None:
    """The largest of BLOCK_SIZES that divides `seq_len`; None when none does."""
    return next((b for b in BLOCK_SIZES if seq_len % b == 0), None)


def _ops() -> ModuleType:
    """jax's splash attention package, imported on first use (at the top, Pallas would add
    ~1 s to every `import lemur.model.llama`)."""
    from jax.experimental.pallas.ops.tpu import splash_attention

    return splash_attention


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, seq_len: int, block: int, interpret: bool) -> Any:
    """The causal kernel for one device's heads (built once per shape: the block-sparsity
    tables come from numpy at trace time, and an unscanned model asks once per layer)."""
    ops = _ops()
    sizes = ops.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    causal = ops.MultiHeadMask([ops.CausalMask((seq_len, seq_len))] * heads)
    return ops.make_splash_mha(
        causal, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
    )


def _local(
    q_BxLxHxK: jax.Array,
    k_BxLxGxK: jax.Array,
    v_BxLxGxK: jax.Array,
    segment_ids_BxL: jax.Array | None,
    *,
    block: int,
    interpret: bool,
) -> jax.Array:
    """Splash attention over the arrays one device holds (vmapped over its rows)."""
    _, L, H, K = q_BxLxHxK.shape
    splash = _kernel(H, L, block, interpret)
    # Scaled in fp32, then back to the compute dtype the kernel's matmuls take.
    q_BxLxHxK = (q_BxLxHxK.astype(jnp.float32) / math.sqrt(K)).astype(q_BxLxHxK.dtype)
    q_BxHxLxK, k_BxGxLxK, v_BxGxLxK = (
        jnp.swapaxes(x, 1, 2) for x in (q_BxLxHxK, k_BxLxGxK, v_BxLxGxK)
    )
    if segment_ids_BxL is None:
        o_BxHxLxK = jax.vmap(splash)(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK)
    else:
        segments = _ops().SegmentIds(q=segment_ids_BxL, kv=segment_ids_BxL)
        o_BxHxLxK = jax.vmap(splash)(q_BxHxLxK, k_BxGxLxK, v_BxGxLxK, segments)
    return jnp.swapaxes(o_BxHxLxK, 1, 2)


def splash_attention(
    q_BxLxHxK: jax.Array,
    k_BxLxGxK: jax.Array,
    v_BxLxGxK: jax.Array,
    segment_ids_BxL: jax.Array | None = None,
    *,
    interpret: bool = False,
    block: int | None = None,
) -> jax.Array:
    """Causal (and, with segment ids, per-document) attention output BxLxHxK, query's dtype.

    `block` overrides the block length (default: `block_size(L)`); L must be a multiple
    of it. Under a context mesh the kernel runs per device in a shard_map over the batch
    and head axes; without one it runs on the arrays as they are.
    """
    B, L, H, K = q_BxLxHxK.shape
    G = k_BxLxGxK.shape[2]
    block = block_size(L) if block is None else block
    if block is None or L % block:
        raise ValueError(
            f"splash attention needs the sequence length ({L}) to be a multiple of "
            f"{block or BLOCK_SIZES[-1]}"
        )
    local = functools.partial(_local, block=block, interpret=interpret)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return local(q_BxLxHxK, k_BxLxGxK, v_BxLxGxK, segment_ids_BxL)
    q_spec = fit_spec(ACTIVATION_SPECS["BLHK"], q_BxLxHxK.shape, mesh)
    kv_spec = fit_spec(ACTIVATION_SPECS["BLHK"], k_BxLxGxK.shape, mesh)
    if kv_spec != q_spec:
        # The query heads split over the tensor axis but the G kv heads do not: give each
        # query head its own copy of its kv head, so every device holds the kv heads of
        # its query heads (the grouping stays h -> h // (H / G)).
        k_BxLxHxK, v_BxLxHxK = (jnp.repeat(x, H // G, axis=2) for x in (k_BxLxGxK, v_BxLxGxK))
        k_BxLxGxK, v_BxLxGxK, kv_spec = k_BxLxHxK, v_BxLxHxK, q_spec
    args, specs = [q_BxLxHxK, k_BxLxGxK, v_BxLxGxK], [q_spec, kv_spec, kv_spec]
    if segment_ids_BxL is not None:
        args.append(segment_ids_BxL)
        specs.append(P(q_spec[0], None))
    else:
        local = functools.partial(local, segment_ids_BxL=None)
    # check_vma off: the Pallas call does not declare how its outputs vary over the mesh.
    sharded = jax.shard_map(local, in_specs=tuple(specs), out_specs=q_spec, check_vma=False)
    return sharded(*args)

"""Per-token cross-entropy of the output head without the B x L x V fp32 logits.

The head's fp32 logits are the largest activation of a step: 4 sequences x 4096 x 128,256
ids x 4 B = 8.4 GB per chip unsplit, and their gradient as much again. Here the final
hidden states are cut into chunks of positions and a `lax.scan` runs head and
cross-entropy one chunk at a time, under `jax.checkpoint`, so the backward recomputes
each chunk's logits instead of keeping them: forward and backward hold one chunk's logits
(and their gradient) at a time. The price is one more head matmul in the backward.

`LlamaConfig.logits_chunk` sets the positions per chunk; None (the default) picks it so
that one chunk's fp32 logits on one device stay within LOGITS_CHUNK_BYTES; a chunk as
long as the sequence is the plain, unchunked computation.

Shape letters: B batch, L sequence, C chunks, T positions per chunk, D d_model, V vocab.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from lemur.model.config import LlamaConfig, Params
from lemur.model.llama import output_head
from lemur.model.sharding import ACTIVATION_SPECS, BATCH, fit_spec

# One chunk's fp32 logits per device, at most (when logits_chunk is None): small next to
# any accelerator's memory, large enough that the head's matmul keeps thousands of rows.
LOGITS_CHUNK_BYTES = 256 * 2**20


def cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> jax.Array:
    """Per-token cross-entropy (fp32) of integer targets: optax's
    softmax_cross_entropy_with_integer_labels, operation for operation."""
    shifted = logits_BxLxV - jax.lax.stop_gradient(jnp.max(logits_BxLxV, -1, keepdims=True))
    target_logit_BxL = jnp.take_along_axis(shifted, targets_BxL[..., None], -1)[..., 0]
    return jnp.log(jnp.sum(jnp.exp(shifted), -1)) - target_logit_BxL


def _shards(spec_entry: str | tuple[str, ...] | None, mesh: jax.sharding.AbstractMesh) -> int:
    """How many ways a dimension with this PartitionSpec entry is split on `mesh`."""
    names = (
        () if spec_entry is None else (spec_entry,) if isinstance(spec_entry, str) else spec_entry
    )
    return int(np.prod([dict(mesh.shape)[n] for n in names])) if names else 1


def chunk_length(config: LlamaConfig, batch: int, seq_len: int) -> int:
    """Positions per chunk: `config.logits_chunk`, else the most whose fp32 logits on one
    device (its rows of the batch, its slice of the vocabulary under the context mesh)
    fit LOGITS_CHUNK_BYTES; never more than `seq_len`."""
    if config.logits_chunk is not None:
        return min(config.logits_chunk, seq_len)
    rows, vocab = batch, config.vocab_size
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        spec = fit_spec(ACTIVATION_SPECS["BLV"], (batch, seq_len, vocab), mesh)
        rows //= _shards(spec[0], mesh)
        vocab //= _shards(spec[2], mesh)
    return max(1, min(seq_len, LOGITS_CHUNK_BYTES // (4 * rows * vocab)))


def token_cross_entropy(
    params: Params, x_BxLxD: jax.Array, targets_BxL: jax.Array, config: LlamaConfig
) -> jax.Array:
    """Per-token cross-entropy (fp32, BxL) of the head over the final hidden states,
    computed chunk by chunk over positions (see the module docstring)."""
    B, L, D = x_BxLxD.shape
    limit = chunk_length(config, B, L)
    if limit >= L:
        return cross_entropy(output_head(params, x_BxLxD, config), targets_BxL)
    # Equal chunks as long as the limit allows, the sequence padded to C x T (the padded
    # positions' losses are computed and dropped).
    C = math.ceil(L / limit)
    T = math.ceil(L / C)
    pad = C * T - L
    x_BxCTxD = jnp.pad(x_BxLxD, ((0, 0), (0, pad), (0, 0)))
    targets_BxCT = jnp.pad(targets_BxL, ((0, 0), (0, pad)))
    x_CxBxTxD = _chunk_major(x_BxCTxD.reshape(B, C, T, D))
    targets_CxBxT = _chunk_major(targets_BxCT.reshape(B, C, T))

    @jax.checkpoint  # keep nothing: the backward recomputes this chunk's logits
    def chunk_losses(params: Params, x_BxTxD: jax.Array, targets_BxT: jax.Array) -> jax.Array:
        return cross_entropy(output_head(params, x_BxTxD, config), targets_BxT)

    _, ce_CxBxT = jax.lax.scan(
        lambda _, xt: (None, chunk_losses(params, *xt)), None, (x_CxBxTxD, targets_CxBxT)
    )
    return jnp.swapaxes(ce_CxBxT, 0, 1).reshape(B, C * T)[:, :L]


def _chunk_major(x_BxC: jax.Array) -> jax.Array:
    """[B, C, ...] -> [C, B, ...], the rows kept on the batch axes under a mesh (the scan
    slices the unsplit chunk axis)."""
    x_CxB = jnp.swapaxes(x_BxC, 0, 1)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x_CxB
    spec = fit_spec(P(None, BATCH), x_CxB.shape, mesh)
    if all(entry is None for entry in spec):  # nothing split (as in sharding.constrain)
        return x_CxB
    return jax.lax.with_sharding_constraint(x_CxB, spec)

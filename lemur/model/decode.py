"""KV-cache inference for lemur's Llama: prefill a left-padded batch, then one token at a time.

A batch of prompts of different lengths is left-padded to a common length P: row b's
prompt fills cache slots `pad[b] .. P-1`, and every later token of every row goes to the
same slot, so one `dynamic_update_slice` per layer writes the whole batch. Rotary
positions are `slot - pad[b]` (each prompt starts at position 0, as if it stood alone),
and a key slot is visible to a query when it is at or before the query's slot and not
padding. The cache holds keys and values after the rotation, n_kv_heads of them (GQA),
in the compute dtype, one array per layer: a decode step updates each layer's array in
place (when donated) instead of slicing a stacked cache. Keys are stored transposed,
B x G x K x S, values B x G x S x K: both attention products then read the cache as the
matrix they multiply by (`q k^T` from a B x G x S x K key cache read it transposed, 2.7x
the time of the same product from B x G x K x S, measured at batch 8 over 320 slots).

Everything here is shape-polymorphic in nothing: callers pick P and the cache length S
from a few buckets (lemur.eval.generate), so a prefill compiles once per (B, P, S) and a
decode step once per (B, S), whatever the prompt and output lengths.

`extend` lays a batch out the other way, for conversations that grow turn by turn
(lemur.eval.agent_decode): row b's tokens fill its own slots 0 .. length[b]-1 with rotary
position = slot, and new tokens (a turn's prompt, or one decoded token) are written at each
row's own length, so rows of different lengths grow with no padding between turns.

Shape letters as in llama.py, plus P prompt slots, S cache slots and T new tokens per row.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from lemur.model.config import LlamaConfig, Params
from lemur.model.llama import (
    attention,
    attention_qkv,
    attention_residual,
    embed_tokens,
    mlp_residual,
    output_head,
    rms_norm,
    rope_angles,
    rope_inv_freq,
)


class KVCache(NamedTuple):
    """Rotated keys (one B x G x K x S array per layer) and values (B x G x S x K)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]

    @property
    def length(self) -> int:
        """Number of slots S."""
        return self.v[0].shape[2]


def init_cache(config: LlamaConfig, batch: int, length: int) -> KVCache:
    """An all-zero cache of `length` slots for `batch` rows."""
    G, K, dtype = config.n_kv_heads, config.head_dim, config.compute_dtype
    keys = tuple(jnp.zeros((batch, G, K, length), dtype) for _ in range(config.n_layers))
    values = tuple(jnp.zeros((batch, G, length, K), dtype) for _ in range(config.n_layers))
    return KVCache(k=keys, v=values)


def grow_cache(cache: KVCache, length: int) -> KVCache:
    """The cache with zero slots added at the end, up to `length` slots."""
    more = length - cache.length
    keys = tuple(jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, more))) for k in cache.k)
    values = tuple(jnp.pad(v, ((0, 0), (0, 0), (0, more), (0, 0))) for v in cache.v)
    return KVCache(k=keys, v=values)


def insert_row(cache: KVCache, row_cache: KVCache, row: jax.Array, offset: jax.Array) -> KVCache:
    """The batch cache with a one-row cache written at row `row`, from slot `offset` on."""
    zero = jnp.zeros((), jnp.int32)
    keys = tuple(
        jax.lax.dynamic_update_slice(c, r, (row, zero, zero, offset))
        for c, r in zip(cache.k, row_cache.k, strict=True)
    )
    values = tuple(
        jax.lax.dynamic_update_slice(c, r, (row, zero, offset, zero))
        for c, r in zip(cache.v, row_cache.v, strict=True)
    )
    return KVCache(k=keys, v=values)


def split_layers(params: Params, consume: bool = False) -> Params:
    """The params with `layers` as a tuple of per-layer dicts (a copy of the layer weights).

    Decoding reads every weight once per token, so the layout matters there: from the
    stacked N x ... arrays, XLA copies each layer's slice out at every step (measured: most
    of a CPU decode step). Split once and decode from this. With `consume`, each stacked
    array is removed from `params["layers"]` once split, so the peak is one stacked array
    over the model's size instead of twice the layers.
    """
    if isinstance(params["layers"], tuple | list):
        return params
    stacked = params["layers"]
    layers: list[Params] = []
    for name in list(stacked):
        w = stacked.pop(name) if consume else stacked[name]
        for i, w_i in enumerate(jnp.unstack(jnp.asarray(w))):
            if i == len(layers):
                layers.append({})
            layers[i][name] = w_i
        del w
    return {**params, "layers": tuple(layers)}


def _layers(params: Params, config: LlamaConfig) -> list[Params]:
    """Per-layer param dicts: given (split_layers), or sliced from the stacked layout."""
    if isinstance(params["layers"], tuple | list):
        return list(params["layers"])
    unstacked = {name: jnp.unstack(w) for name, w in params["layers"].items()}
    return [{name: ws[i] for name, ws in unstacked.items()} for i in range(config.n_layers)]


def _write(cache_BxGxSxK: jax.Array, new_BxTxGxK: jax.Array, slot: jax.Array) -> jax.Array:
    """The value cache with `new` written at slots slot .. slot + T - 1."""
    zero = jnp.zeros((), jnp.int32)
    new_BxGxTxK = jnp.swapaxes(new_BxTxGxK, 1, 2).astype(cache_BxGxSxK.dtype)
    return jax.lax.dynamic_update_slice(
        cache_BxGxSxK, new_BxGxTxK, (zero, zero, slot.astype(jnp.int32), zero)
    )


def _write_keys(cache_BxGxKxS: jax.Array, new_BxTxGxK: jax.Array, slot: jax.Array) -> jax.Array:
    """The key cache with `new` written at slots slot .. slot + T - 1."""
    zero = jnp.zeros((), jnp.int32)
    new_BxGxKxT = jnp.transpose(new_BxTxGxK, (0, 2, 3, 1)).astype(cache_BxGxKxS.dtype)
    return jax.lax.dynamic_update_slice(
        cache_BxGxKxS, new_BxGxKxT, (zero, zero, zero, slot.astype(jnp.int32))
    )


def cached_attention(
    q_Bx1xHxK: jax.Array, k_BxGxKxS: jax.Array, v_BxGxSxK: jax.Array, visible_BxS: jax.Array
) -> jax.Array:
    """One query per row against the cache, grouped-query, with the numerics of
    jax.nn.dot_product_attention's XLA path (fp32 logits and softmax, its mask constant).

    Written out because the layout matters: with G before S and K the batch dims (B, G)
    lead both products and XLA reads the cache in place; through dot_product_attention on a
    B x S x G x K cache it copied a transpose of every layer's whole cache at every step.
    """
    B, _, H, K = q_Bx1xHxK.shape
    G = k_BxGxKxS.shape[1]
    q_BxGxRxK = q_Bx1xHxK.reshape(B, G, H // G, K)  # head h = g * (H / G) + r, as HF repeats kv
    logits_BxGxRxS = jnp.einsum(
        "bgrk,bgks->bgrs", q_BxGxRxK, k_BxGxKxS, preferred_element_type=jnp.float32
    ) * jnp.float32(K**-0.5)
    large_negative = jnp.float32(-0.7 * float(jnp.finfo(jnp.float32).max))
    logits_BxGxRxS = jnp.where(visible_BxS[:, None, None, :], logits_BxGxRxS, large_negative)
    probs_BxGxRxS = jax.nn.softmax(logits_BxGxRxS, axis=-1).astype(v_BxGxSxK.dtype)
    o_BxGxRxK = jnp.einsum("bgrs,bgsk->bgrk", probs_BxGxRxS, v_BxGxSxK)
    return o_BxGxRxK.reshape(B, 1, H, K)


def prefill(
    params: Params,
    tokens_BxP: jax.Array,
    pad_B: jax.Array,
    cache: KVCache,
    config: LlamaConfig,
    *,
    last_only: bool = False,
) -> tuple[jax.Array, KVCache]:
    """Run left-padded prompts (row b's tokens in slots pad[b]..P-1) and fill cache slots 0..P-1.

    Returns fp32 logits B x P x V (B x V of the last slot with `last_only`) and the cache.
    Padding slots get position 0 and attend only to themselves, so nothing is undefined;
    no real token ever attends to them.
    """
    B, P = tokens_BxP.shape
    slot_P = jnp.arange(P, dtype=jnp.int32)
    positions_BxP = jnp.maximum(slot_P[None, :] - pad_B[:, None], 0)
    cos_BxPxK2, sin_BxPxK2 = rope_angles(positions_BxP, rope_inv_freq(config))
    real_BxP = slot_P[None, :] >= pad_B[:, None]
    # Causality comes from attention's is_causal; this mask removes padding keys.
    mask_Bx1xPxP = real_BxP[:, None, None, :] | (slot_P[:, None] == slot_P[None, :])
    x_BxPxD = embed_tokens(params, tokens_BxP, config)
    ks, vs = list(cache.k), list(cache.v)
    zero = jnp.zeros((), jnp.int32)
    for i, layer in enumerate(_layers(params, config)):
        q_BxPxHxK, k_BxPxGxK, v_BxPxGxK = attention_qkv(
            x_BxPxD, layer, config, cos_BxPxK2, sin_BxPxK2
        )
        ks[i], vs[i] = _write_keys(ks[i], k_BxPxGxK, zero), _write(vs[i], v_BxPxGxK, zero)
        o_BxPxHxK = attention(q_BxPxHxK, k_BxPxGxK, v_BxPxGxK, mask_Bx1xPxP, config)
        x_BxPxD = mlp_residual(attention_residual(x_BxPxD, o_BxPxHxK, layer, config), layer, config)
    if last_only:  # the head over one slot instead of P: P times less of the largest matmul
        x_BxPxD = x_BxPxD[:, -1:]
    x_BxPxD = rms_norm(x_BxPxD, params["final_norm"], config.norm_eps)
    logits = output_head(params, x_BxPxD, config)
    return (logits[:, 0] if last_only else logits), KVCache(tuple(ks), tuple(vs))


def decode_step(
    params: Params,
    tokens_B: jax.Array,
    slot: jax.Array,
    pad_B: jax.Array,
    cache: KVCache,
    config: LlamaConfig,
) -> tuple[jax.Array, KVCache]:
    """Feed one token per row at cache slot `slot` (a traced int): fp32 logits B x V, cache.

    Row b's token gets rotary position slot - pad[b] and attends to slots pad[b]..slot.
    """
    S = cache.length
    slot = jnp.asarray(slot, jnp.int32)
    positions_Bx1 = (slot - pad_B)[:, None]
    cos_Bx1xK2, sin_Bx1xK2 = rope_angles(positions_Bx1, rope_inv_freq(config))
    slot_S = jnp.arange(S, dtype=jnp.int32)
    visible_BxS = (slot_S[None, :] >= pad_B[:, None]) & (slot_S[None, :] <= slot)
    x_Bx1xD = embed_tokens(params, tokens_B[:, None], config)
    ks, vs = list(cache.k), list(cache.v)
    for i, layer in enumerate(_layers(params, config)):
        q_Bx1xHxK, k_Bx1xGxK, v_Bx1xGxK = attention_qkv(
            x_Bx1xD, layer, config, cos_Bx1xK2, sin_Bx1xK2
        )
        ks[i], vs[i] = _write_keys(ks[i], k_Bx1xGxK, slot), _write(vs[i], v_Bx1xGxK, slot)
        o_Bx1xHxK = cached_attention(q_Bx1xHxK, ks[i], vs[i], visible_BxS)
        x_Bx1xD = mlp_residual(attention_residual(x_Bx1xD, o_Bx1xHxK, layer, config), layer, config)
    x_Bx1xD = rms_norm(x_Bx1xD, params["final_norm"], config.norm_eps)
    return output_head(params, x_Bx1xD, config)[:, 0], KVCache(tuple(ks), tuple(vs))


# Conversations: a row's tokens stay in its own slots 0 .. length-1 across turns.


def _write_rows(cache_BxGxSxK: jax.Array, new_BxTxGxK: jax.Array, start_B: jax.Array) -> jax.Array:
    """The value cache with row b's `new` written at slots start[b] .. start[b] + T - 1."""
    zero = jnp.zeros((), jnp.int32)
    new_BxGxTxK = jnp.swapaxes(new_BxTxGxK, 1, 2).astype(cache_BxGxSxK.dtype)
    return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n, (zero, s, zero)))(
        cache_BxGxSxK, new_BxGxTxK, start_B.astype(jnp.int32)
    )


def _write_key_rows(
    cache_BxGxKxS: jax.Array, new_BxTxGxK: jax.Array, start_B: jax.Array
) -> jax.Array:
    """The key cache with row b's `new` written at slots start[b] .. start[b] + T - 1."""
    zero = jnp.zeros((), jnp.int32)
    new_BxGxKxT = jnp.transpose(new_BxTxGxK, (0, 2, 3, 1)).astype(cache_BxGxKxS.dtype)
    return jax.vmap(lambda c, n, s: jax.lax.dynamic_update_slice(c, n, (zero, zero, s)))(
        cache_BxGxKxS, new_BxGxKxT, start_B.astype(jnp.int32)
    )


def rows_attention(
    q_BxTxHxK: jax.Array, k_BxGxKxS: jax.Array, v_BxGxSxK: jax.Array, visible_BxTxS: jax.Array
) -> jax.Array:
    """T queries per row against the cache: `cached_attention` (same numerics) for T >= 1."""
    B, T, H, K = q_BxTxHxK.shape
    G = k_BxGxKxS.shape[1]
    q_BxTxGxRxK = q_BxTxHxK.reshape(B, T, G, H // G, K)
    logits_BxGxRxTxS = jnp.einsum(
        "btgrk,bgks->bgrts", q_BxTxGxRxK, k_BxGxKxS, preferred_element_type=jnp.float32
    ) * jnp.float32(K**-0.5)
    large_negative = jnp.float32(-0.7 * float(jnp.finfo(jnp.float32).max))
    visible = visible_BxTxS[:, None, None, :, :]
    logits_BxGxRxTxS = jnp.where(visible, logits_BxGxRxTxS, large_negative)
    probs_BxGxRxTxS = jax.nn.softmax(logits_BxGxRxTxS, axis=-1).astype(v_BxGxSxK.dtype)
    o_BxTxGxRxK = jnp.einsum("bgrts,bgsk->btgrk", probs_BxGxRxTxS, v_BxGxSxK)
    return o_BxTxGxRxK.reshape(B, T, H, K)


def extend(
    params: Params,
    tokens_BxT: jax.Array,
    start_B: jax.Array,
    last_B: jax.Array,
    cache: KVCache,
    config: LlamaConfig,
) -> tuple[jax.Array, KVCache]:
    """Append T tokens per row at that row's own slots start[b] .. start[b] + T - 1: fp32
    logits B x V of each row's token `last[b]`, and the cache.

    Unlike `prefill`/`decode_step` (rows left-padded to end on one shared slot), a row's
    tokens sit in its slots 0 .. length-1 with rotary position = slot, so rows of different
    lengths grow independently: a conversation appends its next turn where it stopped, with
    no padding between turns. A row's query at slot p sees slots 0 .. p. Rows are
    right-padded: tokens after a row's real ones land after its end, where no query of it
    looks, and its next tokens overwrite them. Every start[b] + T must be <= S. T = 1 is
    one decode step at per-row slots.
    """
    B, T = tokens_BxT.shape
    positions_BxT = start_B[:, None].astype(jnp.int32) + jnp.arange(T, dtype=jnp.int32)[None, :]
    cos_BxTxK2, sin_BxTxK2 = rope_angles(positions_BxT, rope_inv_freq(config))
    slot_S = jnp.arange(cache.length, dtype=jnp.int32)
    visible_BxTxS = slot_S[None, None, :] <= positions_BxT[:, :, None]
    x_BxTxD = embed_tokens(params, tokens_BxT, config)
    ks, vs = list(cache.k), list(cache.v)
    for i, layer in enumerate(_layers(params, config)):
        q_BxTxHxK, k_BxTxGxK, v_BxTxGxK = attention_qkv(
            x_BxTxD, layer, config, cos_BxTxK2, sin_BxTxK2
        )
        ks[i], vs[i] = (
            _write_key_rows(ks[i], k_BxTxGxK, start_B),
            _write_rows(vs[i], v_BxTxGxK, start_B),
        )
        o_BxTxHxK = rows_attention(q_BxTxHxK, ks[i], vs[i], visible_BxTxS)
        x_BxTxD = mlp_residual(attention_residual(x_BxTxD, o_BxTxHxK, layer, config), layer, config)
    # The head over one token per row: T times less of the largest matmul.
    x_Bx1xD = jnp.take_along_axis(x_BxTxD, last_B.astype(jnp.int32)[:, None, None], axis=1)
    x_Bx1xD = rms_norm(x_Bx1xD, params["final_norm"], config.norm_eps)
    return output_head(params, x_Bx1xD, config)[:, 0], KVCache(tuple(ks), tuple(vs))

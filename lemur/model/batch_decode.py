"""Batched generation below eval: greedy or sampled token ids over the KV cache.

What the lm-evaluation-harness model (lemur.model.harness_lm) generates with, in the
model layer so that the training loop's harness hook can run `generate_until` tasks too
(lemur.eval.generate is the richer decoder of `lemur-eval generate`: chat prompts, per-row
prefill, long-prompt policies; train may not import eval).

One batch: prompts left-padded to a bucket length P (lemur.model.scoring's buckets) and
prefilled together into a cache of P + new-token slots, then `CHUNK` decode steps per device
call (a `lax.scan` whose state is donated, so the cache is updated in place). Between calls
the host checks stop ids and the caller's stop test (e.g. stop strings), and ends as soon
as every row is done. Row counts are powers of two (dummy rows fill the rest), so a run
compiles a few shapes, not one per batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lemur.model import decode
from lemur.model.config import LlamaConfig, Params
from lemur.model.scoring import bucket_length

CHUNK = 16  # decode steps per device call: host checks are this many tokens apart


class Sampling(NamedTuple):
    """How each next token is chosen: temperature 0 is greedy (argmax); else softmax of
    logits / temperature, restricted to the top_k ids (0: all) and the top_p mass (1: all)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0


class _State(NamedTuple):
    """A batch between decode chunks: cache, last chosen tokens, next slot, random key."""

    cache: decode.KVCache
    token_B: jax.Array
    slot: jax.Array
    key: jax.Array


def choose(logits_BxV: jax.Array, key: jax.Array, sampling: Sampling) -> jax.Array:
    """Next token per row (int32) under `sampling`."""
    if sampling.temperature == 0:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
    logits_BxV = logits_BxV.astype(jnp.float32) / sampling.temperature
    if sampling.top_k > 0:
        kth_B = jax.lax.top_k(logits_BxV, sampling.top_k)[0][:, -1:]
        logits_BxV = jnp.where(logits_BxV < kth_B, -jnp.inf, logits_BxV)
    if sampling.top_p < 1.0:
        sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
        mass_BxV = jnp.cumsum(jax.nn.softmax(sorted_BxV, axis=-1), axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first id always stays).
        keep_B = jnp.sum(mass_BxV - jax.nn.softmax(sorted_BxV, axis=-1) < sampling.top_p, -1)
        cutoff_B = jnp.take_along_axis(sorted_BxV, keep_B[:, None] - 1, axis=-1)
        logits_BxV = jnp.where(logits_BxV < cutoff_B, -jnp.inf, logits_BxV)
    return jax.random.categorical(key, logits_BxV, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("config", "slots", "sampling"))
def _start(
    params: Params,
    tokens_BxP: jax.Array,
    pad_B: jax.Array,
    key: jax.Array,
    *,
    config: LlamaConfig,
    slots: int,
    sampling: Sampling,
) -> _State:
    """Prefill the left-padded prompts into a cache of `slots` and choose the first tokens."""
    B, P = tokens_BxP.shape
    cache = decode.init_cache(config, B, slots)
    logits_BxV, cache = decode.prefill(params, tokens_BxP, pad_B, cache, config, last_only=True)
    key, sub = jax.random.split(key)
    return _State(cache, choose(logits_BxV, sub, sampling), jnp.asarray(P, jnp.int32), key)


@functools.partial(jax.jit, static_argnames=("config", "sampling"), donate_argnums=1)
def _chunk(
    params: Params, state: _State, pad_B: jax.Array, *, config: LlamaConfig, sampling: Sampling
) -> tuple[_State, jax.Array]:
    """CHUNK decode steps: feed each row's token at the state's slot, choose the next."""

    def body(carry: _State, _: None) -> tuple[_State, jax.Array]:
        logits_BxV, cache = decode.decode_step(
            params, carry.token_B, carry.slot, pad_B, carry.cache, config
        )
        key, sub = jax.random.split(carry.key)
        next_B = choose(logits_BxV, sub, sampling)
        return _State(cache, next_B, carry.slot + 1, key), next_B

    state, out_TxB = jax.lax.scan(body, state, None, length=CHUNK)
    return state, out_TxB.T


def _take(row: list[int], new: Sequence[int], max_new: int, stop_ids: frozenset[int]) -> bool:
    """Append `new` to a row up to a stop id (kept) or max_new tokens; whether it ended."""
    for t in new:
        row.append(int(t))
        if t in stop_ids or len(row) >= max_new:
            return True
    return False


def generate_tokens(
    config: LlamaConfig,
    params: Params,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    stop_ids: Sequence[int],
    sampling: Sampling,
    key: jax.Array,
    is_done: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """New tokens of each prompt: at most `max_new`, ending at the first stop id (kept), or
    earlier once `is_done(row, tokens so far)` says so (checked every CHUNK tokens).

    Prompts plus max_new must fit the context (ValueError otherwise); at least one prompt
    token each.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt of no tokens: nothing to condition on")
    longest = max(len(p) for p in prompts)
    if longest + max_new > config.max_seq_len:
        raise ValueError(
            f"a prompt of {longest} tokens plus {max_new} new ones exceeds the model's "
            f"context (max_seq_len {config.max_seq_len})"
        )
    rows = 1 << max(0, (len(prompts) - 1).bit_length())
    P = bucket_length(longest)
    tokens_BxP = np.zeros((rows, P), np.int32)
    pad_B = np.full(rows, P - 1, np.int32)  # a dummy row: one token 0
    for b, p in enumerate(prompts):
        tokens_BxP[b, P - len(p) :] = p
        pad_B[b] = P - len(p)
    slots = P + -(-max(max_new - 1, 1) // CHUNK) * CHUNK
    state = _start(params, tokens_BxP, pad_B, key, config=config, slots=slots, sampling=sampling)
    stops = frozenset(int(s) for s in stop_ids)
    out: list[list[int]] = [[] for _ in prompts]
    first_B = np.asarray(state.token_B)
    done = [_take(out[b], first_B[b : b + 1], max_new, stops) for b in range(len(prompts))]
    while not all(done):
        done = [d or (is_done is not None and is_done(b, out[b])) for b, d in enumerate(done)]
        if all(done):
            break
        state, new_BxT = _chunk(params, state, pad_B, config=config, sampling=sampling)
        new_BxT = np.asarray(new_BxT)
        for b in range(len(prompts)):
            done[b] = done[b] or _take(out[b], new_BxT[b], max_new, stops)
    return out

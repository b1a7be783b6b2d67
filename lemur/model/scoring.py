"""Per-token log-probabilities of whole token sequences: what loglikelihood scoring reads.

`token_logprobs(config, params, sequences, batch_size)` returns, for each sequence of n
tokens, the log-probability of tokens 1 .. n-1 given the ones before (token 0 has no
context, so it gets none) and whether each was the model's greedy (argmax) choice. The
lm-evaluation-harness model (lemur.model.harness_lm), the training loop's harness hook and
`lemur-eval serve`'s `echo` + `logprobs` all score through it.

Sequences run longest first, right-padded (causal attention: padding after a token never
changes it) to a few bucket lengths (16, 24, 32, 48, 64, ...: powers of two and halfway),
in batches whose row count is a power of two, so XLA compiles a handful of shapes however
many lengths come in. Only the B x L gathered log-probabilities and greedy flags leave the
device, never the B x L x V logits; a batch's rows are capped so its logits stay within
`TOKEN_BUDGET` tokens' worth.

`top_tokens(config, params, sequences, k, batch_size)` scores the same way and also gives
the k most likely next tokens after every token, the last included (what the sequence
would continue with): `lemur-eval serve`'s `top_logprobs`, and its greedy next token for
an `echo` request, read off the one forward pass that scores the prompt.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lemur.model import llama
from lemur.model.config import LlamaConfig, Params

# Rows x length per batch at most (when batch_size allows): the fp32 logits of a batch are
# this many times the vocabulary, 8192 x 32000 x 4 bytes = 1 GiB.
TOKEN_BUDGET = 8192


class TokenScores(NamedTuple):
    """One sequence's scores: logprobs[i] = log p(tokens[i + 1] | tokens[: i + 1]) (fp32,
    n - 1 of them) and greedy[i] whether tokens[i + 1] was that position's argmax."""

    logprobs: np.ndarray
    greedy: np.ndarray


class TopTokens(NamedTuple):
    """One sequence's most likely next tokens: ids[i] and logprobs[i] (fp32) the k most
    likely tokens after tokens[: i + 1], most likely first (n rows of k; the last row
    continues the whole sequence)."""

    ids: np.ndarray
    logprobs: np.ndarray


def bucket_length(n: int, minimum: int = 16) -> int:
    """The smallest of minimum * (1, 1.5, 2, 3, 4, 6, ...) that is >= n (at most a third
    of a batch is length padding)."""
    b = minimum
    while b < n:
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return b


def _rows_for(length: int, batch_size: int, count: int) -> int:
    """Rows of a batch of `length`: batch_size, capped by the token budget and by the
    sequences left (rounded up to a power of two, so shapes repeat)."""
    cap = max(1, min(batch_size, TOKEN_BUDGET // length))
    cap = 1 << (cap.bit_length() - 1)  # a power of two <= cap
    need = 1 << max(0, (count - 1).bit_length())  # a power of two >= count
    return min(cap, need)


@functools.partial(jax.jit, static_argnames="config")
def _score_batch(
    params: Params, inputs_BxL: jax.Array, targets_BxL: jax.Array, *, config: LlamaConfig
) -> tuple[jax.Array, jax.Array]:
    """Log-probability (fp32) and greedy flag of each target given the inputs up to it."""
    logits_BxLxV = llama.forward(params, inputs_BxL, config)
    logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
    logp_BxL = jnp.take_along_axis(logp_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    greedy_BxL = jnp.argmax(logits_BxLxV, axis=-1) == targets_BxL
    return logp_BxL, greedy_BxL


@functools.partial(jax.jit, static_argnames=("config", "k"))
def _top_batch(
    params: Params, tokens_BxL: jax.Array, *, config: LlamaConfig, k: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`_score_batch`'s scores, and the k most likely next tokens after every position
    (B x L x k logprobs and ids) from the same forward pass."""
    logits_BxLxV = llama.forward(params, tokens_BxL, config)
    logp_BxLxV = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
    target_BxL = tokens_BxL[:, 1:]
    logp_BxL = jnp.take_along_axis(logp_BxLxV[:, :-1], target_BxL[..., None], axis=-1)[..., 0]
    greedy_BxL = jnp.argmax(logits_BxLxV[:, :-1], axis=-1) == target_BxL
    if k == 1:  # lm-eval's request: a max and an argmax, not XLA's CPU sort of top_k
        top_ids_BxLxk = jnp.argmax(logp_BxLxV, axis=-1)[..., None].astype(jnp.int32)
        top_logp_BxLxk = jnp.take_along_axis(logp_BxLxV, top_ids_BxLxk, axis=-1)
    else:
        top_logp_BxLxk, top_ids_BxLxk = jax.lax.top_k(logp_BxLxV, k)
    return logp_BxL, greedy_BxL, top_logp_BxLxk, top_ids_BxLxk


def top_tokens(
    config: LlamaConfig,
    params: Params,
    sequences: Sequence[Sequence[int]],
    k: int,
    batch_size: int = 16,
) -> list[tuple[TokenScores, TopTokens]]:
    """`token_logprobs` of each sequence (of one token or more) with its `TopTokens`: the k
    most likely tokens after each of its tokens, the last included. Longest first in
    buckets, as `token_logprobs`; results in the given order."""
    if not 1 <= k <= config.vocab_size:
        raise ValueError(f"k must be in 1 .. {config.vocab_size}, not {k}")
    if batch_size < 1 or any(len(s) == 0 for s in sequences):
        raise ValueError("batch_size must be >= 1 and every sequence hold a token")
    check_lengths(config, sequences)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    out: list[tuple[TokenScores, TopTokens]] = [None] * len(sequences)  # type: ignore[list-item]
    start = 0
    while start < len(order):
        length = bucket_length(len(sequences[order[start]]))
        rows = _rows_for(length, batch_size, len(order) - start)
        chunk = order[start : start + rows]
        tokens = np.zeros((rows, length), np.int32)
        for r, i in enumerate(chunk):
            tokens[r, : len(sequences[i])] = sequences[i]
        got = [np.asarray(a) for a in _top_batch(params, tokens, config=config, k=k)]
        for r, i in enumerate(chunk):
            n = len(sequences[i])
            scores = TokenScores(got[0][r, : n - 1].copy(), got[1][r, : n - 1].copy())
            out[i] = (scores, TopTokens(got[3][r, :n].copy(), got[2][r, :n].copy()))
        start += len(chunk)
    return out


def check_lengths(config: LlamaConfig, sequences: Sequence[Sequence[int]]) -> None:
    """Raise ValueError naming the first sequence longer than the model's context."""
    for i, seq in enumerate(sequences):
        if len(seq) > config.max_seq_len:
            raise ValueError(
                f"sequence {i} has {len(seq)} tokens, more than the model's context "
                f"(max_seq_len {config.max_seq_len})"
            )


def token_logprobs(
    config: LlamaConfig,
    params: Params,
    sequences: Sequence[Sequence[int]],
    batch_size: int = 16,
) -> list[TokenScores]:
    """Per-token log-probabilities and greedy flags of each sequence (in the given order).

    A sequence of n tokens gets n - 1 scores (an empty or one-token one gets none); its
    last token is only a target, never an input, so it may hold max_seq_len + 1 tokens
    (ValueError beyond: the caller truncates, as it sees fit). Batches are dispatched
    before any result is read back, so the host's padding overlaps the device's work.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    for i, seq in enumerate(sequences):
        if len(seq) > config.max_seq_len + 1:
            raise ValueError(
                f"sequence {i} has {len(seq)} tokens, more than the model's context "
                f"(max_seq_len {config.max_seq_len}) plus the last, predicted one"
            )
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    order = [i for i in order if len(sequences[i]) >= 2]
    pending: list[tuple[list[int], jax.Array, jax.Array]] = []
    start = 0
    while start < len(order):
        length = bucket_length(len(sequences[order[start]]) - 1)  # the inputs: all but the last
        rows = _rows_for(length, batch_size, len(order) - start)
        chunk = order[start : start + rows]
        inputs, targets = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
        for r, i in enumerate(chunk):
            seq = np.asarray(sequences[i], np.int32)
            inputs[r, : len(seq) - 1], targets[r, : len(seq) - 1] = seq[:-1], seq[1:]
        logp, greedy = _score_batch(params, inputs, targets, config=config)
        pending.append((chunk, logp, greedy))
        start += len(chunk)
    empty = TokenScores(np.zeros(0, np.float32), np.zeros(0, bool))
    out: list[TokenScores] = [empty] * len(sequences)
    for chunk, logp, greedy in pending:
        logp_host, greedy_host = np.asarray(logp), np.asarray(greedy)
        for r, i in enumerate(chunk):
            n = len(sequences[i]) - 1
            out[i] = TokenScores(logp_host[r, :n].copy(), greedy_host[r, :n].copy())
    return out

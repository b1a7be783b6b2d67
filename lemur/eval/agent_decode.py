"""Batched multi-turn decoding: each conversation keeps its KV cache across turns.

A `TurnDecoder` holds one cache of B rows. A conversation owns a row while it lasts; its
tokens fill that row's slots 0 .. length-1 (lemur.model.decode.extend: no left padding,
positions = slots), so each turn appends only what is new: the ids of the turn's prompt
(the chat template of the whole transcript) after the longest prefix already in the row
(normally the previous prompt and the reply, so only the closing of the reply, the
observation and the next generation header), then decodes. The reply tokens the model
chose are in the cache already; if re-encoding the reply's text gives other ids (a
non-canonical tokenization) the row is cut back to the common prefix and the rest is
prefilled, so every turn's prompt is exactly the template's ids. With `reuse=False` every
turn prefills its whole prompt from slot 0 instead (the baseline tools/bench_agent.py
times).

Conversations finish at different turns: a finished one frees its row for the next task
(the row's length goes back to 0), so a batch stays full while tasks remain. Prefill is
fed in pieces of at most `prefill_chunk` tokens (right-padded to a bucket, so it compiles
once per bucket); decoding runs `chunk` steps per device call like lemur.eval.generate,
with the same stop handling (end of sequence, stop strings, length). Rows that are done
stop advancing; what a row wrote past its end is never read and is overwritten.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lemur.cli_common import UserError
from lemur.eval.decoding import (
    Completion,
    DecodeState,
    GenerationConfig,
    RowState,
    bucket,
    extend_row,
    first_tokens,
    stop_ids_of,
)
from lemur.eval.sampling import Sampling, sample
from lemur.model import decode
from lemur.model.config import LlamaConfig, Params
from lemur.tokenizer import Tokenizer


@functools.partial(jax.jit, static_argnames="config", donate_argnums=4)
def _extend(
    params: Params,
    tokens_BxT: jax.Array,
    start_B: jax.Array,
    last_B: jax.Array,
    cache: decode.KVCache,
    *,
    config: LlamaConfig,
) -> tuple[jax.Array, decode.KVCache]:
    """decode.extend, compiled once per (B, T, S) and updating the cache in place."""
    return decode.extend(params, tokens_BxT, start_B, last_B, cache, config)


@functools.partial(jax.jit, static_argnames="length")
def _grow(cache: decode.KVCache, *, length: int) -> decode.KVCache:
    """The cache with slots added at the end, up to `length` (compiled per shape)."""
    return decode.grow_cache(cache, length)


@functools.partial(
    jax.jit, static_argnames=("config", "sampling", "steps", "eos_ids"), donate_argnums=1
)
def _continue_rows(
    params: Params,
    state: DecodeState,
    *,
    config: LlamaConfig,
    sampling: Sampling,
    steps: int,
    eos_ids: tuple[int, ...],
) -> tuple[DecodeState, jax.Array]:
    """`steps` decode steps: feed each row's token at its length (the state's position),
    sample; done rows stay put (a row is done once it fed one of `eos_ids`).
    (state after, new B x steps)"""
    stop = jnp.asarray(eos_ids, jnp.int32)

    def body(carry: DecodeState, _: None) -> tuple[DecodeState, jax.Array]:
        cache, token_B, length_B, key, done_B = carry
        last_B = jnp.zeros_like(length_B)
        logits_BxV, cache = decode.extend(params, token_B[:, None], length_B, last_B, cache, config)
        done_B = done_B | jnp.isin(token_B, stop)
        length_B = length_B + (~done_B).astype(length_B.dtype)
        key, sub = jax.random.split(key)
        next_B = jnp.where(done_B, eos_ids[0], sample(logits_BxV, sub, sampling))
        return DecodeState(cache, next_B, length_B, key, done_B), next_B

    state, out_TxB = jax.lax.scan(body, state, None, length=steps)
    return state, out_TxB.T


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


@dataclasses.dataclass
class Turn:
    """One turn's generation: the completion and what it cost in prefill."""

    completion: Completion
    prompt_ids: list[int]
    prefilled: int  # prompt tokens run through the model this turn (the rest was cached)


class TurnDecoder:
    """A KV cache of `batch_size` rows shared by conversations that come and go.

    Stop strings need `tokenizer`; generation ends at `eos_id` (an id or several; default
    the tokenizer's stop ids: its EOS and a model folder's generation_config ones).
    """

    def __init__(
        self,
        params: Params,
        config: LlamaConfig,
        gen: GenerationConfig,
        *,
        tokenizer: Tokenizer | None = None,
        eos_id: int | Sequence[int] | None = None,
        reuse: bool = True,
        prefill_chunk: int = 256,
    ) -> None:
        self.params, self.config, self.tokenizer, self.gen = params, config, tokenizer, gen
        if eos_id is None and tokenizer is not None:
            eos_id = tokenizer.stop_ids
        self.eos_ids = stop_ids_of(eos_id if gen.stop_at_eos else None)
        self.reuse, self.prefill_chunk = reuse, prefill_chunk
        self.rows: list[Hashable | None] = [None] * gen.batch_size  # the conversation per row
        self.ids: list[list[int]] = [[] for _ in range(gen.batch_size)]  # in the row's cache
        self.cache = decode.init_cache(config, gen.batch_size, bucket(256))
        self.key = jax.random.key(gen.seed)
        self.calls = 0  # reply calls so far: call n samples with fold_in(key, n)

    def fits(self, prompt_tokens: int) -> bool:
        """Whether a prompt this long leaves room for a whole reply within max_seq_len."""
        return prompt_tokens + self.gen.max_new_tokens <= self.config.max_seq_len

    def release(self, conversation: Hashable) -> None:
        """Free a finished conversation's row."""
        b = self.rows.index(conversation)
        self.rows[b], self.ids[b] = None, []

    def _row(self, conversation: Hashable) -> int:
        """The row of a conversation, a free one for a new conversation."""
        if conversation in self.rows:
            return self.rows.index(conversation)
        b = self.rows.index(None)  # ValueError: more conversations than rows
        self.rows[b], self.ids[b] = conversation, []
        return b

    def _ensure(self, slots: int) -> None:
        """Grow the cache to hold `slots` slots (a bucket, so shapes stay few)."""
        if slots > self.cache.length:
            self.cache = _grow(self.cache, length=bucket(slots, 256))

    def _prefill(self, rows: list[int], deltas: list[list[int]], starts: list[int]) -> jax.Array:
        """Feed each row's new ids after its kept prefix: the logits after each one's last id."""
        B, C = self.gen.batch_size, self.prefill_chunk
        done = [0] * len(rows)
        last: list[jax.Array | None] = [None] * len(rows)
        while any(d < len(delta) for d, delta in zip(done, deltas, strict=True)):
            T = bucket(max(min(C, len(delta) - d) for d, delta in zip(done, deltas, strict=True)))
            tokens, start, last_i = np.zeros((B, T), np.int32), np.zeros(B, np.int32), np.zeros(B)
            for i, b in enumerate(rows):
                piece = deltas[i][done[i] : done[i] + T]
                tokens[b, : len(piece)], start[b] = piece, starts[i] + done[i]
                last_i[b] = max(len(piece) - 1, 0)
            for b in set(range(B)) - set(rows):
                start[b] = len(self.ids[b])  # other rows write padding past their end
            self._ensure(int(start.max()) + T)
            logits, self.cache = _extend(
                self.params, tokens, start, last_i.astype(np.int32), self.cache, config=self.config
            )
            for i, b in enumerate(rows):
                n = len(deltas[i]) - done[i]
                if 0 < n <= T:
                    last[i] = logits[b]
                done[i] += min(n, T)
        return jnp.stack(last)

    def reply(self, requests: Sequence[tuple[Hashable, list[int]]]) -> list[Turn]:
        """The next reply of each (conversation, prompt ids) request, in order."""
        rows = [self._row(c) for c, _ in requests]
        prompts = [list(p) for _, p in requests]
        if not all(self.fits(len(p)) for p in prompts):
            raise UserError("a prompt leaves no room to reply within max_seq_len")
        starts = []
        for b, prompt in zip(rows, prompts, strict=True):
            keep = common_prefix(self.ids[b], prompt) if self.reuse else 0
            starts.append(min(keep, len(prompt) - 1))  # at least one id to get logits from
        deltas = [p[s:] for p, s in zip(prompts, starts, strict=True)]
        logits_RxV = self._prefill(rows, deltas, starts)
        call_key = jax.random.fold_in(self.key, self.calls)
        self.calls += 1
        first_R, call_key = first_tokens(logits_RxV, call_key, sampling=self.gen.sampling)
        states = self._decode(rows, prompts, np.asarray(first_R), call_key)
        return [
            Turn(s.completion(), p, len(d)) for p, s, d in zip(prompts, states, deltas, strict=True)
        ]

    def _decode(
        self, rows: list[int], prompts: list[list[int]], first: np.ndarray, key: jax.Array
    ) -> list[RowState]:
        """Decode from each row's first token until every row is done; set the rows' ids."""
        gen, B = self.gen, self.gen.batch_size
        eos = self.eos_ids
        states = [RowState(prompt=p) for p in prompts]
        raw: list[list[int]] = [[int(t)] for t in first]  # every token sampled, fed or not
        # Rows not replying write past their end (their tokens stay), without advancing.
        token, length = np.zeros(B, np.int32), np.array([len(i) for i in self.ids], np.int32)
        for i, b in enumerate(rows):
            token[b], length[b] = first[i], len(prompts[i])
            extend_row(states[i], [int(first[i])], gen, eos, self.tokenizer)
        self._ensure(int(length.max()) + gen.decode_slots + 1)
        done = np.zeros(B, bool)
        state = DecodeState(self.cache, jnp.asarray(token), jnp.asarray(length), key, done)
        while any(s.finish is None for s in states):
            done = np.ones(B, bool)
            for i, b in enumerate(rows):
                done[b] = states[i].finish is not None
            state, new_BxT = _continue_rows(
                self.params,
                state._replace(done_B=done),
                config=self.config,
                sampling=gen.sampling,
                steps=gen.chunk,
                eos_ids=eos,
            )
            self.cache, new_BxT = state.cache, np.asarray(new_BxT)
            for i, b in enumerate(rows):
                if states[i].finish is None:
                    raw[i].extend(int(t) for t in new_BxT[b])
                    extend_row(states[i], new_BxT[b], gen, eos, self.tokenizer)
        lengths = np.asarray(state.position)
        for i, b in enumerate(rows):  # what the row's slots hold: the prompt, the fed tokens
            self.ids[b] = prompts[i] + raw[i][: int(lengths[b]) - len(prompts[i])]
        return states

"""Text generation over the KV-cache path: greedy or sampled, batched, with stop strings.

Prompts of different lengths share a batch by left padding (lemur.model.decode). Shapes
come from buckets, so compilation happens once per (batch, prompt bucket, cache bucket)
and sampling setting, never per prompt or output length: the prompt slots P are the
bucket (16, 24, 32, 48, 64, 96, ...: powers of two and halfway, so at most a third is
padding) of the longest prompt, the cache slots S = P plus the new tokens (rounded up to
whole chunks; the number of new tokens is one setting per run).
Decoding runs `chunk` steps per device call (`decode_chunk`: a `lax.scan` with its state
donated, so the cache is updated in place); between calls the host checks end-of-sequence
and stop strings (lemur.eval.decoding, shared with the agent's decoder), and stops as soon
as every row is done. Decoding reads per-layer weights
(`decode.split_layers`): pass split params to skip the copy each call would make.

How each next token is chosen is lemur.eval.sampling (greedy, temperature, top-k,
top-p). The random stream is `jax.random.key(seed)` folded with the batch's index, so a run is
reproducible for a given seed, prompt list and batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lemur import machine
from lemur.chat_template.spans import AddedTokens
from lemur.chatml import IM_END as CHATML_END
from lemur.cli_common import UserError
from lemur.eval.chat_prompt import ChatPrompt, chat_prompt_ids, model_template
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
from lemur.tokenizer import ByteLevelTokenizer, Tokenizer


@functools.partial(jax.jit, static_argnames="config")
def prefill_row(
    params: Params, tokens_1xP: jax.Array, pad_1: jax.Array, *, config: LlamaConfig
) -> tuple[jax.Array, decode.KVCache]:
    """One prompt left-padded to its own bucket: last-slot logits (1 x V) and its cache
    (compiled once per bucket)."""
    cache = decode.init_cache(config, 1, tokens_1xP.shape[1])
    return decode.prefill(params, tokens_1xP, pad_1, cache, config, last_only=True)


@functools.partial(jax.jit, donate_argnums=0)
def _insert(
    cache: decode.KVCache, row_cache: decode.KVCache, row: jax.Array, offset: jax.Array
) -> decode.KVCache:
    """`decode.insert_row`, compiled once per shape and updating the cache in place."""
    return decode.insert_row(cache, row_cache, row, offset)


_empty_cache = jax.jit(decode.init_cache, static_argnums=(0, 1, 2))


def _start(
    params: Params,
    rows: list[RowState],
    P: int,
    S: int,
    key: jax.Array,
    config: LlamaConfig,
    sampling: Sampling,
) -> DecodeState:
    """Prefill each prompt in its own bucket into one B x S cache, every prompt ending at
    slot P - 1 (left padding), then sample the first new tokens: the state to decode from
    (at slot P; no row done yet).

    One prompt at a time rather than the batch left-padded to the longest: a batch of
    mixed lengths then computes each prompt's own bucket, not B times the longest.
    """
    cache = _empty_cache(config, len(rows), S)
    logits = []
    for b, r in enumerate(rows):
        Pb = bucket(len(r.prompt))
        tokens_1xP = np.zeros((1, Pb), np.int32)
        tokens_1xP[0, Pb - len(r.prompt) :] = r.prompt
        pad_1 = np.array([Pb - len(r.prompt)], np.int32)
        logits_1xV, row_cache = prefill_row(params, tokens_1xP, pad_1, config=config)
        cache = _insert(cache, row_cache, np.int32(b), np.int32(P - Pb))
        logits.append(logits_1xV)
    token_B, key = first_tokens(jnp.concatenate(logits), key, sampling=sampling)
    done_B = np.zeros(len(rows), bool)
    return DecodeState(cache, token_B, jnp.asarray(P, jnp.int32), key, done_B)


@functools.partial(jax.jit, static_argnames=("config", "sampling", "steps"), donate_argnums=1)
def decode_chunk(
    params: Params,
    state: DecodeState,
    pad_B: jax.Array,
    eos_ids: jax.Array,
    *,
    config: LlamaConfig,
    sampling: Sampling,
    steps: int,
) -> tuple[DecodeState, jax.Array]:
    """`steps` decode steps of a left-padded batch (its state donated, so the cache is
    updated in place): feed each row's token at the state's slot, sample, repeat. A row is
    done once it fed one of `eos_ids`; done rows emit the first. (state after, new B x steps)

    Compiled once per (batch, cache length, sampling, steps): `eos_ids` is traced.
    """

    def body(carry: DecodeState, _: None) -> tuple[DecodeState, jax.Array]:
        cache, token_B, slot, key, done_B = carry
        logits_BxV, cache = decode.decode_step(params, token_B, slot, pad_B, cache, config)
        key, sub = jax.random.split(key)
        done_B = done_B | jnp.isin(token_B, eos_ids)
        next_B = jnp.where(done_B, eos_ids[0], sample(logits_BxV, sub, sampling))
        return DecodeState(cache, next_B, slot + 1, key, done_B), next_B

    state, out_TxB = jax.lax.scan(body, state, None, length=steps)
    return state, out_TxB.T


def _run_batch(
    params: Params,
    config: LlamaConfig,
    rows: list[RowState],
    gen: GenerationConfig,
    eos_ids: tuple[int, ...],
    key: jax.Array,
    tokenizer: Tokenizer | None,
) -> None:
    """Generate for one batch of rows (left-padded in one cache), filling the rows."""
    P = bucket(max(len(r.prompt) for r in rows))
    pad_B = np.array([P - len(r.prompt) for r in rows], np.int32)
    S = P + gen.decode_slots  # P is a bucket and max_new_tokens is fixed per run
    state = _start(params, rows, P, S, key, config, gen.sampling)
    first_B = np.asarray(state.token_B)
    for b, r in enumerate(rows):
        extend_row(r, [first_B[b]], gen, eos_ids, tokenizer)
    # Traced and padded to a fixed size: a new set of ids compiles nothing new.
    eos_4 = np.pad(np.asarray(eos_ids, np.int32), (0, max(0, 4 - len(eos_ids))), mode="edge")
    while any(r.finish is None for r in rows):
        done_B = np.array([r.finish is not None for r in rows])
        state, new_BxT = decode_chunk(
            params,
            state._replace(done_B=done_B),
            pad_B,
            eos_4,
            config=config,
            sampling=gen.sampling,
            steps=gen.chunk,
        )
        new_BxT = np.asarray(new_BxT)
        for b, r in enumerate(rows):
            if r.finish is None:
                extend_row(r, new_BxT[b], gen, eos_ids, tokenizer)


def check_cache_fits(config: LlamaConfig, batch: int, longest: int, gen: GenerationConfig) -> None:
    """UserError naming --max-new-tokens and --batch-size when the KV cache of the longest
    batch would not fit the device: XLA would fail the allocation with a traceback (or, on a
    host that overcommits, the kernel would kill the process without a word)."""
    length = bucket(longest) + gen.decode_slots
    itemsize = jnp.dtype(config.compute_dtype).itemsize
    need = 2 * config.n_layers * batch * length * config.n_kv_heads * config.head_dim * itemsize
    if need > (limit := machine.device_memory_bytes()):
        raise UserError(
            f"the KV cache of {batch} x {length:,} tokens ({longest} of prompt + "
            f"--max-new-tokens {gen.max_new_tokens:,}) needs {need / 2**30:,.1f} GiB, more "
            f"than the device's {limit / 2**30:,.1f} GiB: lower --max-new-tokens or --batch-size"
        )


def generate_ids(
    params: Params,
    config: LlamaConfig,
    prompts: Sequence[Sequence[int]],
    gen: GenerationConfig,
    *,
    eos_id: int | Sequence[int] | None = None,
    tokenizer: Tokenizer | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Completion]:
    """Complete token-id prompts (each already holding its <s>), in the given order.

    Prompts are sorted by length and batched `gen.batch_size` at a time, so rows of a batch
    need little padding. A row ends at `eos_id` (or any of several ids: a chat model's EOS
    and end of turn); None never stops at eos. Stop strings need `tokenizer`.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token")
    if (longest := max(len(p) for p in prompts)) > config.max_seq_len:
        raise UserError(f"a prompt of {longest} tokens exceeds max_seq_len {config.max_seq_len}")
    if gen.stop and tokenizer is None:
        raise ValueError("stop strings need a tokenizer")
    check_cache_fits(config, min(gen.batch_size, len(prompts)), longest, gen)
    if eos_id is None:
        gen = dataclasses.replace(gen, stop_at_eos=False)
    eos_ids = stop_ids_of(eos_id)
    params = decode.split_layers(params)  # a no-op for split params
    rows = [RowState(prompt=[int(t) for t in p]) for p in prompts]
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].prompt))
    base = jax.random.key(gen.seed)
    if progress is not None:
        progress(0, len(order))
    for n, start in enumerate(range(0, len(order), gen.batch_size)):
        batch = [rows[i] for i in order[start : start + gen.batch_size]]
        _run_batch(
            params,
            config,
            batch,
            gen,
            eos_ids,
            jax.random.fold_in(base, n),
            tokenizer,
        )
        if progress is not None:
            progress(min(start + gen.batch_size, len(order)), len(order))
    return [r.completion() for r in rows]


_added: weakref.WeakKeyDictionary[Any, AddedTokens] = weakref.WeakKeyDictionary()


def text_prompt_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """A text prompt's ids as transformers' `tokenizer(text)` gives them: the model's BOS
    (none for a model that frames documents without one, Qwen2.5), then the text; in a
    tokenizer.json model's text every added token it spells is that token's id (a Qwen2.5-
    Coder prompt's `<|fim_prefix|>` is the marker, as there) and each run between them is
    encoded alone. Training text never becomes a control id (`Tokenizer.encode`); a prompt
    is the user's own, so it is read as transformers reads it."""
    head = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
    if not isinstance(tokenizer, ByteLevelTokenizer):
        return [*head, *tokenizer.encode(text)]
    if tokenizer not in _added:  # the template's literal text only decides control ids
        _added[tokenizer] = AddedTokens(tokenizer.files, "")
    ids, at = head, 0
    for start, end, token_id in _added[tokenizer].find(text):
        ids += tokenizer.encode(text[at:start]) if at < start else []
        ids.append(token_id)
        at = end
    return ids + (tokenizer.encode(text[at:]) if at < len(text) else [])


def chat_ends(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Where a chat reply ends: (end ids, stop strings). A tokenizer.json model's template
    names its end-of-turn ids; a ChatML model ends at its EOS or the text `<|im_end|>`."""
    template = model_template(tokenizer)
    if template is None:
        return tokenizer.stop_ids, (CHATML_END,)
    return template.stop_ids(), ()


def generate(
    params: Params,
    config: LlamaConfig,
    tokenizer: Tokenizer,
    prompts: Sequence[str] | Sequence[ChatPrompt],
    gen: GenerationConfig,
    *,
    chat: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[Completion]:
    """Complete text prompts (<s> prepended), or with `chat` chat prompts: user turns or
    conversations so far (`chat_prompt_ids`), ending at the model's EOS or end of turn
    (`<|im_end|>` for ChatML, the template's own for a tokenizer.json model)."""
    eos: tuple[int, ...] = tokenizer.stop_ids
    if chat:
        ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
        eos, stops = chat_ends(tokenizer)
        gen = dataclasses.replace(gen, stop=(*gen.stop, *stops))
    else:
        ids = [text_prompt_ids(tokenizer, str(p)) for p in prompts]
    return generate_ids(
        params, config, ids, gen, eos_id=eos, tokenizer=tokenizer, progress=progress
    )

"""What a decode loop shares, whoever runs it: `generate` (one batch of prompts at a time)
and the agent's `TurnDecoder` (conversations keeping their rows across turns).

The settings of a call (`GenerationConfig`) and what it gives back (`Completion`); the
shape buckets that keep compilations few (`bucket`); the device state a decode chunk
carries from one call to the next (`DecodeState`); the first token sampled from the
prompt's logits (`first_tokens`); and, on the host, each row's tokens and text so far with
the one set of stop rules (`RowState`, `extend_row`: end of sequence, stop strings, length).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np

from lemur.eval.sampling import Sampling, sample
from lemur.model import decode
from lemur.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Length, sampling, stop conditions and seed of one generation call."""

    max_new_tokens: int = 256
    sampling: Sampling = Sampling()
    stop: tuple[str, ...] = ()
    stop_at_eos: bool = True
    seed: int = 0
    batch_size: int = 8
    chunk: int = 16

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def decode_slots(self) -> int:
        """Cache slots a reply needs after its prompt: the new tokens after the first (which
        prefill samples), in whole chunks."""
        return -(-(self.max_new_tokens - 1) // self.chunk) * self.chunk


@dataclasses.dataclass
class Completion:
    """One prompt's output: generated ids and text (cut at the stop), and why it ended."""

    prompt_tokens: int
    tokens: list[int]
    text: str
    finish: str  # "stop" (a stop string), "eos", or "length"


def bucket(n: int, minimum: int = 16) -> int:
    """The smallest of minimum * (1, 1.5, 2, 3, 4, 6, ...) that is >= n (minimum a power of 2)."""
    b = minimum
    while b < n:
        b = b * 3 // 2 if b & (b - 1) == 0 else b * 4 // 3
    return b


def stop_ids_of(eos_id: int | Sequence[int] | None) -> tuple[int, ...]:
    """The stop ids a decode loop compares with: `eos_id` as a tuple; (-1,) (never) for None."""
    return (-1,) if eos_id is None else tuple(np.atleast_1d(eos_id).astype(int).tolist())


class DecodeState(NamedTuple):
    """A batch's device state between decode chunks (the carry of their `lax.scan`).

    `position` is where the next token is written: one slot for every row (left-padded
    prompts, lemur.eval.generate) or each row's own length (rows that start at slot 0,
    lemur.eval.agent_decode). A row is done once it fed one of the stop ids.
    """

    cache: decode.KVCache
    token_B: jax.Array  # the token each row feeds next
    position: jax.Array  # a slot (scalar) or one per row (B)
    key: jax.Array  # the random stream, split once per step
    done_B: jax.Array  # rows that stopped: they emit the first stop id from then on


@functools.partial(jax.jit, static_argnames="sampling")
def first_tokens(
    logits_BxV: jax.Array, key: jax.Array, *, sampling: Sampling
) -> tuple[jax.Array, jax.Array]:
    """The first new token of every row from the prompt's last logits, and the advanced key."""
    key, sub = jax.random.split(key)
    return sample(logits_BxV, sub, sampling), key


@dataclasses.dataclass
class RowState:
    """Host-side state of one prompt while its batch decodes."""

    prompt: list[int]
    head: str | None = None  # decode(prompt), for continuation text
    tokens: list[int] = dataclasses.field(default_factory=list)
    text: str = ""
    finish: str | None = None  # set once the row ended: "eos", "stop" or "length"

    def completion(self) -> Completion:
        """What the row gave (a row that never ended counts as ended by length)."""
        return Completion(len(self.prompt), self.tokens, self.text, self.finish or "length")


def continuation_text(
    tokenizer: Tokenizer, prompt: Sequence[int], ids: Sequence[int], head: str | None = None
) -> str:
    """Text that `ids` add after `prompt`.

    Decoded together with the prompt: a tokenizer with a dummy prefix (Llama-2's) drops the
    leading space of the first piece it decodes, which would eat the space of a completion
    decoded alone.
    """
    head = tokenizer.decode(list(prompt)) if head is None else head
    full = tokenizer.decode([*prompt, *ids])
    return full[len(head) :] if full.startswith(head) else tokenizer.decode(list(ids))


def _find_stop(text: str, stop: Sequence[str]) -> int:
    """Index of the earliest stop string in text, or -1."""
    hits = [i for s in stop if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else -1


def extend_row(
    row: RowState,
    new: Sequence[int],
    gen: GenerationConfig,
    eos_ids: tuple[int, ...],
    tokenizer: Tokenizer | None,
) -> None:
    """Append a chunk's tokens to a row; cut and set `finish` at eos, a stop string or length."""
    before = len(row.tokens)
    row.tokens.extend(int(t) for t in new)
    ends = [k for k in range(before, len(row.tokens)) if row.tokens[k] in eos_ids]
    if gen.stop_at_eos and ends:
        row.tokens = row.tokens[: ends[0]]
        row.finish = "eos"
    if len(row.tokens) >= gen.max_new_tokens:
        row.tokens, row.finish = row.tokens[: gen.max_new_tokens], row.finish or "length"
    if tokenizer is None:
        return
    if row.head is None:
        row.head = tokenizer.decode(row.prompt)
    row.text = continuation_text(tokenizer, row.prompt, row.tokens, row.head)
    if gen.stop and _find_stop(row.text, gen.stop) >= 0:
        # The shortest prefix holding a stop: only tokens of this chunk can have completed it.
        for k in range(max(before, 1), len(row.tokens) + 1):
            text = continuation_text(tokenizer, row.prompt, row.tokens[:k], row.head)
            if (i := _find_stop(text, gen.stop)) >= 0:
                row.tokens, row.text, row.finish = row.tokens[:k], text[:i], "stop"
                break

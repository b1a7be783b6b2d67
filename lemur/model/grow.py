"""Vocabulary growth: new token rows for pieces appended to a tokenizer (ChatML markers).

A chat tokenizer is the base one plus pieces appended at the end (ids below the old
vocab are unchanged), so a pre-trained model is extended, not remapped: the embedding
gains rows and the output head gains columns, each initialised to the mean of the
existing ones (Hewitt 2021, "Initializing new word embeddings for pretrained language
models"). Every old logit stays exactly what it was, and a new token's logit is the mean
of the old logits, so the softmax puts at most 1/V on each new token: the loss on text
without the new tokens rises by at most log(1 + added/V) (Jensen), where random rows
could dominate the softmax and wreck the first fine-tuning steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from lemur.model.config import LlamaConfig, Params


def _mean_extended(table: Any, axis: int, added: int) -> Any:
    """`table` with `added` copies of its mean along `axis` appended (mean taken in fp32)."""
    xp = np if isinstance(table, np.ndarray) else jnp
    mean = xp.mean(table.astype(xp.float32), axis=axis, keepdims=True).astype(table.dtype)
    reps = [1] * table.ndim
    reps[axis] = added
    return xp.concatenate([table, xp.tile(mean, reps)], axis=axis)


def grow_vocab(params: Params, config: LlamaConfig, new_vocab: int) -> tuple[Params, LlamaConfig]:
    """Params and config for `new_vocab` tokens: appended rows are the mean of the old ones.

    The embedding (V x D) gains rows; the untied head (D x V) gains columns; a tied head
    is the embedding, so it grows with it. Numpy params stay numpy, jax stay jax; nothing
    else changes. A smaller `new_vocab` is a ValueError: dropping rows would renumber
    nothing but lose tokens the model knows.
    """
    old = config.vocab_size
    if not isinstance(new_vocab, int) or new_vocab < old:
        raise ValueError(f"cannot grow a {old}-token vocabulary to {new_vocab!r} tokens")
    if new_vocab == old:
        return params, config
    if params["embed"].shape[0] != old:
        raise ValueError(f"embed has {params['embed'].shape[0]} rows, the config says {old}")
    grown = dict(params)
    grown["embed"] = _mean_extended(params["embed"], 0, new_vocab - old)
    if not config.tie_embeddings:
        grown["lm_head"] = _mean_extended(params["lm_head"], 1, new_vocab - old)
    return grown, dataclasses.replace(config, vocab_size=new_vocab)

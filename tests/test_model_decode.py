"""lemur.model.decode: the KV-cache path gives the full forward's logits at every position."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lemur.model import decode, llama
from lemur.model.config import LlamaConfig, Params

TOL = 1e-4  # as the model parity tests (tests/test_model_hf.py)
VOCAB = 128
VARIANTS = {
    # Llama-2 style with 4 query heads sharing 2 kv heads.
    "gqa": dict(n_heads=4, n_kv_heads=2),
    # Llama-3.2 style: tied head, llama3 rope scaling (original context 16 so it bites), 4:1.
    "llama3-tied": dict(
        n_heads=4,
        n_kv_heads=1,
        tie_embeddings=True,
        rope_type="llama3",
        rope_theta=500000.0,
        rope_factor=8.0,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
        rope_original_max_seq_len=16,
    ),
    # Qwen2 style: biases on q, k, v (random below, so they show), tied head, theta 1e6.
    "qwen2-bias": dict(
        n_heads=4, n_kv_heads=2, tie_embeddings=True, arch="qwen2", qkv_bias=True, rope_theta=1e6
    ),
}


def _config(**kw) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        d_ff=96,
        dtype="float32",
        init_std=0.1,
        max_seq_len=256,
        **kw,
    )


@functools.cache
def _model(name: str) -> tuple[LlamaConfig, Params]:
    config = _config(**VARIANTS[name])
    # rbg keys compile the initialiser 2-3x faster on CPU (docs/model.md).
    init = jax.jit(llama.init_params, static_argnums=0)
    params = init(config, jax.random.key(3, impl="rbg"))
    if config.qkv_bias:  # init makes them zero: random ones test that decode adds them too
        rng = np.random.default_rng(4)
        for name in ("bq", "bk", "bv"):
            w = params["layers"][name]
            params["layers"][name] = jnp.asarray(rng.standard_normal(w.shape), w.dtype)
    return config, params


_forward = jax.jit(llama.forward, static_argnames="config")
_prefill = jax.jit(decode.prefill, static_argnames=("config", "last_only"))
_step = jax.jit(decode.decode_step, static_argnames="config", donate_argnums=4)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_cache_logits_equal_forward_at_every_position(name: str) -> None:
    """Rows of 20, 13 and 6 tokens: prefill a left-padded prefix, then feed the rest one by one."""
    config, params = _model(name)
    rng = np.random.default_rng(0)
    lengths, prefix = [20, 13, 6], [9, 4, 1]
    rows = [rng.integers(0, VOCAB, n) for n in lengths]
    # Right padding leaves a causal forward's real positions untouched: one compile for all.
    batch = np.stack([np.pad(r, (0, max(lengths) - len(r))) for r in rows])
    refs = list(np.asarray(_forward(params, jnp.asarray(batch), config=config)))
    P, S = 16, 32
    pad = np.array([P - p for p in prefix], np.int32)
    tokens = np.zeros((3, P), np.int32)
    for b, r in enumerate(rows):
        tokens[b, pad[b] :] = r[: prefix[b]]
    cache = decode.init_cache(config, 3, S)
    split = decode.split_layers(params)  # what generation decodes from
    logits, cache = _prefill(split, tokens, pad, cache, config=config)
    logits = np.asarray(logits)
    worst = max(np.abs(logits[b, pad[b] :] - refs[b][: prefix[b]]).max() for b in range(3))
    for t in range(max(lengths) - min(prefix)):
        # Rows that ran out of tokens keep feeding token 0; their logits are not compared.
        fed = np.array(
            [r[p + t] if p + t < len(r) else 0 for r, p in zip(rows, prefix, strict=True)]
        )
        step_logits, cache = _step(
            split, jnp.asarray(fed, jnp.int32), P + t, pad, cache, config=config
        )
        step_logits = np.asarray(step_logits)
        for b, (r, p) in enumerate(zip(rows, prefix, strict=True)):
            if p + t < len(r):
                worst = max(worst, np.abs(step_logits[b] - refs[b][p + t]).max())
    assert worst <= TOL, worst
    assert max(np.abs(r).max() for r in refs) > 1.0  # not a comparison of near-zero numbers


def test_prefill_last_only_is_the_last_slot() -> None:
    config, params = _model("gqa")
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, 16)).astype(np.int32)
    pad = np.array([0, 5], np.int32)
    full, _ = _prefill(params, tokens, pad, decode.init_cache(config, 2, 16), config=config)
    last, cache = _prefill(
        params, tokens, pad, decode.init_cache(config, 2, 16), config=config, last_only=True
    )
    np.testing.assert_allclose(np.asarray(last), np.asarray(full)[:, -1], atol=1e-6)
    assert len(cache.k) == config.n_layers
    assert cache.k[0].shape == (2, config.n_kv_heads, config.head_dim, 16)  # GQA, keys K x S
    assert cache.v[0].shape == (2, config.n_kv_heads, 16, config.head_dim)


def test_padding_does_not_change_a_row() -> None:
    """The same prompt alone and beside a longer one (so left-padded) gives the same logits."""
    config, params = _model("gqa")
    rng = np.random.default_rng(2)
    short, long = rng.integers(0, VOCAB, 5), rng.integers(0, VOCAB, 16)
    alone, _ = _prefill(
        params,
        np.pad(short, (11, 0))[None].astype(np.int32),
        np.array([11], np.int32),
        decode.init_cache(config, 1, 16),
        config=config,
        last_only=True,
    )
    both, _ = _prefill(
        params,
        np.stack([np.pad(short, (11, 0)), long]).astype(np.int32),
        np.array([11, 0], np.int32),
        decode.init_cache(config, 2, 16),
        config=config,
        last_only=True,
    )
    np.testing.assert_allclose(np.asarray(both)[0], np.asarray(alone)[0], atol=1e-5)

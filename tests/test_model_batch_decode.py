"""lemur.model.batch_decode: batched greedy generation equals one-row argmax decoding by
full forward passes; stop ids, the caller's stop test, sampling and its limits."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from lemur.model import batch_decode, llama
from lemur.model.batch_decode import Sampling, generate_tokens
from lemur.model.config import PRESETS


@pytest.fixture(scope="module")
def model():
    """A tiny random fp32 model (init_std 0.3: no near-ties among the logits)."""
    config = dataclasses.replace(
        PRESETS["tiny"], vocab_size=101, max_seq_len=96, init_std=0.3, remat="none"
    )
    return config, llama.init_params(config, jax.random.key(1))


def _is_greedy(config, params, prompt: list[int], new: list[int]) -> bool:
    """Whether each new token is the argmax after the tokens before it (one forward pass
    over prompt + new, teacher-forced)."""
    seq = np.array([prompt + new], np.int32)
    # One compiled program per length (eagerly, each operation would compile per length).
    logits = np.asarray(jax.jit(llama.forward, static_argnums=2)(params, seq, config))[0]
    return logits[len(prompt) - 1 : -1].argmax(-1).tolist() == new


def test_batched_greedy_equals_full_forward(model):
    config, params = model
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 101, n).tolist() for n in (3, 17, 9)]
    got = generate_tokens(config, params, prompts, 20, (), Sampling(), jax.random.key(0))
    assert [len(g) for g in got] == [20, 20, 20]
    assert all(_is_greedy(config, params, p, g) for p, g in zip(prompts, got, strict=True))


def test_stop_ids_and_stop_test(model):
    config, params = model
    prompt = [5, 6, 7]
    (ref,) = generate_tokens(config, params, [prompt], 30, (), Sampling(), jax.random.key(0))
    assert _is_greedy(config, params, prompt, ref)
    stop = ref[4]
    got = generate_tokens(config, params, [prompt], 30, (stop,), Sampling(), jax.random.key(0))
    assert got == [ref[: ref.index(stop) + 1]]
    seen: list[int] = []

    def is_done(row: int, ids: list[int]) -> bool:
        seen.append(len(ids))
        return len(ids) >= 3

    got = generate_tokens(config, params, [prompt], 30, (), Sampling(), jax.random.key(0), is_done)
    # checked between device calls: the first token, then every CHUNK more
    assert got[0] == ref[: 1 + batch_decode.CHUNK] and seen[0] == 1


def test_sampling_is_seeded_and_top_k_1_is_greedy(model):
    config, params = model
    prompts = [[1, 2, 3], [4, 5]]
    hot = Sampling(temperature=1.5, top_p=0.9)
    a = generate_tokens(config, params, prompts, 12, (), hot, jax.random.key(7))
    b = generate_tokens(config, params, prompts, 12, (), hot, jax.random.key(7))
    c = generate_tokens(config, params, prompts, 12, (), hot, jax.random.key(8))
    assert a == b and a != c
    greedy = generate_tokens(config, params, prompts, 12, (), Sampling(), jax.random.key(0))
    top1 = generate_tokens(config, params, prompts, 12, (), Sampling(1.0, 1), jax.random.key(3))
    assert top1 == greedy


def test_limits(model):
    config, params = model
    with pytest.raises(ValueError, match="exceeds the model's context"):
        generate_tokens(config, params, [[1] * 90], 7, (), Sampling(), jax.random.key(0))
    with pytest.raises(ValueError, match="no tokens"):
        generate_tokens(config, params, [[]], 4, (), Sampling(), jax.random.key(0))

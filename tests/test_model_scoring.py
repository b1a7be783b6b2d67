"""lemur.model.scoring: batched, bucketed per-token log-probabilities equal one unpadded
forward pass per sequence, in the caller's order."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from lemur.model import llama, scoring
from lemur.model.config import PRESETS


@pytest.fixture(scope="module")
def model():
    """A tiny random fp32 model with a 64-token context."""
    config = dataclasses.replace(
        PRESETS["tiny"], vocab_size=97, max_seq_len=64, dtype="float32", remat="none"
    )
    return config, llama.init_params(config, jax.random.key(0))


def _forward(config, params, ids: np.ndarray) -> np.ndarray:
    """The model's logits for a [1, T] array: one compiled program per length (eagerly, each
    of the forward pass's operations would be compiled per length instead)."""
    return np.asarray(jax.jit(llama.forward, static_argnums=2)(params, ids, config))


def _reference(config, params, seq: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities and greedy flags from one unpadded forward pass, in numpy."""
    logits = _forward(config, params, np.array([seq], np.int32))[0, :-1]
    logits = logits.astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    target = np.array(seq[1:])
    logp = logits[np.arange(len(target)), target] - logz
    return logp, logits.argmax(-1) == target


def test_matches_unpadded_forward_in_order(model):
    config, params = model
    rng = np.random.default_rng(1)
    lengths = [1, 2, 5, 17, 33, 64, 65, 3, 40, 0, 16, 25]
    seqs = [rng.integers(0, config.vocab_size, n).tolist() for n in lengths]
    got = scoring.token_logprobs(config, params, seqs, batch_size=4)
    assert [len(s.logprobs) for s in got] == [max(0, n - 1) for n in lengths]
    for seq, scores in zip(seqs, got, strict=True):
        if len(seq) < 2:
            continue
        logp, greedy = _reference(config, params, seq)
        np.testing.assert_allclose(scores.logprobs, logp, rtol=1e-5, atol=1e-5)
        assert (scores.greedy == greedy).all()


def test_greedy_flags_the_argmax(model):
    """A sequence built from the model's own argmax continuations is greedy throughout."""
    config, params = model
    seq = [5]
    ids = np.zeros((1, 16), np.int32)  # causal: the zeros after the sequence change nothing before
    for _ in range(10):
        ids[0, : len(seq)] = seq
        seq.append(int(_forward(config, params, ids)[0, len(seq) - 1].argmax()))
    (scores,) = scoring.token_logprobs(config, params, [seq])
    assert scores.greedy.all()
    other = seq[:-1] + [(seq[-1] + 1) % config.vocab_size]
    (scores,) = scoring.token_logprobs(config, params, [other])
    assert scores.greedy[:-1].all() and not scores.greedy[-1]


def test_too_long_and_bad_batch(model):
    config, params = model
    assert len(scoring.token_logprobs(config, params, [[1] * 65])[0].logprobs) == 64
    with pytest.raises(ValueError, match="sequence 1 has 66 tokens"):
        scoring.token_logprobs(config, params, [[1, 2], [1] * 66])
    with pytest.raises(ValueError, match="batch_size"):
        scoring.token_logprobs(config, params, [[1, 2]], batch_size=0)


def test_bucket_lengths_are_few():
    assert [scoring.bucket_length(n) for n in (1, 16, 17, 25, 33, 49, 65, 100)] == [
        16,
        16,
        24,
        32,
        48,
        64,
        96,
        128,
    ]

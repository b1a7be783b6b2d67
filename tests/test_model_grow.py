"""Vocabulary growth: old logits unchanged, new rows the mean, the loss bounded by Jensen."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest

from lemur.model import llama
from lemur.model.config import LlamaConfig, config_from_preset
from lemur.model.grow import grow_vocab

ADDED = 2  # the two ChatML markers


def tiny(tie: bool) -> LlamaConfig:
    """The fp32 tiny preset, tied or untied."""
    return config_from_preset("tiny", tie_embeddings=tie)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis, in float64."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def mean_ce(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of integer targets."""
    logp = log_softmax(logits)
    return float(-np.take_along_axis(logp, targets[..., None], -1).mean())


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_old_logits_unchanged_and_new_rows_the_mean(tie: bool) -> None:
    config = tiny(tie)
    params = llama.init_params(config, jax.random.key(0))
    grown, grown_config = grow_vocab(params, config, config.vocab_size + ADDED)
    V = config.vocab_size
    assert grown_config == dataclasses.replace(config, vocab_size=V + ADDED)
    assert grown["embed"].shape == (V + ADDED, config.d_model)
    np.testing.assert_array_equal(grown["embed"][:V], params["embed"])
    for row in np.asarray(grown["embed"][V:]):
        np.testing.assert_allclose(row, np.asarray(params["embed"]).mean(0), rtol=1e-6, atol=1e-7)
    if tie:
        assert "lm_head" not in grown
    else:
        assert grown["lm_head"].shape == (config.d_model, V + ADDED)
        np.testing.assert_array_equal(grown["lm_head"][:, :V], params["lm_head"])
        np.testing.assert_allclose(
            np.asarray(grown["lm_head"][:, V:]),
            np.repeat(np.asarray(params["lm_head"]).mean(1, keepdims=True), ADDED, 1),
            rtol=1e-6,
            atol=1e-7,
        )
    assert grown["layers"] is params["layers"] and grown["final_norm"] is params["final_norm"]

    # Ordinary tokens (ids < V): the old logits come back, the new columns are their mean.
    tokens = np.random.default_rng(1).integers(0, V, (2, 33))
    old = np.asarray(llama.forward(params, tokens[:, :-1], config))
    new = np.asarray(llama.forward(grown, tokens[:, :-1], grown_config))
    np.testing.assert_allclose(new[..., :V], old, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        new[..., V:], np.repeat(old.mean(-1, keepdims=True), ADDED, -1), atol=1e-5
    )
    # So the loss on them rises by at most log(1 + added/V), and only by that much.
    rise = mean_ce(new, tokens[:, 1:]) - mean_ce(old, tokens[:, 1:])
    assert -1e-6 <= rise <= math.log1p(ADDED / V)
    assert rise > 0  # the new tokens do take some probability


def test_numpy_params_stay_numpy_and_bf16_keeps_its_dtype() -> None:
    config = tiny(False)
    params = jax.tree.map(np.asarray, llama.init_params(config, jax.random.key(0)))
    params["embed"] = params["embed"].astype(np.float16)
    grown, _ = grow_vocab(params, config, config.vocab_size + 3)
    assert isinstance(grown["embed"], np.ndarray) and grown["embed"].dtype == np.float16
    assert (
        isinstance(grown["lm_head"], np.ndarray)
        and grown["lm_head"].shape[1] == config.vocab_size + 3
    )
    expected = params["embed"].astype(np.float32).mean(0).astype(np.float16)
    np.testing.assert_array_equal(grown["embed"][-1], expected)


def test_same_size_is_a_no_op_and_shrinking_is_refused() -> None:
    config = tiny(False)
    params = llama.init_params(config, jax.random.key(0))
    assert grow_vocab(params, config, config.vocab_size) == (params, config)
    with pytest.raises(ValueError, match="cannot grow a 512-token vocabulary to 500 tokens"):
        grow_vocab(params, config, 500)
    small = dataclasses.replace(config, vocab_size=256)
    with pytest.raises(ValueError, match="embed has 512 rows, the config says 256"):
        grow_vocab(params, small, 300)

"""lemur.model.llama: config checks, presets, FLOPs, causality, document masking, scan/remat."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lemur.model import llama
from lemur.model.config import (
    PRESETS,
    LlamaConfig,
    Params,
    config_from_preset,
    flops_per_token,
    param_count,
    param_shapes,
)

# d_model 32 / 4 heads / 2 kv heads: GQA in the smallest shape that still means something.
CONFIG = LlamaConfig(
    vocab_size=97,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=48,
    max_seq_len=64,
    dtype="float32",
    init_std=0.1,
)


# Llama-3.1's scaling shape with a small original context (the tests use short sequences).
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_factor=8.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_seq_len=64,
)


def random_params(config: LlamaConfig, seed: int = 0) -> Params:
    """Random params from numpy (no threefry compile: ~6 s on this CPU), norms not all 1."""
    rng = np.random.default_rng(seed)
    shapes = param_shapes(config)
    return jax.tree_util.tree_map_with_path(
        lambda path, shape: jnp.asarray(
            (1.0 if "norm" in jax.tree_util.keystr(path) else 0.0)
            + config.init_std * rng.standard_normal(shape),
            jnp.float32,
        ),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


@pytest.fixture(scope="module")
def params() -> Params:
    """Random tiny params, large enough that every layer matters."""
    return random_params(CONFIG)


@functools.partial(jax.jit, static_argnames="config")
def _forward(params, tokens, config, segment_ids=None, positions=None):
    """Jitted forward shared by the tests (one compile per config and shape)."""
    return llama.forward(params, tokens, config, segment_ids=segment_ids, positions=positions)


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(d_model=30), "multiple of n_heads"),
        (dict(d_model=36, n_heads=4, n_kv_heads=4), "even"),  # head_dim 9
        (dict(n_layers=0), "n_layers"),
        (dict(vocab_size=2.5), "vocab_size"),
        (dict(dtype="fp8"), "dtype"),
        (dict(param_dtype="int8"), "param_dtype"),
        (dict(remat="some"), "remat"),
        (dict(attention_impl="flash"), "attention_impl"),
        (dict(rope_theta=0.0), "rope_theta"),
        (dict(scan_layers="yes"), "scan_layers"),
        (dict(tie_embeddings=1), "tie_embeddings"),
        (dict(rope_type="yarn"), "rope_type.*'yarn'"),
        (dict(rope_factor=8.0), "rope_factor is set but rope_type is 'default'"),
        (dict(LLAMA3_ROPE, rope_factor=None), "rope_factor"),
        (dict(LLAMA3_ROPE, rope_original_max_seq_len=64.5), "rope_original_max_seq_len"),
        (dict(LLAMA3_ROPE, rope_high_freq_factor=1.0), "must exceed rope_low_freq_factor"),
    ],
)
def test_bad_configs_raise(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(CONFIG, **bad)


def test_config_is_frozen_and_hashable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        CONFIG.d_model = 8  # type: ignore[misc]
    assert hash(CONFIG) == hash(dataclasses.replace(CONFIG))


@pytest.mark.parametrize(
    "name, count",
    [
        ("llama2-7b", 6_738_415_616),
        ("llama2-13b", 13_015_864_320),
        ("llama2-70b", 68_976_648_192),
        # Llama-3: sum of numel over HF's parameters (the 3.2 head is tied: counted once).
        ("llama3.1-8b", 8_030_261_248),
        ("llama3.2-1b", 1_235_814_400),
    ],
)
def test_preset_param_counts_match_published(name: str, count: int) -> None:
    config = PRESETS[name]
    assert param_count(config) == count
    # The count must be that of the tree init_params really builds (abstractly: no memory).
    abstract = jax.eval_shape(functools.partial(llama.init_params, config), jax.random.key(0))
    assert sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(abstract)) == count
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(abstract))


def test_presets_shapes() -> None:
    big = PRESETS["llama2-70b"]
    assert (big.n_kv_heads, big.d_ff, big.head_dim, big.n_layers) == (8, 28672, 128, 80)
    assert PRESETS["llama2-7b"].n_kv_heads == 32
    assert 1.0e9 < param_count(PRESETS["llama-1b"]) < 1.2e9
    assert set(PRESETS) >= {
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "tiny",
        "llama-1b",
        "llama3.1-8b",
        "llama3.2-1b",
    }
    small = PRESETS["llama3.2-1b"]
    assert (small.tie_embeddings, small.rope_type, small.rope_factor, small.head_dim) == (
        True,
        "llama3",
        32.0,
        64,
    )
    assert "lm_head" not in param_shapes(small)


def test_config_from_preset() -> None:
    config = config_from_preset("tiny", remat="dots", scan_layers=True)
    assert (config.remat, config.scan_layers, config.d_model) == ("dots", True, 64)
    with pytest.raises(KeyError, match="llama2-7b"):
        config_from_preset("llama9")
    with pytest.raises(ValueError):
        config_from_preset("tiny", n_kv_heads=3)


def test_flops_per_token_maxtext_convention() -> None:
    config = PRESETS["llama2-7b"]
    norms = config.n_layers * 2 * config.d_model + config.d_model
    matmul_params = param_count(config) - config.vocab_size * config.d_model - norms
    causal_attention = 4 * 4096 * config.d_model / 2 * config.n_layers  # 2 matmuls, halved
    expected = 6 * matmul_params + 3 * causal_attention
    assert flops_per_token(config, 4096) == pytest.approx(expected, rel=1e-12)
    assert flops_per_token(config, 4096) == pytest.approx(42.863689728e9)
    # A tied head is still a D x V matmul: the FLOPs do not change, the params do.
    tied = dataclasses.replace(config, tie_embeddings=True)
    assert flops_per_token(tied, 4096) == flops_per_token(config, 4096)
    assert param_count(config) - param_count(tied) == config.d_model * 32000


def test_init_params_tree() -> None:
    # An rbg key compiles 2-3x faster than threefry on CPU; init_params takes any key.
    key = jax.random.key(0, impl="rbg")
    params = jax.jit(llama.init_params, static_argnums=0)(CONFIG, key)
    shapes = jax.tree.map(lambda x: x.shape, params)
    assert shapes == param_shapes(CONFIG)
    assert param_count(CONFIG) == sum(x.size for x in jax.tree.leaves(params))
    np.testing.assert_array_equal(params["layers"]["attn_norm"], 1.0)
    np.testing.assert_array_equal(params["final_norm"], 1.0)
    for w in (params["embed"], params["layers"]["wq"], params["layers"]["w_down"]):
        assert abs(float(w.std()) - CONFIG.init_std) < 0.02 and abs(float(w.mean())) < 0.01
    # Different layers get different weights.
    assert not np.allclose(params["layers"]["wq"][0], params["layers"]["wq"][1])


def test_rope_is_a_rotation_of_interleaved_pairs() -> None:
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1, 3, 2, 8)), jnp.float32)
    positions = jnp.array([[0, 1, 5]])
    config = dataclasses.replace(CONFIG, d_model=16, n_heads=2, n_kv_heads=2)  # head_dim 8
    cos, sin = llama.rope_angles(positions, llama.rope_inv_freq(config))
    y = llama.apply_rope(x, cos, sin)
    np.testing.assert_allclose(y[:, 0], x[:, 0], atol=1e-6)  # position 0: identity
    # Norms of each (2i, 2i+1) pair are kept; pair 0 at position 1 turns by exactly 1 rad.
    pairs = lambda t: t.reshape(1, 3, 2, 4, 2)  # noqa: E731
    np.testing.assert_allclose(
        jnp.linalg.norm(pairs(y), axis=-1), jnp.linalg.norm(pairs(x), axis=-1), rtol=1e-5
    )
    a, b = x[0, 1, 0, 0], x[0, 1, 0, 1]
    np.testing.assert_allclose(
        y[0, 1, 0, :2], [a * np.cos(1) - b * np.sin(1), a * np.sin(1) + b * np.cos(1)], rtol=1e-5
    )


def test_forward_shapes_and_dtype(params: Params) -> None:
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % CONFIG.vocab_size
    logits = _forward(params, tokens, CONFIG)
    assert logits.shape == (2, 8, CONFIG.vocab_size) and logits.dtype == jnp.float32
    assert bool(jnp.isfinite(logits).all())


@jax.jit
def _jacobian_blocks(params: Params, x: jax.Array, segment_ids=None) -> jax.Array:
    """|d logits[t] / d x[s]| summed over feature dims: an LxL dependency matrix."""

    def f(x_1xLxD: jax.Array) -> jax.Array:
        logits = llama.forward_embeddings(params, x_1xLxD, CONFIG, segment_ids=segment_ids)
        return logits[0].sum(-1)  # L

    jac_LxLxD = jax.jacrev(f)(x)[:, 0]  # d out[t] / d x[0, s, :]
    return jnp.abs(jac_LxLxD).sum(-1)


def test_causality_via_gradients(params: Params) -> None:
    L = 8
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, L, CONFIG.d_model)), jnp.float32)
    dep = np.asarray(_jacobian_blocks(params, x))
    later = np.triu(np.ones((L, L), bool), k=1)  # [t, s] with s > t
    assert (dep[later] == 0).all(), "a position depends on a later one"
    assert (dep[~later] > 0).all(), "a position ignores an earlier one"


def test_document_mask_blocks_gradients_across_documents(params: Params) -> None:
    segment_ids = jnp.array([[1, 1, 1, 2, 2, 3, 3, 3]])
    x = jnp.asarray(np.random.default_rng(3).standard_normal((1, 8, CONFIG.d_model)), jnp.float32)
    dep = np.asarray(_jacobian_blocks(params, x, segment_ids))
    seg = np.asarray(segment_ids[0])
    allowed = (seg[:, None] == seg[None, :]) & np.tril(np.ones((8, 8), bool))
    assert (dep[~allowed] == 0).all() and (dep[allowed] > 0).all()


def test_packed_documents_equal_each_document_alone(params: Params) -> None:
    rng = np.random.default_rng(0)
    lengths = [5, 7, 4]
    L = sum(lengths)
    docs = [rng.integers(0, CONFIG.vocab_size, n) for n in lengths]
    orders = [(0, 1, 2), (2, 0, 1), (1, 2, 0)]  # each row packs the documents differently
    packed = np.stack([np.concatenate([docs[d] for d in order]) for order in orders])
    segment_ids = np.stack(
        [np.repeat(np.arange(1, 4), [lengths[d] for d in order]) for order in orders]
    )
    positions = np.stack(
        [np.concatenate([np.arange(lengths[d]) for d in order]) for order in orders]
    )
    packed_logits = _forward(
        params, jnp.asarray(packed), CONFIG, jnp.asarray(segment_ids), jnp.asarray(positions)
    )
    # Each document alone, left-aligned and padded to L: causal attention never sees the pad.
    alone = np.zeros((3, L), np.int64)
    for d, doc in enumerate(docs):
        alone[d, : len(doc)] = doc
    arange = jnp.broadcast_to(jnp.arange(L), (3, L))
    alone_logits = _forward(params, jnp.asarray(alone), CONFIG, None, arange)
    for row, order in enumerate(orders):
        start = 0
        for d in order:
            n = lengths[d]
            np.testing.assert_allclose(
                packed_logits[row, start : start + n], alone_logits[d, :n], atol=1e-5, rtol=1e-5
            )
            start += n
    # Without the mask, later documents do see earlier ones (same shapes: no new compile).
    unmasked = _forward(params, jnp.asarray(packed), CONFIG, None, jnp.asarray(positions))
    assert np.abs(unmasked[0, 5:12] - alone_logits[1, :7]).max() > 1e-3
    np.testing.assert_allclose(unmasked[0, :5], alone_logits[0, :5], atol=1e-5, rtol=1e-5)


def _loss_and_grads(config: LlamaConfig, params: Params, tokens: jax.Array):
    """Mean next-token loss and its gradients (jitted per config)."""

    def loss(p: Params) -> jax.Array:
        logits = llama.forward(p, tokens[:, :-1], config)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

    return jax.jit(jax.value_and_grad(loss))(params)


def test_scan_and_remat_match_the_plain_loop(params: Params) -> None:
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, CONFIG.vocab_size, (2, 9)))
    ref_loss, ref_grads = _loss_and_grads(CONFIG, params, tokens)
    for overrides in (dict(scan_layers=True, remat="full"), dict(remat="dots")):
        loss, grads = _loss_and_grads(dataclasses.replace(CONFIG, **overrides), params, tokens)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, err_msg=str(overrides))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-4, err_msg=str(overrides))


def test_bf16_compute_stays_close_to_fp32(params: Params) -> None:
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, CONFIG.vocab_size, (2, 8)))
    logits16 = _forward(params, tokens, bf16)
    logits32 = _forward(params, tokens, CONFIG)
    assert logits16.dtype == jnp.float32
    scale = float(jnp.abs(logits32).max())
    assert float(jnp.abs(logits16 - logits32).max()) < 0.05 * scale


def test_attention_backend_selection() -> None:
    # Without a mesh the platform is JAX's backend; on CPU the auto choice is XLA; an
    # explicit choice is kept (the TPU and GPU choices: tests/test_model_splash.py).
    assert llama.compile_platform() == jax.default_backend()
    bf16 = dataclasses.replace(CONFIG, dtype="bfloat16")
    assert llama.choose_attention_impl(bf16, 128, 64, "cpu", dense_mask=False) == "xla"
    xla = dataclasses.replace(CONFIG, attention_impl="xla")
    assert llama.choose_attention_impl(xla, 8, 64, "tpu", dense_mask=False) == "xla"


def test_tied_head_is_the_embedding_transposed(params: Params) -> None:
    tied = dataclasses.replace(CONFIG, tie_embeddings=True)
    tied_params = {k: v for k, v in params.items() if k != "lm_head"}
    assert jax.tree.map(jnp.shape, tied_params) == param_shapes(tied)
    tokens = jnp.asarray(np.random.default_rng(6).integers(0, CONFIG.vocab_size, (2, 8)))
    # Untied with lm_head = embed.T computes the same function.
    as_untied = {**tied_params, "lm_head": params["embed"].T}
    np.testing.assert_allclose(
        _forward(tied_params, tokens, tied),
        _forward(as_untied, tokens, CONFIG),
        atol=1e-6,
        rtol=1e-6,
    )
    # The embedding gets the gradient of both its uses: the lookup and the head.
    _, grads = _loss_and_grads(tied, tied_params, tokens)
    _, untied_grads = _loss_and_grads(CONFIG, as_untied, tokens)
    np.testing.assert_allclose(
        grads["embed"], untied_grads["embed"] + untied_grads["lm_head"].T, atol=1e-6, rtol=1e-4
    )
    key = jax.random.key(0, impl="rbg")
    init = jax.eval_shape(functools.partial(llama.init_params, tied), key)
    assert "lm_head" not in init and param_count(tied) == sum(x.size for x in jax.tree.leaves(init))


def test_llama3_rope_keeps_high_and_stretches_low_frequencies() -> None:
    plain = np.asarray(llama.rope_inv_freq(CONFIG))  # head_dim 8: wavelengths 6.3 .. 4e3
    scaled = np.asarray(llama.rope_inv_freq(dataclasses.replace(CONFIG, **LLAMA3_ROPE)))
    wavelen = 2 * np.pi / plain
    high = wavelen < 64 / 4.0
    low = wavelen > 64 / 1.0
    assert high.any() and low.any() and (~high & ~low).any()
    np.testing.assert_array_equal(scaled[high], plain[high])
    np.testing.assert_allclose(scaled[low], plain[low] / 8.0, rtol=1e-6)
    mid = ~high & ~low  # interpolated: strictly between the two
    assert ((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 8.0)).all()

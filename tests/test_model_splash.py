"""lemur.model.splash: splash attention (Pallas, interpret mode on CPU) against the XLA path.

Outputs and gradients (w.r.t. q, k and v) of the kernel equal those of
`jax.nn.dot_product_attention` with the same causal and document mask, for GQA, head_dim 64
and 128, and documents that cross block edges, fill the window, or are a few tokens long.
Interpret mode compiles slowly (~6-9 s a shape here), so each shape is compiled once and
every document layout is a row of one batch. The mesh test runs this file as a script in
a subprocess (XLA_FLAGS must be set before jax is imported).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lemur.model import llama, splash
from lemur.model.config import LlamaConfig, param_shapes
from lemur.model.sharding import make_mesh

L = 256


def _segment_rows(rng: np.random.Generator) -> np.ndarray:
    """One row per document layout (4 x L int32 segment ids)."""
    one_document = np.zeros(L)
    across_edges = np.searchsorted([100, 130, 200], np.arange(L), side="right")  # blocks 128
    at_the_edge = np.arange(L) >= 128  # a boundary exactly on the block edge
    tiny = np.repeat(np.arange(L), rng.integers(1, 6, L))[:L]  # 1-5 tokens each
    return np.stack([one_document, across_edges, at_the_edge, tiny]).astype(np.int32)


def _inputs(H: int, G: int, K: int, seed: int = 0) -> tuple[jax.Array, ...]:
    """Random q (4xLxHxK), k, v (4xLxGxK), a cotangent for the output, the segment rows."""
    rng = np.random.default_rng(seed)
    q, k, v, dout = (
        jnp.asarray(rng.standard_normal((4, L, heads, K)), jnp.float32) for heads in (H, G, G, H)
    )
    return q, k, v, dout, jnp.asarray(_segment_rows(rng))


def _reference(q, k, v, segment_ids):
    """The XLA path with the dense document mask (what llama.attention did before splash)."""
    mask = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, implementation="xla")


def _output_and_grads(fn, q, k, v, dout, segment_ids):
    """fn's output and the vjp of `dout` w.r.t. q, k and v, jitted."""

    def run(q, k, v, dout, segment_ids):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, segment_ids), q, k, v)
        return out, vjp(dout)

    return jax.jit(run)(q, k, v, dout, segment_ids)


def _assert_matches_xla(H: int, G: int, K: int, block: int | None) -> None:
    """Splash (interpreted) equals the XLA path in output and every gradient, fp32."""
    q, k, v, dout, segment_ids = _inputs(H, G, K)

    def splash_fn(q, k, v, segment_ids):
        return splash.splash_attention(q, k, v, segment_ids, interpret=True, block=block)

    out, grads = _output_and_grads(splash_fn, q, k, v, dout, segment_ids)
    ref_out, ref_grads = _output_and_grads(_reference, q, k, v, dout, segment_ids)
    assert out.shape == ref_out.shape and out.dtype == ref_out.dtype
    np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-5)
    for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
        np.testing.assert_allclose(g, ref, atol=1e-4, rtol=1e-4, err_msg=f"d{name}")


def test_gqa_head_dim_64_blocks_of_128() -> None:
    # 4 query heads over 2 kv heads; L=256 in two blocks, documents crossing the edge.
    _assert_matches_xla(H=4, G=2, K=64, block=128)


def test_head_dim_128_one_kv_head_default_blocks() -> None:
    # block_size(256) is 256: the whole window in one block.
    _assert_matches_xla(H=2, G=1, K=128, block=None)


def test_block_sizes_follow_the_length() -> None:
    assert [splash.block_size(n) for n in (4096, 1536, 768, 384, 128, 100, 4000)] == [
        512,
        512,
        256,
        128,
        128,
        None,
        None,
    ]
    q = jnp.zeros((1, 200, 2, 64))
    with pytest.raises(ValueError, match=r"sequence length \(200\) to be a multiple of 128"):
        splash.splash_attention(q, q, q, interpret=True)


# GQA in the model (head_dim 16), with the train step's document masking and positions.
_MODEL = LlamaConfig(
    vocab_size=64,
    d_model=64,
    n_layers=1,  # one block: interpret mode compiles each one slowly
    n_heads=4,
    n_kv_heads=2,
    d_ff=64,
    max_seq_len=128,
    dtype="float32",
    init_std=0.1,
    attention_impl="splash",
)


def test_attention_choice_by_platform() -> None:
    auto = dataclasses.replace(_MODEL, attention_impl=None, dtype="bfloat16")
    choose = llama.choose_attention_impl
    assert choose(auto, 128, 4096, "tpu", dense_mask=False) == "splash"
    assert choose(auto, 128, 4000, "tpu", dense_mask=False) == "xla"  # no block fits
    assert choose(auto, 128, 4096, "tpu", dense_mask=True) == "xla"  # decode's padding mask
    assert choose(auto, 128, 4096, "gpu", dense_mask=False) == "cudnn"
    assert choose(auto, 128, 4096, "cpu", dense_mask=False) == "xla"
    assert choose(_MODEL, 16, 4000, "cpu", dense_mask=False) == "splash"  # explicit: kept
    assert choose(_MODEL, 16, 4096, "tpu", dense_mask=True) == "xla"


def _loss_and_grads(params, config, tokens, segment_ids, positions):
    """A next-token-style loss of the whole model and its parameter gradients."""

    def loss(params):
        logits = llama.forward(params, tokens, config, segment_ids=segment_ids, positions=positions)
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[..., 0])

    return jax.value_and_grad(loss)(params)


def test_model_with_splash_matches_xla() -> None:
    # Loss and every parameter gradient of a one-layer model through splash equal XLA's.
    rng = np.random.default_rng(1)
    params = jax.tree.map(
        lambda shape: jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32),
        param_shapes(_MODEL),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    tokens = jnp.asarray(rng.integers(0, _MODEL.vocab_size, (2, 128)))
    lengths = [[50, 40, 38], [100, 28]]
    segment_ids = jnp.asarray([np.repeat(np.arange(len(n)), n) for n in lengths])
    positions = jnp.asarray([np.concatenate([np.arange(m) for m in n]) for n in lengths])
    run = jax.jit(_loss_and_grads, static_argnums=1)
    loss, grads = run(params, _MODEL, tokens, segment_ids, positions)
    xla = dataclasses.replace(_MODEL, attention_impl="xla")
    ref_loss, ref_grads = run(params, xla, tokens, segment_ids, positions)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    flat, ref_flat = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
    for (path, g), ref in zip(flat, ref_flat, strict=True):
        np.testing.assert_allclose(g, ref, atol=1e-6, rtol=1e-4, err_msg=str(path))


def _mesh_check() -> None:
    """On 4 emulated devices (fsdp 2 x tensor 2): kv heads split with their query heads,
    and one kv head (not divisible by tensor 2) copied to each query head."""
    mesh = make_mesh(data=1, fsdp=2, tensor=2)
    for H, G in ((4, 2), (2, 1)):
        q, k, v, dout, segment_ids = _inputs(H, G, 64, seed=H)

        def sharded(q, k, v, segment_ids):
            return splash.splash_attention(q, k, v, segment_ids, interpret=True, block=128)

        with jax.set_mesh(mesh):
            out, grads = _output_and_grads(sharded, q, k, v, dout, segment_ids)
        ref_out, ref_grads = _output_and_grads(_reference, q, k, v, dout, segment_ids)
        np.testing.assert_allclose(out, ref_out, atol=2e-5, rtol=1e-5, err_msg=f"H{H} G{G}")
        for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
            np.testing.assert_allclose(g, ref, atol=1e-4, rtol=1e-4, err_msg=f"d{name} H{H} G{G}")
    print("MESH OK")


def test_sharded_over_batch_and_heads() -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    result = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MESH OK" in result.stdout


if __name__ == "__main__":
    _mesh_check()

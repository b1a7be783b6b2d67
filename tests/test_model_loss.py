"""lemur.model.loss: the chunked head + cross-entropy equals the plain one (loss and
gradients, with loss masks and documents), never holds B x L x V logits, and sizes its
chunks by the logits' bytes on one device."""

from __future__ import annotations

import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType
from test_model_llama import CONFIG

from lemur.model import llama, loss
from lemur.model.config import LlamaConfig, Params, param_shapes
from lemur.train import step as step_lib

MODEL = dataclasses.replace(CONFIG, n_layers=1)  # test_model_llama's GQA model, one layer
B, L = 3, 37  # 37 positions: chunks of 8 leave a padded tail


def _params(model: LlamaConfig) -> Params:
    """Random params from numpy, norms not all 1."""
    rng = np.random.default_rng(0)
    return jax.tree_util.tree_map_with_path(
        lambda path, shape: jnp.asarray(
            ("norm" in jax.tree_util.keystr(path)) + 0.1 * rng.standard_normal(shape),
            jnp.float32,
        ),
        param_shapes(model),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _batch() -> dict[str, jax.Array]:
    """Two documents per row, a chat-style loss mask (prompt tokens masked) and padding."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, MODEL.vocab_size, (B, L + 1))
    mask = np.ones((B, L), np.int32)
    mask[:, :6] = 0  # a prompt
    mask[0, 30:] = 0  # padding at the end of a row
    mask[2] = 0  # an all-padding row
    segment_ids = np.where(np.arange(L) < 20, 1, 2).repeat(B).reshape(L, B).T
    positions = np.where(np.arange(L) < 20, np.arange(L), np.arange(L) - 20)
    return {
        "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
        "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
        "segment_ids": jnp.asarray(segment_ids, jnp.int32),
        "positions": jnp.asarray(np.broadcast_to(positions, (B, L)), jnp.int32),
        "loss_mask": jnp.asarray(mask),
    }


def _loss_and_grads(params: Params, batch: dict, model: LlamaConfig) -> tuple:
    """The train step's objective (masked token losses over the valid count) and grads."""

    def objective(params: Params) -> jax.Array:
        losses = step_lib.token_losses(params, batch, model, document_attention=True)
        return losses.sum() / batch["loss_mask"].sum()

    return jax.value_and_grad(objective)(params)


_run = jax.jit(_loss_and_grads, static_argnums=2)


@pytest.mark.parametrize(
    "tied, chunks",
    # 5 chunks of 8 (3 padded positions); one position per chunk; the tied head.
    [(False, (8, 1)), (True, (8,))],
)
def test_chunked_loss_and_grads_equal_the_plain_ones(tied: bool, chunks: tuple) -> None:
    plain = dataclasses.replace(MODEL, tie_embeddings=tied, logits_chunk=L)
    params = _params(plain)
    batch = _batch()
    ref_loss, ref_grads = _run(params, batch, plain)
    for chunk in chunks:
        loss_value, grads = _run(params, batch, dataclasses.replace(plain, logits_chunk=chunk))
        np.testing.assert_allclose(loss_value, ref_loss, rtol=1e-6, err_msg=f"chunk {chunk}")
        for (path, g), ref in zip(
            jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads), strict=True
        ):
            np.testing.assert_allclose(g, ref, atol=1e-7, rtol=1e-5, err_msg=f"{chunk} {path}")


@jax.jit
def _plain_and_chunked_ce(params: Params, batch: dict) -> tuple[jax.Array, jax.Array]:
    """optax's CE of the whole logits, and the chunked per-token CE (chunks of 8)."""
    x = llama.hidden_states(params, llama.embed_tokens(params, batch["inputs"], MODEL), MODEL)
    logits = llama.output_head(params, x, MODEL)
    plain = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
    chunked_model = dataclasses.replace(MODEL, logits_chunk=8)
    return plain, loss.token_cross_entropy(params, x, batch["targets"], chunked_model)


def test_per_token_losses_are_optax_cross_entropy() -> None:
    # Token by token (masks applied after), the chunked values are the plain logits' CE;
    # the eval step sums them over the loss mask.
    params, batch = _params(MODEL), _batch()
    expected, chunked = _plain_and_chunked_ce(params, batch)
    np.testing.assert_allclose(chunked, expected, rtol=1e-6, atol=1e-6)
    chunked_model = dataclasses.replace(MODEL, logits_chunk=8)
    eval_step = jax.jit(step_lib.make_eval_step(chunked_model, document_attention=False))
    loss_sum, count = eval_step(params, batch)
    np.testing.assert_allclose(loss_sum, (expected * batch["loss_mask"]).sum(), rtol=1e-5)
    assert int(count) == int(batch["loss_mask"].sum())


def _largest_vocab_array(fn, *args) -> int:
    """Elements of the largest array with a vocab-sized last dim anywhere in fn's jaxpr
    (the scan's body included)."""
    largest = 0

    def walk(jaxpr: jax.extend.core.Jaxpr) -> None:
        nonlocal largest
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                shape = getattr(var.aval, "shape", ())
                if shape and shape[-1] == MODEL.vocab_size:
                    largest = max(largest, int(np.prod(shape)))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return largest


def test_chunked_grad_never_holds_the_whole_logits() -> None:
    params, batch = _params(MODEL), _batch()
    whole = _largest_vocab_array(lambda p: _loss_and_grads(p, batch, MODEL), params)
    chunked = dataclasses.replace(MODEL, logits_chunk=8)
    largest = _largest_vocab_array(lambda p: _loss_and_grads(p, batch, chunked), params)
    assert whole == B * L * MODEL.vocab_size  # the plain path: the whole B x L x V
    assert largest == max(B * 8 * MODEL.vocab_size, MODEL.d_model * MODEL.vocab_size)


def test_chunk_length_bounds_the_logits_bytes_per_device() -> None:
    llama3 = dataclasses.replace(MODEL, vocab_size=128256)
    budget = loss.LOGITS_CHUNK_BYTES
    assert loss.chunk_length(llama3, 4, 4096) == budget // (4 * 4 * 128256)  # 130
    assert loss.chunk_length(MODEL, 4, 4096) == 4096  # a small vocab: one chunk
    assert loss.chunk_length(dataclasses.replace(llama3, logits_chunk=512), 4, 4096) == 512
    # 8 devices, 2-way tensor (vocab) x 4-way fsdp (rows): 16 rows -> 4 rows of 64128 ids.
    mesh = AbstractMesh((1, 4, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    with jax.sharding.use_abstract_mesh(mesh):
        assert loss.chunk_length(llama3, 16, 4096) == budget // (4 * 4 * 64128)


def test_logits_chunk_must_be_positive() -> None:
    for bad in (0, -8, 2.5, True):
        with pytest.raises(ValueError, match="logits_chunk"):
            dataclasses.replace(MODEL, logits_chunk=bad)

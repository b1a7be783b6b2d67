"""lemur.train.step: schedule, optimizer, state shardings, masked loss, gradient accumulation."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from lemur.model import llama
from lemur.model import sharding as model_sharding
from lemur.model.config import LlamaConfig, Params, param_shapes
from lemur.train import step as step_lib
from lemur.train.batch import HostSlice, host_slice
from lemur.train.config import MeshConfig, OptimizerConfig, ScheduleConfig

MODEL = LlamaConfig(
    vocab_size=64,
    d_model=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    d_ff=32,
    max_seq_len=32,
    dtype="float32",
    init_std=0.1,
)
B, L = 8, 16


def _params(model: LlamaConfig = MODEL) -> Params:
    """Random params from numpy (compiling the threefry init would cost seconds here)."""
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda shape: jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32),
        param_shapes(model),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _batch(seed: int = 0) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, MODEL.vocab_size, (B, L + 1))
    mask = (rng.random((B, L)) > 0.2).astype(np.int32)
    segment_ids = np.repeat([[1] * 5 + [2] * (L - 5)], B, 0)
    positions = np.repeat([list(range(5)) + list(range(L - 5))], B, 0)
    return {
        "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
        "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
        "segment_ids": jnp.asarray(segment_ids, jnp.int32),
        "positions": jnp.asarray(positions, jnp.int32),
        "loss_mask": jnp.asarray(mask, jnp.int32),
    }


def test_schedule_warmup_cosine_to_ten_percent() -> None:
    cfg = ScheduleConfig(peak_lr=4e-5, warmup_steps=2000, decay="cosine", final_lr_ratio=0.1)
    lr = step_lib.make_schedule(cfg, 20000)
    np.testing.assert_allclose(float(lr(0)), 4e-5 / 2000, rtol=1e-5)  # the first step moves
    np.testing.assert_allclose(float(lr(1999)), 4e-5, rtol=1e-6)
    np.testing.assert_allclose(float(lr(2000)), 4e-5, rtol=1e-6)
    np.testing.assert_allclose(float(lr(11000)), 0.55 * 4e-5, rtol=1e-4)  # halfway: mean
    np.testing.assert_allclose(float(lr(20000)), 4e-6, rtol=1e-5)
    np.testing.assert_allclose(float(lr(30000)), 4e-6, rtol=1e-5)  # floor after the end
    values = np.asarray(jax.vmap(lr)(jnp.arange(2000, 20001, 500)))
    assert (np.diff(values) <= 0).all()
    linear = step_lib.make_schedule(
        ScheduleConfig(peak_lr=1.0, warmup_steps=0, decay="linear", final_lr_ratio=0.0), 10
    )
    np.testing.assert_allclose(float(linear(5)), 0.5, rtol=1e-6)
    const = step_lib.make_schedule(
        ScheduleConfig(peak_lr=1.0, warmup_steps=4, decay="constant"), 10
    )
    assert [float(const(s)) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]


def test_weight_decay_skips_norms_and_biases() -> None:
    params = _params(dataclasses.replace(MODEL, arch="qwen2", qkv_bias=True))
    mask = step_lib.decay_mask(params)
    assert mask["layers"]["wq"] and mask["embed"] and mask["lm_head"]
    assert not mask["final_norm"] and not mask["layers"]["attn_norm"]
    assert not any(mask["layers"][name] for name in ("bq", "bk", "bv"))
    tx = step_lib.make_optimizer(OptimizerConfig(weight_decay=0.5, grad_clip=0.0), lambda s: 0.1)

    @jax.jit
    def update(params: Params) -> Params:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return tx.update(zeros, tx.init(params), params)[0]

    updates = update(params)
    assert float(jnp.abs(updates["final_norm"]).max()) == 0.0
    assert float(jnp.abs(updates["layers"]["bq"]).max()) == 0.0
    assert float(jnp.abs(updates["layers"]["wq"]).max()) > 0.0


def test_moments_shard_like_their_params() -> None:
    tx = step_lib.make_optimizer(OptimizerConfig(), lambda s: 1e-3)
    key = jax.random.key(0)
    abstract = jax.eval_shape(functools.partial(step_lib.init_state, model=MODEL, tx=tx), key)
    m = MeshConfig()
    mesh = model_sharding.make_mesh(m.data, m.fsdp, m.tensor)
    sh = step_lib.state_shardings(abstract, MODEL, tx, mesh)
    adam = sh["opt_state"][1][0]
    assert (
        adam.mu["layers"]["wq"].spec
        == sh["params"]["layers"]["wq"].spec
        == P(None, "fsdp", "tensor", None)
    )
    assert adam.nu["embed"].spec == P("tensor", "fsdp") and adam.count.spec == P()
    state = jax.jit(lambda k, p: step_lib.init_state(k, MODEL, tx, params=p), out_shardings=sh)(
        key, _params()
    )
    assert state["params"]["layers"]["wq"].sharding == sh["params"]["layers"]["wq"]
    assert int(state["step"]) == 0 and state["rng"].dtype == jnp.uint32


@pytest.fixture(scope="module")
def setup() -> tuple:
    lr = step_lib.make_schedule(ScheduleConfig(peak_lr=1e-2, warmup_steps=0), 10)
    tx = step_lib.make_optimizer(OptimizerConfig(), lr)
    state = jax.jit(lambda k, p: step_lib.init_state(k, MODEL, tx, params=p))(
        jax.random.key(0), _params()
    )
    one_pass = jax.jit(step_lib.make_train_step(MODEL, tx, lr))
    return tx, lr, state, one_pass


def test_loss_is_the_mean_over_valid_tokens(setup: tuple) -> None:
    _, _, state, one_pass = setup
    batch = _batch()
    _, metrics = one_pass(state, batch)

    @jax.jit
    def reference(params: Params, batch: dict) -> tuple:
        logp = jax.nn.log_softmax(llama.forward(params, batch["inputs"], MODEL))
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
        mask = batch["loss_mask"]
        # Document attention changes the loss only after the first document boundary.
        doc = step_lib.token_losses(params, batch, MODEL, document_attention=True)
        plain = step_lib.token_losses(params, batch, MODEL, document_attention=False)
        return (nll * mask).sum() / mask.sum(), doc, plain

    expected, doc, plain = reference(state["params"], batch)
    np.testing.assert_allclose(float(metrics["loss"]), float(expected), rtol=1e-5)
    assert int(metrics["tokens"]) == int(batch["loss_mask"].sum())
    np.testing.assert_allclose(np.asarray(doc[:, :5]), np.asarray(plain[:, :5]), rtol=1e-5)
    assert not np.allclose(np.asarray(doc[:, 5:]), np.asarray(plain[:, 5:]))


def test_gradient_accumulation_equals_one_pass(setup: tuple) -> None:
    tx, lr, state, one_pass = setup
    batch = _batch(1)
    s1, m1 = one_pass(state, batch)
    s4, m4 = jax.jit(step_lib.make_train_step(MODEL, tx, lr, microbatches=4))(state, batch)
    np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-6)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
    # Adam's first moment is linear in the gradients: compare it rather than the params (the
    # first Adam step is ~lr * sign(g), which amplifies rounding where g is ~0).
    mu1, mu4 = s1["opt_state"][1][0].mu, s4["opt_state"][1][0].mu
    for a, b in zip(jax.tree.leaves(mu4), jax.tree.leaves(mu1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-9)
    assert int(s4["step"]) == 1


def test_host_slice_single_process() -> None:
    m = MeshConfig()
    mesh = model_sharding.make_mesh(m.data, m.fsdp, m.tensor)
    sharding = model_sharding.batch_sharding(mesh, (8, 16))
    assert host_slice(sharding, (8, 16)) == HostSlice(index=0, count=1, rows=8)

"""lemur.model.sharding: the partition table, and a sharded forward on 8 emulated devices.

The mesh test runs this file as a script in a subprocess, because XLA_FLAGS must be set
before jax is first imported and pytest (or another test module) already imported it.
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
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from lemur.model import llama, sharding
from lemur.model.config import PRESETS, LlamaConfig, Params, param_shapes
from lemur.model.sharding import MESH_AXES

MESH_CONFIG = LlamaConfig(
    vocab_size=128,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    d_ff=128,
    max_seq_len=64,
    dtype="float32",
    init_std=0.1,
)


def _abstract(config: LlamaConfig) -> Params:
    """ShapeDtypeStructs of the params (no memory, no compile)."""
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s, jnp.float32),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _mesh(data: int, fsdp: int, tensor: int) -> AbstractMesh:
    """An abstract (device-free) mesh with Auto axes."""
    return AbstractMesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


@pytest.mark.parametrize("name", ["tiny", "llama2-70b", "llama3.2-1b", "qwen2.5-7b"])
def test_every_param_has_a_spec_of_its_rank(name: str) -> None:
    config = PRESETS[name]
    abstract = _abstract(config)
    specs = sharding.param_partition_specs(abstract, config)
    flat_specs = jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))
    flat_params = jax.tree.leaves(abstract)
    assert len(flat_specs) == len(flat_params)
    for spec, leaf in zip(flat_specs, flat_params, strict=True):
        assert isinstance(spec, P) and len(spec) == leaf.ndim
    # The layer axis is never split (scan slices it); the big matrices are split both ways.
    assert all(
        s[0] is None for s in jax.tree.leaves(specs["layers"], is_leaf=lambda x: isinstance(x, P))
    )
    assert specs["layers"]["wq"] == P(None, "fsdp", "tensor", None)
    assert specs["layers"]["w_down"] == P(None, "tensor", "fsdp")
    assert specs["embed"] == P("tensor", "fsdp")
    # A tied head has no matrix of its own (the logits use embed, split the same way).
    assert specs.get("lm_head") == (None if config.tie_embeddings else P("fsdp", "tensor"))
    # Qwen2's biases are split by head, as the q/k/v projections' outputs they add to.
    biases = {n: specs["layers"].get(n) for n in ("bq", "bk", "bv")}
    want = P(None, "tensor", None) if config.qkv_bias else None
    assert biases == dict.fromkeys(biases, want)


def test_table_rejects_unknown_params_and_wrong_layer_count() -> None:
    config = PRESETS["tiny"]
    with pytest.raises(KeyError, match="layers/w_extra"):
        sharding.param_partition_specs({"layers": {"w_extra": np.zeros((2, 3))}}, config)
    with pytest.raises(ValueError, match="n_layers"):
        sharding.param_partition_specs({"layers": {"wq": np.zeros((3, 64, 4, 16))}}, config)


def test_specs_fit_the_mesh() -> None:
    config = PRESETS["llama2-70b"]
    specs = sharding.param_partition_specs(_abstract(config), config, _mesh(1, 4, 16))
    # 8 KV heads do not split 16 ways: replicated; 64 query heads do.
    assert specs["layers"]["wk"] == P(None, "fsdp", None, None)
    assert specs["layers"]["wq"] == P(None, "fsdp", "tensor", None)
    assert specs["embed"] == P("tensor", "fsdp")  # 32000 % 16 == 0
    tiny = MESH_CONFIG
    specs = sharding.param_partition_specs(_abstract(tiny), tiny, _mesh(2, 2, 2))
    assert specs["layers"]["wk"] == P(None, "fsdp", "tensor", None)
    # The batch spans data x fsdp when it divides, else what divides.
    assert sharding.fit_spec(P(("data", "fsdp"), None), (8, 5), _mesh(2, 2, 2)) == P(
        ("data", "fsdp"), None
    )
    assert sharding.fit_spec(P(("data", "fsdp"), None), (2, 5), _mesh(2, 2, 2)) == P("data", None)
    assert sharding.fit_spec(P("tensor"), (6,), _mesh(1, 1, 4)) == P(None)


def test_constrain_is_a_noop_without_a_mesh() -> None:
    x = jnp.ones((2, 3, 4))
    assert sharding.constrain(x, "BLD") is x


def test_make_mesh_single_device() -> None:
    mesh = sharding.make_mesh()
    assert mesh.axis_names == MESH_AXES
    assert dict(mesh.shape) == {"data": 1, "fsdp": jax.device_count(), "tensor": 1}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    with pytest.raises(ValueError, match="at most one"):
        sharding.make_mesh(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="needs"):
        sharding.make_mesh(data=jax.device_count() + 1, fsdp=1)


def test_sharded_forward_and_grads_equal_unsharded_on_8_cpu_devices() -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    result = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--mesh-check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MESH OK" in result.stdout, result.stdout + result.stderr


def _mesh_check() -> None:
    """Subprocess body: (data 2, fsdp 2, tensor 2) sharded run == single-device run."""
    assert jax.device_count() == 8, jax.devices()
    _mesh_check_one(MESH_CONFIG)
    # Llama-3.2 style: the tied head reuses the (tensor, fsdp)-split embedding.
    _mesh_check_one(
        dataclasses.replace(
            MESH_CONFIG,
            tie_embeddings=True,
            rope_type="llama3",
            rope_theta=500000.0,
            rope_factor=32.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_original_max_seq_len=16,
        )
    )
    # Qwen2 style: q/k/v biases (split by head over tensor), tied head, theta 1e6.
    _mesh_check_one(
        dataclasses.replace(
            MESH_CONFIG, arch="qwen2", qkv_bias=True, tie_embeddings=True, rope_theta=1e6
        )
    )
    print("MESH OK")


def _mesh_check_one(config: LlamaConfig) -> None:
    """One config: the sharded loss, logits and gradients equal the single-device ones."""
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: jnp.asarray(0.1 * rng.standard_normal(s), jnp.float32),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    B, L = 4, 16
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (B, L)), jnp.int32)
    segment_ids = jnp.asarray(np.repeat([[1] * 6 + [2] * 10], B, 0), jnp.int32)
    positions = jnp.asarray(np.repeat([list(range(6)) + list(range(10))], B, 0), jnp.int32)

    def loss_and_logits(p, tok, seg, pos, cfg):
        logits = llama.forward(p, tok, cfg, segment_ids=seg, positions=pos)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0]), logits

    step = jax.jit(jax.value_and_grad(loss_and_logits, has_aux=True), static_argnums=4)
    (ref_loss, ref_logits), ref_grads = step(params, tokens, segment_ids, positions, config)
    assert len(ref_logits.sharding.device_set) == 1

    mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
    sparams = jax.device_put(params, sharding.param_shardings(params, config, mesh))
    assert sparams["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor", None)
    batch = sharding.batch_sharding(mesh, (B, L))
    stok, sseg, spos = (jax.device_put(x, batch) for x in (tokens, segment_ids, positions))
    # The sharded run also goes through scan + remat, the path used at scale.
    scfg = dataclasses.replace(config, scan_layers=True, remat="dots")
    with jax.set_mesh(mesh):
        (loss, logits), grads = step(sparams, stok, sseg, spos, scfg)
    assert logits.sharding.spec == P(("data", "fsdp"), None, "tensor"), logits.sharding
    assert len(logits.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    for g, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), atol=1e-6, rtol=1e-4)


if __name__ == "__main__" and "--mesh-check" in sys.argv:
    _mesh_check()

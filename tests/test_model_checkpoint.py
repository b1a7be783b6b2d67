"""lemur.model.checkpoint: params + config saved with orbax, restored to host or devices."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from lemur.model import checkpoint
from lemur.model.config import Params, config_from_preset, param_shapes

CONFIG = config_from_preset("tiny", n_layers=1, remat="dots")


def _params(seed: int = 0) -> Params:
    """Random numpy params of CONFIG's shapes."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: rng.standard_normal(s).astype(np.float32),
        param_shapes(CONFIG),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    params = _params()
    checkpoint.save_params(tmp_path / "ckpt", params, CONFIG)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["remat"] == "dots"
    assert checkpoint.load_checkpoint_config(tmp_path / "ckpt") == CONFIG
    restored, config = checkpoint.load_params(tmp_path / "ckpt")
    assert config == CONFIG
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(params), strict=True):
        assert isinstance(a, np.ndarray)
        np.testing.assert_array_equal(a, b)
    abstract = checkpoint.abstract_params(tmp_path / "ckpt")
    assert jax.tree.map(lambda x: x.shape, abstract) == param_shapes(CONFIG)


def test_jax_arrays_restore_to_host_or_to_a_target(tmp_path: Path) -> None:
    params = jax.tree.map(jnp.asarray, _params(1))
    checkpoint.save_params(tmp_path / "ckpt", params, CONFIG)
    host, _ = checkpoint.load_params(tmp_path / "ckpt")  # saved from devices, read as numpy
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(host))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=device), params
    )
    on_device, _ = checkpoint.load_params(tmp_path / "ckpt", target)
    assert all(
        isinstance(x, jax.Array) and x.dtype == jnp.bfloat16 for x in jax.tree.leaves(on_device)
    )
    np.testing.assert_array_equal(on_device["embed"], params["embed"].astype(jnp.bfloat16))

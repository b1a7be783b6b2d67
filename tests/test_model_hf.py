"""lemur.model.hf + lemur.convert.cli (lemur-convert): parity with transformers' LlamaForCausalLM.

Llama-2 style (default rope, untied head) and Llama-3 style (llama3 rope scaling, with and
without the tied head of Llama-3.2) random tiny models.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from types import ModuleType

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: every model here is random

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from lemur.model import checkpoint, hf, llama  # noqa: E402
from lemur.model.config import LLAMA3_ROPE_FIELDS, PRESETS, LlamaConfig, Params, param_shapes

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
VOCAB, SEQ = 128, 24
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def _llama3_rope(factor: float) -> dict:
    """Llama-3.1's rope scaling, but with an original context of 64 instead of 8192.

    With head_dim 16 and theta 5e5 the wavelengths are 6.3, 32, 167, ... positions, so
    against 64 / high_freq_factor = 16 and 64 / low_freq_factor = 64 one frequency is kept,
    one interpolated and the rest divided by factor: all three branches, and angles that
    differ by radians within the SEQ test positions.
    """
    return {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }


def _hf_model(
    n_kv_heads: int, seed: int, rope: dict | None = None, tied: bool = False
) -> transformers.LlamaForCausalLM:
    """A random fp32 HF Llama (norm weights randomised too, so a mix-up would show)."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        rope_parameters=dict(rope or DEFAULT_ROPE),
        tie_word_embeddings=tied,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module", params=[2, 4], ids=["gqa", "mha"])
def hf_model(request: pytest.FixtureRequest) -> transformers.LlamaForCausalLM:
    """Tiny random HF models: grouped-query (4 heads, 2 kv) and multi-head attention."""
    return _hf_model(request.param, seed=request.param)


# Llama-3.2 style (tied head, factor 32, 4:1 GQA) and Llama-3.1 style (untied, factor 8).
LLAMA3_STYLES = {
    "llama3.2-tied": dict(n_kv_heads=1, rope=_llama3_rope(32.0), tied=True),
    "llama3.1-untied": dict(n_kv_heads=2, rope=_llama3_rope(8.0), tied=False),
}


@pytest.fixture(scope="module", params=list(LLAMA3_STYLES))
def llama3_model(request: pytest.FixtureRequest) -> transformers.LlamaForCausalLM:
    """Tiny random Llama-3-style HF models."""
    model = _hf_model(seed=11, **LLAMA3_STYLES[request.param])
    assert (
        model.lm_head.weight is model.model.embed_tokens.weight
    ) == model.config.tie_word_embeddings
    return model


def _state_dict(model: transformers.LlamaForCausalLM) -> dict[str, np.ndarray]:
    """The HF state dict as numpy arrays."""
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _hf_logits(model: transformers.LlamaForCausalLM, tokens: np.ndarray) -> np.ndarray:
    """Reference logits from transformers (torch, CPU, fp32)."""
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


@functools.partial(jax.jit, static_argnames="config")
def _forward(params: Params, tokens: jax.Array, config: LlamaConfig) -> jax.Array:
    """Jitted lemur forward."""
    return llama.forward(params, tokens, config)


def _tokens(seed: int = 0) -> np.ndarray:
    """A random 2 x SEQ batch."""
    return np.random.default_rng(seed).integers(0, VOCAB, (2, SEQ))


def _lemur_config(model: transformers.LlamaForCausalLM) -> LlamaConfig:
    """The lemur config of an HF model, computing in fp32 for parity."""
    return hf.config_from_hf(model.config.to_dict(), dtype="float32")


def test_logits_match_transformers(hf_model: transformers.LlamaForCausalLM) -> None:
    config = _lemur_config(hf_model)
    assert config.n_kv_heads == hf_model.config.num_key_value_heads
    params = hf.params_from_hf(_state_dict(hf_model).__getitem__, config)
    tokens = _tokens()
    ref = _hf_logits(hf_model, tokens)
    out = np.asarray(_forward(params, jnp.asarray(tokens), config))
    assert np.abs(out - ref).max() <= 1e-4, np.abs(out - ref).max()
    assert np.abs(ref).max() > 1.0  # the comparison is not between near-zero numbers


def test_rotary_permutation_is_needed(hf_model: transformers.LlamaForCausalLM) -> None:
    # Loading q/k with a plain transpose (no un-permute) must break parity: the test above
    # would otherwise not prove that the rotary layout is handled.
    config = _lemur_config(hf_model)
    state = _state_dict(hf_model)
    params = hf.params_from_hf(state.__getitem__, config)
    for name in ("wq", "wk"):
        hf_name = hf.HF_LAYER_NAMES[name]
        n = config.n_heads if name == "wq" else config.n_kv_heads
        params["layers"][name] = np.stack(
            [
                state[f"model.layers.{i}.{hf_name}"].T.reshape(config.d_model, n, config.head_dim)
                for i in range(config.n_layers)
            ]
        )
    out = np.asarray(_forward(params, jnp.asarray(_tokens()), config))
    assert np.abs(out - _hf_logits(hf_model, _tokens())).max() > 1e-2


def test_state_dict_round_trip_is_identical(hf_model: transformers.LlamaForCausalLM) -> None:
    config = _lemur_config(hf_model)
    state = _state_dict(hf_model)
    params = hf.params_from_hf(state.__getitem__, config)
    back = dict(hf.params_to_hf(params, config, dtype="float32"))
    assert list(back) == [name for name, _, _ in hf.hf_names(config)]
    assert set(back) == set(state)
    for name, w in state.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)


def _load_tool() -> ModuleType:
    """The converter behind `lemur-convert`."""
    from lemur.convert import cli as convert

    return convert


def _read_hf_dir(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of an HF safetensors directory."""
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_convert_tool_round_trip(tmp_path: Path) -> None:
    model = _hf_model(n_kv_heads=2, seed=7)
    src = tmp_path / "hf"
    model.save_pretrained(src, max_shard_size="40KB")  # several shards + index
    assert (src / "model.safetensors.index.json").exists()
    tool = _load_tool()

    # HF (sharded) -> lemur.
    assert tool.main(["to-lemur", str(src), str(tmp_path / "lemur")]) == 0
    params, config = checkpoint.load_params(tmp_path / "lemur")
    assert config == hf.config_from_hf(model.config.to_dict())
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in jax.tree.leaves(params))
    assert jax.tree.map(np.shape, params) == param_shapes(config)

    # The converted model gives the same logits as transformers.
    fp32 = dataclasses.replace(config, dtype="float32")
    tokens = _tokens(1)
    ours = np.asarray(_forward(params, jnp.asarray(tokens), fp32))
    assert np.abs(ours - _hf_logits(model, tokens)).max() <= 1e-4

    # lemur -> HF: identical tensors in fp32, both sharded and single-file.
    original = _state_dict(model)
    argv = [
        "to-hf",
        str(tmp_path / "lemur"),
        str(tmp_path / "out"),
        "--dtype",
        "float32",
        "--shard-gb",
        str(60e3 / 2**30),
    ]
    assert tool.main(argv) == 0
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(original)
    assert len(set(index["weight_map"].values())) > 1
    back = _read_hf_dir(tmp_path / "out")
    assert set(back) == set(original)
    for name, w in original.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)

    assert tool.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "one")]) == 0
    # save_pretrained's generation_config.json travels along unchanged (lemur.model.pretrained).
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    generation = (tmp_path / "one" / "generation_config.json").read_bytes()
    assert generation == (src / "generation_config.json").read_bytes()
    back16 = load_file(tmp_path / "one" / "model.safetensors")  # default: bf16
    for name, w in original.items():
        assert back16[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(back16[name], w.astype(jnp.bfloat16), err_msg=name)

    # transformers loads what we wrote and computes the same logits as our model.
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert reloaded.config.num_key_value_heads == 2
    assert np.abs(_hf_logits(reloaded, tokens) - ours).max() <= 1e-4

    # Exported bf16 -> lemur -> bf16 is exact too (bf16 -> fp32 -> bf16 loses nothing).
    assert tool.main(["to-lemur", str(tmp_path / "one"), str(tmp_path / "lemur16")]) == 0
    assert tool.main(["to-hf", str(tmp_path / "lemur16"), str(tmp_path / "one16")]) == 0
    again = load_file(tmp_path / "one16" / "model.safetensors")
    for name, w in back16.items():
        np.testing.assert_array_equal(again[name], w, err_msg=name)


def test_convert_tool_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tool = _load_tool()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert tool.main(["to-lemur", str(tmp_path), str(tmp_path / "x")]) == 2
    assert "no model.safetensors" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_type='linear'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"rope_parameters": {"rope_type": "longrope"}}, "rope_type='longrope'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "without factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"model_type": "gemma"}, "not a Llama, Qwen2 or Mistral"),
    ],
)
def test_config_from_hf_refuses_other_architectures(change: dict, message: str) -> None:
    base = hf.config_to_hf(PRESETS["tiny"])
    with pytest.raises(ValueError, match=message):
        hf.config_from_hf({**base, **change})


def test_config_round_trip_and_llama2_70b_hf_config() -> None:
    for name in ("tiny", "llama2-7b", "llama2-70b"):
        config = PRESETS[name]
        back = hf.config_from_hf(hf.config_to_hf(config))
        assert back == dataclasses.replace(config, dtype="bfloat16")
    # meta-llama/Llama-2-70b-hf config.json (transformers 4.x style: rope_theta at top level).
    published = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    assert hf.config_from_hf(published) == PRESETS["llama2-70b"]
    # transformers itself reads our config.json back to the same shapes.
    ours = transformers.LlamaConfig(**hf.config_to_hf(PRESETS["llama2-70b"]))
    assert (ours.num_key_value_heads, ours.intermediate_size, ours.head_dim) == (8, 28672, 128)
    assert ours.rope_parameters["rope_theta"] == 10000.0


def _lemur_params(model: transformers.LlamaForCausalLM, config: LlamaConfig) -> Params:
    """lemur params from an HF model's state dict (which holds lm_head.weight even when tied)."""
    return hf.params_from_hf(_state_dict(model).__getitem__, config)


def test_llama3_logits_match_transformers(llama3_model: transformers.LlamaForCausalLM) -> None:
    config = _lemur_config(llama3_model)
    assert (config.rope_type, config.rope_theta, config.rope_original_max_seq_len) == (
        "llama3",
        500000.0,
        64,
    )
    assert config.tie_embeddings == llama3_model.config.tie_word_embeddings
    params = _lemur_params(llama3_model, config)
    assert ("lm_head" in params) != config.tie_embeddings  # tied: no separate head matrix
    tokens = _tokens(2)
    ref = _hf_logits(llama3_model, tokens)
    out = np.asarray(_forward(params, jnp.asarray(tokens), config))
    diff = float(np.abs(out - ref).max())
    print(
        f"llama3 parity ({config.tie_embeddings=}): max |logit diff| {diff:.2e}, "
        f"max |logit| {np.abs(ref).max():.2f}"
    )
    assert diff <= 1e-4, diff
    assert np.abs(ref).max() > 1.0


def test_llama3_inv_freq_matches_transformers_and_is_scaled(
    llama3_model: transformers.LlamaForCausalLM,
) -> None:
    config = _lemur_config(llama3_model)
    ours = np.asarray(llama.rope_inv_freq(config))
    np.testing.assert_allclose(ours, llama3_model.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)
    plain = np.asarray(llama.rope_inv_freq(_without_scaling(config)))
    # All three branches occur: kept (high frequency), interpolated, divided by factor.
    kept = np.isclose(ours, plain, rtol=1e-6)
    divided = np.isclose(ours, plain / config.rope_factor, rtol=1e-6)
    assert kept.sum() == 1 and kept[0], ours / plain
    assert divided.sum() == len(ours) - 2 and not divided[1], ours / plain


def _without_scaling(config: LlamaConfig) -> LlamaConfig:
    """The same config with plain theta^(-2i/K) rotary frequencies."""
    return dataclasses.replace(config, rope_type="default", **dict.fromkeys(LLAMA3_ROPE_FIELDS))


def test_llama3_rope_scaling_is_needed(llama3_model: transformers.LlamaForCausalLM) -> None:
    # Ignoring the scaling must break parity, or the parity test would not prove it is done.
    config = _lemur_config(llama3_model)
    params = _lemur_params(llama3_model, config)
    tokens = _tokens(2)
    out = np.asarray(_forward(params, jnp.asarray(tokens), _without_scaling(config)))
    assert np.abs(out - _hf_logits(llama3_model, tokens)).max() > 1e-2


def test_llama3_state_dict_round_trip_is_identical(
    llama3_model: transformers.LlamaForCausalLM,
) -> None:
    config = _lemur_config(llama3_model)
    state = _state_dict(llama3_model)
    back = dict(hf.params_to_hf(_lemur_params(llama3_model, config), config, dtype="float32"))
    tied = {"lm_head.weight"} if config.tie_embeddings else set()
    assert set(back) == set(state) - tied  # a tied export writes no lm_head, as HF does
    for name, w in back.items():
        np.testing.assert_array_equal(w, state[name], err_msg=name)


def test_tied_checkpoint_with_a_different_head_is_refused() -> None:
    model = _hf_model(n_kv_heads=2, seed=3, rope=_llama3_rope(32.0), tied=True)
    config = _lemur_config(model)
    state = _state_dict(model)
    state["lm_head.weight"] = state["lm_head.weight"] + np.float32(1e-3)
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        hf.params_from_hf(state.__getitem__, config)


def test_convert_tool_round_trip_tied_llama3(tmp_path: Path) -> None:
    model = _hf_model(n_kv_heads=2, seed=5, rope=_llama3_rope(32.0), tied=True)
    src = tmp_path / "hf"
    model.save_pretrained(src, max_shard_size="40KB")
    original = _read_hf_dir(src)
    assert "lm_head.weight" not in original  # what a real Llama-3.2 checkpoint looks like
    tool = _load_tool()

    assert tool.main(["to-lemur", str(src), str(tmp_path / "lemur")]) == 0
    params, config = checkpoint.load_params(tmp_path / "lemur")
    assert config.tie_embeddings and config.rope_type == "llama3" and "lm_head" not in params
    assert jax.tree.map(np.shape, params) == param_shapes(config)
    tokens = _tokens(3)
    ours = np.asarray(
        _forward(params, jnp.asarray(tokens), dataclasses.replace(config, dtype="float32"))
    )
    assert np.abs(ours - _hf_logits(model, tokens)).max() <= 1e-4

    # lemur -> HF: the same tensors (no lm_head), and a config.json with the same rope
    # scaling and tie_word_embeddings.
    assert (
        tool.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "out"), "--dtype", "float32"])
        == 0
    )
    back = _read_hf_dir(tmp_path / "out")
    assert set(back) == set(original)
    for name, w in original.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((src / "config.json").read_text())
    assert written["tie_word_embeddings"] is True
    assert written["rope_scaling"] == {
        k: v for k, v in source["rope_parameters"].items() if k != "rope_theta"
    }
    assert hf.config_from_hf(written) == hf.config_from_hf(source)

    # transformers reads it as the same tied, llama3-scaled model.
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert reloaded.config.rope_parameters == model.config.rope_parameters
    assert np.abs(_hf_logits(reloaded, tokens) - ours).max() <= 1e-4

    # Export -> import -> export is bit-identical, file for file.
    assert tool.main(["to-lemur", str(tmp_path / "out"), str(tmp_path / "lemur2")]) == 0
    assert (
        tool.main(["to-hf", str(tmp_path / "lemur2"), str(tmp_path / "out2"), "--dtype", "float32"])
        == 0
    )
    for file in sorted((tmp_path / "out").iterdir()):
        assert file.read_bytes() == (tmp_path / "out2" / file.name).read_bytes(), file.name


@pytest.mark.parametrize("scaling", [None, {"rope_type": "default"}, {"type": "default"}])
def test_default_rope_scaling_means_none(scaling: dict | None) -> None:
    base = hf.config_to_hf(PRESETS["llama2-7b"])
    del base["rope_parameters"]  # a transformers 4.x config.json
    config = hf.config_from_hf({**base, "rope_scaling": scaling})
    assert config == PRESETS["llama2-7b"]


# config.json of meta-llama/Llama-3.2-1B and meta-llama/Llama-3.1-8B (transformers 4.x).
LLAMA3_PUBLISHED = {
    "llama3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_hidden_layers=16,
        head_dim=64,
        tie_word_embeddings=True,
        rope_scaling={
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "rope_type": "llama3",
            "original_max_position_embeddings": 8192,
        },
    ),
    "llama3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_hidden_layers=32,
        head_dim=128,
        tie_word_embeddings=False,
        rope_scaling={
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "rope_type": "llama3",
            "original_max_position_embeddings": 8192,
        },
    ),
}


@pytest.mark.parametrize("name", list(LLAMA3_PUBLISHED))
def test_published_llama3_configs_give_the_presets(name: str) -> None:
    published = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "vocab_size": 128256,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
        **LLAMA3_PUBLISHED[name],
    }
    preset = PRESETS[name]
    assert hf.config_from_hf(published) == preset
    ours = hf.config_to_hf(preset)
    assert ours["rope_scaling"] == published["rope_scaling"]
    assert ours["tie_word_embeddings"] == published["tie_word_embeddings"]
    assert hf.config_from_hf(ours) == preset
    # transformers reads our config.json as the same rope scaling and head tying.
    theirs = transformers.LlamaConfig(**ours)
    assert theirs.rope_parameters == {**published["rope_scaling"], "rope_theta": 500000.0}
    assert theirs.tie_word_embeddings == preset.tie_embeddings

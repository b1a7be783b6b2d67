"""Qwen2 and Mistral through lemur.model.hf / hf_config / lemur-convert: parity with
transformers' Qwen2ForCausalLM and MistralForCausalLM, bit-identical round trips, the
refusals, and presets whose parameter counts are transformers' for the published configs."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: every model here is random

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from test_model_hf import _forward, _hf_logits, _read_hf_dir  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.model import checkpoint, hf  # noqa: E402
from lemur.model.config import PRESETS, LlamaConfig, param_count, param_shapes  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 128, 24
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.1,
)


def _randomise(model):
    """Norm weights around 1 and q/k/v biases around 0, random (HF inits them 1 and 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p))
    return model.eval()


def qwen2_model(tied: bool, seed: int = 0):
    """A random fp32 Qwen2 (theta 1e6, eps 1e-6, as Qwen2.5)."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        **SIZES,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=tied,
    )
    return _randomise(transformers.Qwen2ForCausalLM(config))


def mistral_model(seed: int = 0):
    """A random fp32 Mistral without a sliding window (as v0.3)."""
    torch.manual_seed(seed)
    config = transformers.MistralConfig(
        **SIZES,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        sliding_window=None,
    )
    return _randomise(transformers.MistralForCausalLM(config))


FAMILIES = {
    "qwen2-tied": lambda: qwen2_model(tied=True, seed=1),
    "qwen2-untied": lambda: qwen2_model(tied=False, seed=2),
    "mistral": lambda: mistral_model(seed=3),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(HF model, its save_pretrained folder) of each family."""
    model = FAMILIES[request.param]()
    folder = tmp_path_factory.mktemp(request.param) / "hf"
    model.save_pretrained(folder)
    return model, folder


def _load(folder: Path) -> tuple[LlamaConfig, dict]:
    """lemur config (fp32 compute) and params of an HF folder."""
    with hf.open_hf_checkpoint(folder) as (hf_config, get_tensor):
        config = hf.config_from_hf(hf_config, dtype="float32")
        return config, hf.params_from_hf(get_tensor, config)


def _tokens(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (2, SEQ))


def test_logits_match_transformers(saved) -> None:
    model, folder = saved
    config, params = _load(folder)
    assert config.arch == model.config.model_type
    assert config.qkv_bias == (config.arch == "qwen2") == ("bq" in params["layers"])
    assert config.tie_embeddings == ("lm_head" not in params) == model.config.tie_word_embeddings
    assert config.rope_theta == 1e6
    tokens = _tokens()
    ref = _hf_logits(model, tokens)
    diff = float(np.abs(np.asarray(_forward(params, jnp.asarray(tokens), config)) - ref).max())
    print(f"{config.arch} parity: max |logit diff| {diff:.2e}, max |logit| {np.abs(ref).max():.2f}")
    assert diff <= 1e-4, diff
    assert np.abs(ref).max() > 1.0  # not a comparison of near-zero numbers


@pytest.mark.parametrize("drop", ["bq", "bk", "bv"])
def test_each_qwen2_bias_is_needed(drop: str, tmp_path: Path) -> None:
    # Zeroing one bias must break parity: the test above would otherwise not prove that
    # the biases are imported, permuted (bq, bk) and added.
    model = FAMILIES["qwen2-untied"]()
    model.save_pretrained(tmp_path)
    config, params = _load(tmp_path)
    params["layers"][drop] = np.zeros_like(params["layers"][drop])
    out = np.asarray(_forward(params, jnp.asarray(_tokens()), config))
    assert np.abs(out - _hf_logits(model, _tokens())).max() > 1e-2


def test_import_export_import_is_bit_identical(saved, tmp_path: Path) -> None:
    model, folder = saved
    lemur1, out1, lemur2, out2 = (tmp_path / n for n in ("lemur1", "out1", "lemur2", "out2"))
    assert convert.main(["to-lemur", str(folder), str(lemur1)]) == 0
    assert convert.main(["to-hf", str(lemur1), str(out1), "--dtype", "float32"]) == 0
    assert convert.main(["to-lemur", str(out1), str(lemur2)]) == 0
    assert convert.main(["to-hf", str(lemur2), str(out2), "--dtype", "float32"]) == 0

    params1, config1 = checkpoint.load_params(lemur1)
    params2, config2 = checkpoint.load_params(lemur2)
    assert config1 == config2 and config1.arch == model.config.model_type
    flat1, flat2 = (dict(hf.params_to_hf(p, config1, "float32")) for p in (params1, params2))
    for name, w in flat1.items():
        np.testing.assert_array_equal(flat2[name], w, err_msg=name)
    # The export holds exactly the source's tensors, equal, and the same files twice over.
    original, back = _read_hf_dir(folder), _read_hf_dir(out1)
    assert set(back) == set(original)
    for name, w in original.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)
    for file in sorted(out1.iterdir()):
        assert file.read_bytes() == (out2 / file.name).read_bytes(), file.name

    # transformers reads the export as the same family and computes the same logits.
    written = json.loads((out1 / "config.json").read_text())
    assert written["architectures"] == [type(model).__name__]
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out1).eval()
    assert type(reloaded) is type(model)
    assert reloaded.config.sliding_window is None
    tokens = _tokens(1)
    assert np.abs(_hf_logits(reloaded, tokens) - _hf_logits(model, tokens)).max() == 0.0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding_window=4096"),
        ({"model_type": "mistral"}, "sliding_window=4096"),  # absent: transformers' 4096
        (
            {
                "model_type": "qwen2",
                "use_sliding_window": True,
                "sliding_window": 4096,
                "max_window_layers": 1,
            },
            "sliding-window attention on 1 of 2 layers",
        ),
        (
            {"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]},
            "sliding-window attention on 1 of 2 layers",
        ),
        ({"model_type": "qwen2", "hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"model_type": "gemma"}, "model_type='gemma'"),
    ],
)
def test_sliding_windows_and_other_families_are_refused(change: dict, message: str) -> None:
    base = {k: v for k, v in hf.config_to_hf(PRESETS["tiny"]).items() if "sliding" not in k}
    with pytest.raises(ValueError, match=message):
        hf.config_from_hf({**base, **change})


def test_qwen2_window_beyond_every_layer_is_accepted() -> None:
    # Qwen2.5's config.json: sliding_window set but use_sliding_window false (no window),
    # or a window that starts at max_window_layers = num_hidden_layers (none either).
    base = {**hf.config_to_hf(PRESETS["qwen2.5-0.5b"]), "layer_types": None}
    for change in (
        {"use_sliding_window": False, "sliding_window": 32768},
        {"use_sliding_window": True, "sliding_window": 32768, "max_window_layers": 24},
    ):
        assert hf.config_from_hf({**base, **change}) == PRESETS["qwen2.5-0.5b"]


# The published config.json of each checkpoint (the keys that define the model).
_QWEN25 = dict(
    architectures=["Qwen2ForCausalLM"],
    model_type="qwen2",
    hidden_act="silu",
    rms_norm_eps=1e-06,
    rope_theta=1000000.0,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151643,
    torch_dtype="bfloat16",
)
PUBLISHED = {
    "qwen2.5-0.5b": dict(  # Qwen/Qwen2.5-0.5B
        **_QWEN25,
        hidden_size=896,
        intermediate_size=4864,
        max_position_embeddings=32768,
        max_window_layers=24,
        num_attention_heads=14,
        num_hidden_layers=24,
        num_key_value_heads=2,
        sliding_window=32768,
        tie_word_embeddings=True,
        vocab_size=151936,
    ),
    "qwen2.5-1.5b": dict(  # Qwen/Qwen2.5-1.5B
        **_QWEN25,
        hidden_size=1536,
        intermediate_size=8960,
        max_position_embeddings=131072,
        max_window_layers=28,
        num_attention_heads=12,
        num_hidden_layers=28,
        num_key_value_heads=2,
        sliding_window=131072,
        tie_word_embeddings=True,
        vocab_size=151936,
    ),
    "qwen2.5-7b": dict(  # Qwen/Qwen2.5-7B
        **_QWEN25,
        hidden_size=3584,
        intermediate_size=18944,
        max_position_embeddings=131072,
        max_window_layers=28,
        num_attention_heads=28,
        num_hidden_layers=28,
        num_key_value_heads=4,
        sliding_window=131072,
        tie_word_embeddings=False,
        vocab_size=152064,
    ),
    "mistral-7b-v0.3": dict(  # mistralai/Mistral-7B-v0.3
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        bos_token_id=1,
        eos_token_id=2,
        hidden_act="silu",
        hidden_size=4096,
        intermediate_size=14336,
        max_position_embeddings=32768,
        num_attention_heads=32,
        num_hidden_layers=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-05,
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        vocab_size=32768,
    ),
    "llama3.2-1b": dict(  # meta-llama/Llama-3.2-1B
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        hidden_size=2048,
        intermediate_size=8192,
        head_dim=64,
        max_position_embeddings=131072,
        num_attention_heads=32,
        num_hidden_layers=16,
        num_key_value_heads=8,
        rms_norm_eps=1e-05,
        rope_scaling={
            "factor": 32.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        rope_theta=500000.0,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        vocab_size=128256,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
}
# The counts the model cards state (Qwen2.5: 0.49B, 1.54B, 7.61B).
STATED = {"qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-7b": 7_615_616_512}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_published_config_with_transformers_parameter_count(name: str) -> None:
    published = PUBLISHED[name]
    preset = PRESETS[name]
    assert hf.config_from_hf(published) == preset
    # transformers' own count of the published config, on the meta device (no memory).
    config_class = transformers.AutoConfig.for_model(published["model_type"]).__class__
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config_class(**published))
    assert type(model).__name__ == published["architectures"][0]
    assert param_count(preset) == model.num_parameters()
    assert param_count(preset) == STATED.get(name, model.num_parameters())
    # And our config.json of the preset is read by transformers as the same model.
    ours = config_class(**hf.config_to_hf(preset))
    assert getattr(ours, "sliding_window", None) is None
    assert ours.tie_word_embeddings == preset.tie_embeddings
    assert hf.config_from_hf(ours.to_dict()) == dataclasses.replace(preset, dtype="bfloat16")


def test_bias_params_follow_the_config() -> None:
    shapes = param_shapes(PRESETS["qwen2.5-7b"])["layers"]
    assert (shapes["bq"], shapes["bk"], shapes["bv"]) == ((28, 28, 128), (28, 4, 128), (28, 4, 128))
    assert "bq" not in param_shapes(PRESETS["mistral-7b-v0.3"])["layers"]
    with pytest.raises(ValueError, match="qkv_bias true exactly when arch is 'qwen2'"):
        dataclasses.replace(PRESETS["tiny"], qkv_bias=True)
    with pytest.raises(ValueError, match="qkv_bias is False for arch 'qwen2'"):
        dataclasses.replace(PRESETS["tiny"], arch="qwen2")
    with pytest.raises(ValueError, match="arch must be one of"):
        dataclasses.replace(PRESETS["tiny"], arch="gpt2")

"""Hugging Face config.json <-> LlamaConfig for the three families lemur's block reproduces.

| HF class | model_type | what differs from Llama |
|---|---|---|
| `LlamaForCausalLM` | llama | (Llama-2, Llama-3.x; rope "default" or "llama3") |
| `Qwen2ForCausalLM` | qwen2 | biases on q, k, v (always); eps 1e-6, theta 1e6 in Qwen2.5 |
| `MistralForCausalLM` | mistral | nothing, once `sliding_window` is null (v0.3 and later) |

Refused, one line each: a sliding window that applies to any layer (Mistral v0.1's 4096,
Qwen2's `use_sliding_window`), Llama's `attention_bias`/`mlp_bias`, an activation other
than SiLU, a head_dim other than hidden/heads, rope scalings other than "llama3".
Missing keys take the defaults of that family's transformers config class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lemur.model.config import LLAMA3_ROPE_FIELDS, LlamaConfig

HF_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
}
# transformers' defaults for keys a config.json may leave out, per family. Qwen2's config
# class has no bos/eos ids of its own (None): id 1 is an ordinary token there.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096},
    "qwen2": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768},
    "mistral": {"rms_norm_eps": 1e-6, "max_position_embeddings": 131072},
}
_TOKEN_ID_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"bos_token_id": 1, "eos_token_id": 2},
    "qwen2": {"bos_token_id": None, "eos_token_id": None},
    "mistral": {"bos_token_id": 1, "eos_token_id": 2},
}
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id")


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> LlamaConfig:
    """LlamaConfig from an HF config.json dict; refuses features lemur's block does not have."""
    arch = hf.get("model_type", "llama")
    if arch not in HF_CLASSES:
        raise ValueError(
            f"not a Llama, Qwen2 or Mistral config: model_type={arch!r} "
            f"(lemur reads {', '.join(HF_CLASSES)})"
        )
    _refuse_unsupported(hf, arch)
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, d_model // n_heads):
        raise ValueError(f"unsupported head_dim {hf['head_dim']} != hidden/heads")
    defaults = _DEFAULTS[arch]
    max_seq_len = hf.get("max_position_embeddings", defaults["max_position_embeddings"])
    fields: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"],
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        d_ff=hf["intermediate_size"],
        max_seq_len=max_seq_len,
        norm_eps=float(hf.get("rms_norm_eps", defaults["rms_norm_eps"])),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(hf.get("initializer_range", 0.02)),  # transformers' default
        arch=arch,
        qkv_bias=arch == "qwen2",
        **_rope_from_hf(hf, max_seq_len),
    )
    return LlamaConfig(**{**fields, **overrides})


def token_ids_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """bos/eos ids of an HF config.json as transformers reads them (null kept: no such token;
    a missing key takes the family's default)."""
    defaults = _TOKEN_ID_DEFAULTS.get(hf.get("model_type", "llama"), _TOKEN_ID_DEFAULTS["llama"])
    return {key: hf.get(key, defaults[key]) for key in TOKEN_ID_KEYS}


def _refuse_unsupported(hf: Mapping[str, Any], arch: str) -> None:
    """ValueError naming the first key whose value lemur's block cannot reproduce."""
    if arch == "llama":
        for key in ("attention_bias", "mlp_bias"):
            if hf.get(key, False):
                raise ValueError(f"unsupported HF config: {key}={hf[key]!r} (Llama has False)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported HF config: hidden_act={hf['hidden_act']!r} (needs 'silu')")
    if arch == "mistral" and hf.get("sliding_window", 4096) is not None:
        # transformers' MistralConfig defaults to 4096 when the key is absent.
        raise ValueError(
            f"unsupported HF config: sliding_window={hf.get('sliding_window', 4096)!r} "
            "(lemur attends to the whole context: Mistral with sliding_window null only)"
        )
    if arch == "qwen2":
        sliding = _qwen2_layer_types(hf).count("sliding_attention")
        if sliding:
            raise ValueError(
                f"unsupported HF config: sliding-window attention on {sliding} of "
                f"{hf['num_hidden_layers']} layers (use_sliding_window="
                f"{hf.get('use_sliding_window')!r}, sliding_window={hf.get('sliding_window')!r}); "
                "lemur attends to the whole context"
            )


def _qwen2_layer_types(hf: Mapping[str, Any]) -> list[str]:
    """Each layer's attention kind, as transformers' Qwen2Config derives it."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    first = hf.get("max_window_layers", 28)
    return [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]


def _rope_from_hf(hf: Mapping[str, Any], max_seq_len: int) -> dict[str, Any]:
    """The LlamaConfig rope fields of an HF config (4.x `rope_scaling` or 5.x `rope_parameters`).

    Same precedence as transformers: rope_scaling over rope_parameters, and a rope_theta
    inside the dict over the top-level one.
    """
    rope = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(
            f"unsupported rope scaling rope_type={rope_type!r} (lemur supports "
            "none, 'default' and 'llama3')"
        )
    if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(
            "unsupported partial_rotary_factor "
            f"{rope.get('partial_rotary_factor', hf.get('partial_rotary_factor'))}"
        )
    fields: dict[str, Any] = {
        "rope_type": rope_type,
        "rope_theta": float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
    }
    if rope_type == "llama3":
        missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
        if missing:
            raise ValueError(f"rope scaling 'llama3' without {', '.join(missing)}")
        # transformers falls back to max_position_embeddings, as here.
        original = rope.get(
            "original_max_position_embeddings",
            hf.get("original_max_position_embeddings", max_seq_len),
        )
        fields |= {
            ours: float(rope[key])
            for ours, key in LLAMA3_ROPE_FIELDS.items()
            if ours != "rope_original_max_seq_len"
        }
        fields["rope_original_max_seq_len"] = int(original)
    return fields


def rope_scaling_to_hf(config: LlamaConfig) -> dict[str, Any] | None:
    """HF's rope_scaling dict for the config (None when there is no scaling)."""
    if config.rope_type == "default":
        return None
    return {
        "rope_type": config.rope_type,
        **{key: getattr(config, ours) for ours, key in LLAMA3_ROPE_FIELDS.items()},
    }


def config_to_hf(
    config: LlamaConfig, dtype: str = "bfloat16", token_ids: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """An HF config.json dict of the config's family (readable by transformers 4.x and 5.x).

    `token_ids`: bos_token_id / eos_token_id (None writes null); by default 1 and 2, the
    ids of lemur's own SentencePiece tokenizers (Llama-2's), whatever the family.
    """
    family: dict[str, Any] = {
        "llama": {"attention_bias": False, "mlp_bias": False},
        # No window on any layer: transformers 4.x reads use_sliding_window, 5.x layer_types.
        "qwen2": {
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": config.n_layers,
            "layer_types": ["full_attention"] * config.n_layers,
        },
        "mistral": {"sliding_window": None},
    }[config.arch]
    return {
        "architectures": [HF_CLASSES[config.arch]],
        "model_type": config.arch,
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        # 5.x reads rope_parameters (but rope_scaling first, when set); 4.x reads rope_theta
        # and rope_scaling. All three say the same thing.
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling_to_hf(config),
        "rope_parameters": {
            "rope_type": "default",
            **(rope_scaling_to_hf(config) or {}),
            "rope_theta": config.rope_theta,
        },
        **family,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
        "bos_token_id": 1,
        "eos_token_id": 2,
        **(token_ids or {}),
        "torch_dtype": dtype,
        "dtype": dtype,
    }

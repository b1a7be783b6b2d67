"""Hugging Face Llama <-> lemur: tensor names, the q/k rotary permutation, configs, files.

HF's `LlamaForCausalLM` stores every projection as a torch Linear weight (out x in) and,
because its rotary code rotates halves (x[i], x[i + K/2]) instead of Meta's interleaved
pairs (x[2i], x[2i+1]), the rows of q_proj and k_proj inside each head are permuted
(transformers' convert_llama_weights_to_hf.py `permute`). lemur keeps Meta's layout, so
import undoes that permutation and export redoes it; the attention scores are unchanged.

Supported: Llama-2 and Llama-3/3.1/3.2 (rope_scaling none, "default" or "llama3"; tied
embeddings, where the checkpoint has no lm_head.weight or one equal to the embedding).
Other rope scalings, biases, other activations and non-Llama model types are refused.

Everything here is numpy (safetensors' numpy API reads bf16 through ml_dtypes), so a
conversion streams one tensor at a time and needs no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype name safetensors' numpy API uses)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from lemur.model.config import DTYPES, LLAMA3_ROPE_FIELDS, LlamaConfig, Params, param_shapes

HF_GLOBAL_NAMES: dict[str, str] = {
    "embed": "model.embed_tokens.weight",
    "final_norm": "model.norm.weight",
    "lm_head": "lm_head.weight",
}
HF_LAYER_NAMES: dict[str, str] = {  # lemur per-layer name -> HF name inside model.layers.{i}.
    "attn_norm": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight",
    "wk": "self_attn.k_proj.weight",
    "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight",
    "mlp_norm": "post_attention_layernorm.weight",
    "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight",
    "w_down": "mlp.down_proj.weight",
}


def hf_names(config: LlamaConfig) -> list[tuple[str, str, int | None]]:
    """Every HF tensor as (hf_name, lemur_name, layer or None), in HF's file order.

    With tied embeddings there is no lm_head.weight (save_pretrained omits it too).
    """
    names: list[tuple[str, str, int | None]] = [(HF_GLOBAL_NAMES["embed"], "embed", None)]
    for i in range(config.n_layers):
        names += [(f"model.layers.{i}.{hf}", ours, i) for ours, hf in HF_LAYER_NAMES.items()]
    names.append((HF_GLOBAL_NAMES["final_norm"], "final_norm", None))
    if not config.tie_embeddings:
        names.append((HF_GLOBAL_NAMES["lm_head"], "lm_head", None))
    return names


def to_lemur_tensor(name: str, w: np.ndarray, config: LlamaConfig) -> np.ndarray:
    """One HF tensor in lemur's layout (one layer's slice for per-layer params)."""
    D, H, G, K = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
    if name in ("wq", "wk"):  # (n*K)xD, halves layout -> DxnxK, interleaved layout
        n = H if name == "wq" else G
        return w.reshape(n, 2, K // 2, D).transpose(3, 0, 2, 1).reshape(D, n, K)
    if name == "wv":
        return w.T.reshape(D, G, K)
    if name == "wo":  # Dx(H*K) -> HxKxD
        return w.T.reshape(H, K, D)
    if name in ("w_gate", "w_up", "w_down", "lm_head"):
        return w.T
    return w  # embed (VxD) and norms


def to_hf_tensor(name: str, w: np.ndarray, config: LlamaConfig) -> np.ndarray:
    """One lemur tensor in HF's layout; the inverse of to_lemur_tensor."""
    D, H, G, K = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
    if name in ("wq", "wk"):
        n = H if name == "wq" else G
        return w.reshape(D, n, K // 2, 2).transpose(1, 3, 2, 0).reshape(n * K, D)
    if name == "wv":
        return w.reshape(D, G * K).T
    if name == "wo":
        return w.reshape(H * K, D).T
    if name in ("w_gate", "w_up", "w_down", "lm_head"):
        return w.T
    return w


def params_from_hf(
    get_tensor: Callable[[str], np.ndarray], config: LlamaConfig, dtype: str = "float32"
) -> Params:
    """Numpy lemur params filled one HF tensor at a time (peak: the output + one tensor)."""
    params: Params = {
        name: np.empty(shape, DTYPES[dtype])
        if isinstance(shape, tuple)
        else {n: np.empty(s, DTYPES[dtype]) for n, s in shape.items()}
        for name, shape in param_shapes(config).items()
    }
    for hf_name, name, layer in hf_names(config):
        dest = params[name] if layer is None else params["layers"][name][layer]
        w = to_lemur_tensor(name, np.asarray(get_tensor(hf_name)), config)
        if w.shape != dest.shape:
            raise ValueError(f"{hf_name}: shape {w.shape} in lemur layout, expected {dest.shape}")
        dest[...] = w  # casts (bf16 -> fp32 is exact)
    if config.tie_embeddings:
        _check_tied_head(get_tensor, params["embed"])
    return params


def _check_tied_head(get_tensor: Callable[[str], np.ndarray], embed_VxD: np.ndarray) -> None:
    """With tied embeddings, an lm_head.weight in the checkpoint must equal the embedding."""
    name = HF_GLOBAL_NAMES["lm_head"]
    try:
        head_VxD = get_tensor(name)  # a state_dict holds it; save_pretrained omits it
    except KeyError:
        return
    if head_VxD.shape != embed_VxD.shape:
        raise ValueError(
            f"tie_word_embeddings is true but {name} has shape {head_VxD.shape}, "
            f"the embedding {embed_VxD.shape}"
        )
    rows = 4096  # compare in slices: a full comparison would hold a V x D temporary
    for start in range(0, embed_VxD.shape[0], rows):
        if not np.array_equal(
            head_VxD[start : start + rows].astype(embed_VxD.dtype), embed_VxD[start : start + rows]
        ):
            raise ValueError(
                f"tie_word_embeddings is true but {name} differs from {HF_GLOBAL_NAMES['embed']}"
            )


def params_to_hf(
    params: Params, config: LlamaConfig, dtype: str = "bfloat16"
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (hf_name, tensor) one at a time, in HF's order and layout."""
    for hf_name, name, layer in hf_names(config):
        w = np.asarray(params[name] if layer is None else params["layers"][name][layer])
        yield hf_name, np.ascontiguousarray(to_hf_tensor(name, w, config).astype(DTYPES[dtype]))


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> LlamaConfig:
    """LlamaConfig from an HF config.json dict; refuses features lemur's Llama does not have."""
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(f"not a Llama config: model_type={hf.get('model_type')!r}")
    unsupported = {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}
    for key, want in unsupported.items():
        if hf.get(key, want) != want:
            raise ValueError(f"unsupported HF config: {key}={hf[key]!r} (Llama has {want!r})")
    d_model, n_heads = hf["hidden_size"], hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, d_model // n_heads):
        raise ValueError(f"unsupported head_dim {hf['head_dim']} != hidden/heads")
    max_seq_len = hf.get("max_position_embeddings", 4096)
    fields: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"],
        d_model=d_model,
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        d_ff=hf["intermediate_size"],
        max_seq_len=max_seq_len,
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        **_rope_from_hf(hf, max_seq_len),
    )
    return LlamaConfig(**{**fields, **overrides})


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


def config_to_hf(config: LlamaConfig, dtype: str = "bfloat16") -> dict[str, Any]:
    """An HF config.json dict for LlamaForCausalLM (readable by transformers 4.x and 5.x)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
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
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
        "dtype": dtype,
    }


@contextlib.contextmanager
def open_hf_checkpoint(
    directory: str | os.PathLike[str],
) -> Iterator[tuple[dict[str, Any], Callable[[str], np.ndarray]]]:
    """Yield (config.json dict, get_tensor) for an HF directory, sharded or single-file.

    Tensors are read lazily, one per call, from memory-mapped safetensors files.
    """
    root = Path(directory)
    hf_config = json.loads((root / "config.json").read_text())
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
    elif (root / "model.safetensors").exists():
        with safe_open(root / "model.safetensors", framework="numpy") as f:
            weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    else:
        raise FileNotFoundError(
            f"{root}: no model.safetensors[.index.json] (only safetensors "
            "checkpoints are read; convert .bin files with transformers)"
        )
    with contextlib.ExitStack() as stack:
        handles: dict[str, Any] = {}

        def get_tensor(name: str) -> np.ndarray:
            if name not in weight_map:
                raise KeyError(f"{root}: tensor {name} missing")
            file = weight_map[name]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(root / file, framework="numpy"))
            return handles[file].get_tensor(name)

        yield hf_config, get_tensor


def write_hf_checkpoint(
    directory: str | os.PathLike[str],
    config: LlamaConfig,
    tensors: Iterable[tuple[str, np.ndarray]],
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 2**30,
) -> list[Path]:
    """Write config.json and safetensors shards (+ index when >1), holding one shard at a time."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    # Plan the shards from the shapes first: HF names files "-of-{total}".
    itemsize = np.dtype(DTYPES[dtype]).itemsize
    sizes = _hf_tensor_bytes(config, itemsize)
    shard_of: dict[str, int] = {}
    shard, used = 0, 0
    for name, nbytes in sizes.items():
        if used and used + nbytes > max_shard_bytes:
            shard, used = shard + 1, 0
        shard_of[name], used = shard, used + nbytes
    total = shard + 1
    files = (
        ["model.safetensors"]
        if total == 1
        else [f"model-{i + 1:05d}-of-{total:05d}.safetensors" for i in range(total)]
    )

    written: list[Path] = []
    pending: dict[str, np.ndarray] = {}
    current = 0
    for name, w in tensors:
        if shard_of[name] != current:
            written.append(_save_shard(root / files[current], pending))
            pending, current = {}, shard_of[name]
        pending[name] = w
    written.append(_save_shard(root / files[current], pending))
    if total > 1:
        index = {
            "metadata": {"total_size": sum(sizes.values())},
            "weight_map": {n: files[s] for n, s in shard_of.items()},
        }
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (root / "config.json").write_text(json.dumps(config_to_hf(config, dtype), indent=2))
    return written


def _hf_tensor_bytes(config: LlamaConfig, itemsize: int) -> dict[str, int]:
    """Bytes of each HF tensor, in file order."""
    shapes = param_shapes(config)
    return {
        hf: int(np.prod(shapes[n] if layer is None else shapes["layers"][n][1:])) * itemsize
        for hf, n, layer in hf_names(config)
    }


def _save_shard(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    """Atomically write one safetensors file (format=pt, which transformers requires)."""
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path)
    return path

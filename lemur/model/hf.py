"""Hugging Face Llama/Qwen2/Mistral <-> lemur: tensor names, the q/k rotary permutation, files.

HF's `LlamaForCausalLM` stores every projection as a torch Linear weight (out x in) and,
because its rotary code rotates halves (x[i], x[i + K/2]) instead of Meta's interleaved
pairs (x[2i], x[2i+1]), the rows of q_proj and k_proj inside each head are permuted
(transformers' convert_llama_weights_to_hf.py `permute`). lemur keeps Meta's layout, so
import undoes that permutation and export redoes it; the attention scores are unchanged.
Qwen2's q and k biases are permuted the same way (they add to those rows).

Supported: Llama-2 and Llama-3/3.1/3.2, Qwen2/Qwen2.5 and Mistral without a sliding window
(tied embeddings, where the checkpoint has no lm_head.weight or one equal to the
embedding). The config.json side, and what it refuses, is lemur.model.hf_config.

Everything here is numpy (safetensors' numpy API reads bf16 through ml_dtypes), so a
conversion streams one tensor at a time and needs no torch.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers the "bfloat16" dtype name safetensors' numpy API uses)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from lemur.atomic_files import atomic_path
from lemur.model.config import DTYPES, LlamaConfig, Params, param_shapes

# Re-exported (the `as` form): callers read and write configs through this module too.
from lemur.model.hf_config import config_from_hf as config_from_hf
from lemur.model.hf_config import config_to_hf as config_to_hf
from lemur.model.hf_config import token_ids_from_hf as token_ids_from_hf
from lemur.model.safetensors_header import HFCheckpointError as HFCheckpointError
from lemur.model.safetensors_header import safetensors_shapes

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
HF_BIAS_NAMES: dict[str, str] = {  # Qwen2's (qkv_bias), each after its weight in HF's order
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
}


def _layer_names(config: LlamaConfig) -> dict[str, str]:
    """lemur per-layer name -> HF name for this config, in HF's module order."""
    if not config.qkv_bias:
        return HF_LAYER_NAMES
    bias_of = {"wq": "bq", "wk": "bk", "wv": "bv"}
    names: dict[str, str] = {}
    for ours, hf in HF_LAYER_NAMES.items():
        names[ours] = hf
        if ours in bias_of:
            names[bias_of[ours]] = HF_BIAS_NAMES[bias_of[ours]]
    return names


def hf_names(config: LlamaConfig) -> list[tuple[str, str, int | None]]:
    """Every HF tensor as (hf_name, lemur_name, layer or None), in HF's file order.

    With tied embeddings there is no lm_head.weight (save_pretrained omits it too).
    """
    names: list[tuple[str, str, int | None]] = [(HF_GLOBAL_NAMES["embed"], "embed", None)]
    layer_names = _layer_names(config)
    for i in range(config.n_layers):
        names += [(f"model.layers.{i}.{hf}", ours, i) for ours, hf in layer_names.items()]
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
    if name in ("bq", "bk"):  # (n*K), halves layout -> nxK, interleaved (as the rows above)
        n = H if name == "bq" else G
        return w.reshape(n, 2, K // 2).transpose(0, 2, 1).reshape(n, K)
    if name == "bv":
        return w.reshape(G, K)
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
    if name in ("bq", "bk"):
        n = H if name == "bq" else G
        return w.reshape(n, K // 2, 2).transpose(0, 2, 1).reshape(n * K)
    if name == "bv":
        return w.reshape(G * K)
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


@contextlib.contextmanager
def open_hf_checkpoint(
    directory: str | os.PathLike[str],
) -> Iterator[tuple[dict[str, Any], Callable[[str], np.ndarray]]]:
    """Yield (config.json dict, get_tensor) for an HF directory, sharded or single-file.

    Every file is checked first (`check_hf_checkpoint`), so that a bad folder is refused
    before anything is read or written; tensors are then read lazily, one per call, from
    memory-mapped safetensors files.
    """
    root = Path(directory)
    hf_config, weight_map = check_hf_checkpoint(root)
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


def check_hf_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(config.json dict, tensor name -> file) of an HF folder whose safetensors headers parse,
    whose files hold all the bytes their headers describe, and which has every tensor of its
    config at its shape; HFCheckpointError (or FileNotFoundError) naming the file otherwise.

    Reads the headers only. A config.json lemur cannot read is left to config_from_hf.
    """
    root = Path(directory)
    try:
        hf_config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise HFCheckpointError(
            f"{root / 'config.json'}: {getattr(e, 'strerror', None) or e}"
        ) from None
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map: dict[str, str] = dict(json.loads(index.read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HFCheckpointError(f"{index}: not a safetensors index ({e})") from None
    elif (root / "model.safetensors").exists():
        weight_map = {}
    else:
        raise FileNotFoundError(
            f"{root}: no model.safetensors[.index.json] (only safetensors "
            "checkpoints are read; convert .bin files with transformers)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(weight_map.values())) or ["model.safetensors"]:
        header = safetensors_shapes(root / file)
        shapes |= {name: shape for name, shape in header.items() if weight_map.get(name) == file}
        if not weight_map:
            shapes, weight_map = header, dict.fromkeys(header, file)
    for name, file in weight_map.items():
        if name not in shapes:
            raise HFCheckpointError(f"{index}: lists {name} in {file}, which does not hold it")
    try:
        config = config_from_hf(hf_config)
    except (ValueError, KeyError, TypeError):
        return hf_config, weight_map  # the caller's config_from_hf says what is wrong
    for hf_name, name, _ in hf_names(config):
        want = _hf_shape(name, config)
        if hf_name not in shapes:
            raise HFCheckpointError(
                f"{root}: tensor {hf_name} missing (its config.json describes a "
                f"{config.n_layers}-layer {config.arch} model)"
            )
        if shapes[hf_name] != want:
            raise HFCheckpointError(
                f"{root / weight_map[hf_name]}: tensor {hf_name} has shape "
                f"{list(shapes[hf_name])}, config.json gives {list(want)}"
            )
    return hf_config, weight_map


def _hf_shape(name: str, config: LlamaConfig) -> tuple[int, ...]:
    """The shape of lemur parameter `name` (one layer's, for per-layer ones) in HF's layout."""
    D, F, V = config.d_model, config.d_ff, config.vocab_size
    q, kv = config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
    return {
        "embed": (V, D),
        "lm_head": (V, D),
        "final_norm": (D,),
        "attn_norm": (D,),
        "mlp_norm": (D,),
        "wq": (q, D),
        "wk": (kv, D),
        "wv": (kv, D),
        "wo": (D, q),
        "w_gate": (F, D),
        "w_up": (F, D),
        "w_down": (D, F),
        "bq": (q,),
        "bk": (kv,),
        "bv": (kv,),
    }[name]


def write_hf_checkpoint(
    directory: str | os.PathLike[str],
    config: LlamaConfig,
    tensors: Iterable[tuple[str, np.ndarray]],
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 2**30,
    token_ids: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write config.json (its bos/eos ids: `token_ids`) and safetensors shards (+ index when
    >1), holding one shard at a time."""
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
    (root / "config.json").write_text(json.dumps(config_to_hf(config, dtype, token_ids), indent=2))
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
    with atomic_path(path) as tmp:
        try:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        except SafetensorError as e:  # its I/O errors are not OSErrors: a full disk is one
            if "(os error 28)" in str(e):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
            raise
    return path

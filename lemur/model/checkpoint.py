"""A lemur model checkpoint: `config.json` (LlamaConfig fields) + `params/` (orbax).

This is what tools/convert_hf_llama.py writes and reads, and what the trainer loads to
start from pretrained weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from lemur.model.llama import LlamaConfig, Params


def save_params(directory: str | os.PathLike[str], params: Params, config: LlamaConfig) -> None:
    """Write params (numpy or jax arrays, any dtype) and the config; waits until committed."""
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(root / "params", params, force=True)
    checkpointer.wait_until_finished()
    (root / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))


def load_config(directory: str | os.PathLike[str]) -> LlamaConfig:
    """The LlamaConfig saved beside the params."""
    return LlamaConfig(**json.loads((Path(directory) / "config.json").read_text()))


def load_params(directory: str | os.PathLike[str],
                target: Any = None) -> tuple[Params, LlamaConfig]:
    """Restore (params, config).

    target: optional pytree of jax.ShapeDtypeStruct (with shardings, from
    `jax.eval_shape(init_params, ...)`) to restore straight onto a mesh, cast to its dtypes;
    without it the params come back as host numpy arrays in their saved dtype.
    """
    root = Path(directory).resolve()
    config = load_config(root)
    checkpointer = ocp.StandardCheckpointer()
    if target is None:
        params = checkpointer.restore(root / "params")
    else:
        params = checkpointer.restore(root / "params", target)
    return params, config


def abstract_params(directory: str | os.PathLike[str]) -> Any:
    """Shapes and dtypes of the saved params (jax.ShapeDtypeStruct), read from metadata."""
    meta = ocp.StandardCheckpointer().metadata(Path(directory).resolve() / "params")
    tree = getattr(getattr(meta, "item_metadata", meta), "tree", meta)
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), tree)

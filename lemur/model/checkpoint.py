"""A lemur model checkpoint: `config.json` (LlamaConfig fields) + `params/` (orbax).

This is what lemur-convert writes and reads, and what the trainer loads to
start from pretrained weights. It may carry its SentencePiece model as
`tokenizer.model` (lemur-convert copies it along), which `to-hf` exports with the weights,
and the tokenizer files of the HF folder it came from, unchanged, in `hf_tokenizer/`
(lemur.model.pretrained), which `to-hf` copies back out, with the bos/eos ids that folder's
config.json gave (`hf_token_ids.json`: a Qwen2's null bos stays null on export).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lemur.model.config import LlamaConfig, Params

TOKENIZER_FILE = "tokenizer.model"
HF_TOKENIZER_DIR = "hf_tokenizer"
HF_TOKEN_IDS_FILE = "hf_token_ids.json"


def save_params(
    directory: str | os.PathLike[str],
    params: Params,
    config: LlamaConfig,
    tokenizer: str | os.PathLike[str] | None = None,
    hf_tokenizer: Mapping[str, Path] | None = None,
    hf_token_ids: Mapping[str, Any] | None = None,
) -> None:
    """Write params (numpy or jax arrays, any dtype), the config, a copy of `tokenizer`, of
    the HF tokenizer files `hf_tokenizer` (file name -> path) under `hf_tokenizer/` and the
    source HF config's bos/eos ids `hf_token_ids`."""
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    # Orbax deep-copies numpy arrays before writing by default (a guard against the caller
    # changing them mid-save), which doubles peak memory: 140 GB more for a 70B conversion.
    # This save is synchronous and the caller is waiting, so the guard buys nothing.
    registry = ocp.type_handlers.create_type_handler_registry(
        (np.ndarray, ocp.type_handlers.NumpyHandler(deepcopy_host_arrays=False)),
        (jax.Array, ocp.type_handlers.ArrayHandler()),
    )
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(type_handler_registry=registry))
    try:
        with _absl_quiet():
            checkpointer.save(root / "params", args=ocp.args.PyTreeSave(params), force=True)
    except ValueError as e:
        # tensorstore's write errors are ValueErrors; a full disk is an OSError like any other.
        if "[os_error_code='28']" in str(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(root)) from None
        raise
    (root / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    if tokenizer is not None and Path(tokenizer).resolve() != root / TOKENIZER_FILE:
        shutil.copyfile(tokenizer, root / TOKENIZER_FILE)
    if hf_tokenizer:
        (root / HF_TOKENIZER_DIR).mkdir(exist_ok=True)
        for name, src in hf_tokenizer.items():
            if Path(src).resolve() != root / HF_TOKENIZER_DIR / name:
                shutil.copyfile(src, root / HF_TOKENIZER_DIR / name)
    if hf_token_ids is not None:
        (root / HF_TOKEN_IDS_FILE).write_text(json.dumps(dict(hf_token_ids), indent=2))


def load_hf_token_ids(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The bos/eos ids the checkpoint's source HF config.json gave ({} when it had none)."""
    path = Path(directory) / HF_TOKEN_IDS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


@contextlib.contextmanager
def _absl_quiet() -> Iterator[None]:
    """Orbax logs each failed write of a save as an ERROR with its traceback (dozens on a
    full disk) before raising: the caller reports the error it raises, in one line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def tokenizer_path(directory: str | os.PathLike[str]) -> Path | None:
    """The SentencePiece model a checkpoint carries, or None."""
    path = Path(directory) / TOKENIZER_FILE
    return path if path.is_file() else None


def load_checkpoint_config(directory: str | os.PathLike[str]) -> LlamaConfig:
    """The LlamaConfig saved beside the params."""
    return LlamaConfig(**json.loads((Path(directory) / "config.json").read_text()))


def load_params(
    directory: str | os.PathLike[str], target: Any = None
) -> tuple[Params, LlamaConfig]:
    """Restore (params, config).

    target: optional pytree of jax.ShapeDtypeStruct with shardings (e.g. from
    `jax.eval_shape` of init_params plus the mesh shardings) to restore straight onto
    devices, cast to its dtypes. Without it the params come back as host numpy arrays in
    their saved dtype, whatever devices saved them.
    """
    root = Path(directory).resolve()
    config = load_checkpoint_config(root)
    if target is not None:
        return ocp.StandardCheckpointer().restore(root / "params", target), config
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract_params(root)
    )
    params = ocp.PyTreeCheckpointer().restore(
        root / "params", args=ocp.args.PyTreeRestore(restore_args=restore_args)
    )
    return params, config


def abstract_params(directory: str | os.PathLike[str]) -> Any:
    """Shapes and dtypes of the saved params (jax.ShapeDtypeStruct), read from metadata."""
    meta = ocp.StandardCheckpointer().metadata(Path(directory).resolve() / "params")
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), meta.item_metadata.tree)

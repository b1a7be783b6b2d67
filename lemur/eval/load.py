"""Anything `lemur-eval` scores -> (LlamaConfig, params, tokenizer).

Accepted, told apart by the files inside:
- a run directory of `lemur-train` (`config.yaml` and `checkpoints/<step>/`): its latest
  complete checkpoint, or `step`;
- one orbax step of a run (`<step>/state` + `<step>/meta`);
- a lemur model checkpoint (`config.json` + `params/`, what lemur-convert writes);
- a Hugging Face Llama, Qwen2 or Mistral folder (`config.json` + safetensors), converted
  on the fly with lemur.model.hf, so Llama-2 itself can be scored as the baseline.

Only the params are read from a run's train state (orbax partial restore: the optimizer
moments, twice the params' size, stay on disk). The tokenizer is the SentencePiece model
beside HF weights (`tokenizer.model`), or the one of the run's first data directory, or
the one given (a file, or a shard directory or model folder holding one: see
lemur.eval.find_tokenizer); a run's recorded tokenizer hash must match it.
`hf_tokenizer` lists the HF tokenizer files that belong to the model
(lemur.model.pretrained): an HF folder's, a lemur checkpoint's `hf_tokenizer/`, or those of
a run's `model.init_from` when the run's data was built with that same tokenizer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from lemur.eval.find_tokenizer import (
    Found,
    TokenizerLookupError,
    given_tokenizer,
    run_path,
    run_tokenizer,
    started_from,
)
from lemur.model import checkpoint as model_checkpoint
from lemur.model import pretrained
from lemur.model.config import LlamaConfig, Params, param_shapes
from lemur.model.preset import model_config_from_dict
from lemur.tokenizer import Tokenizer, TokenizerError, open_tokenizer


class LoadError(ValueError):
    """A path that is no model lemur-eval can read (one line, naming it)."""


def _folder_tokenizer(path: Path) -> Path | None:
    """The tokenizer a model folder carries: SentencePiece `tokenizer.model`, else an HF
    `tokenizer.json` (Llama-3, Qwen2.5; a lemur checkpoint keeps it in `hf_tokenizer/`)."""
    found = model_checkpoint.tokenizer_path(path)
    return found or pretrained.tokenizer_files(path).get("tokenizer.json")


def _open(path: Path) -> Tokenizer:
    """The tokenizer of a file: SentencePiece (ChatML-aware), or the tokenizer.json engine."""
    try:
        return open_tokenizer(path)
    except TokenizerError as e:
        raise LoadError(str(e)) from None


@dataclasses.dataclass
class LoadedModel:
    """A model ready to run: config, params on the default device, tokenizer, provenance."""

    config: LlamaConfig
    params: Params
    tokenizer: Tokenizer | None
    kind: str  # "run", "lemur", "hf"
    source: str
    # Why there is no tokenizer (e.g. the run's data directory is gone), and the hash of the
    # one the model was trained with (a run's; None when unknown).
    tokenizer_problem: str | None = None
    tokenizer_sha256: str | None = None
    hf_tokenizer: dict[str, Path] = dataclasses.field(default_factory=dict)


def _latest_step(run_dir: Path) -> Path:
    """The newest complete step directory under a run's checkpoint directory."""
    ckpt = run_dir / "checkpoints"
    if (run_dir / "config.yaml").is_file():
        import yaml

        raw = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
        stored = (raw.get("checkpoint") or {}).get("dir")
        if stored:  # relative in runs older than absolute paths: to where the run started
            ckpt = run_path(str(stored), started_from(raw.get("run_dir"), run_dir))
    steps = sorted(
        (int(p.name), p) for p in ckpt.glob("*") if p.name.isdigit() and pretrained.is_step_dir(p)
    )
    if not steps:
        raise LoadError(f"{run_dir}: no complete checkpoint under {ckpt}")
    return steps[-1][1]


def _abstract_params(step_dir: Path) -> Any:
    """Shapes of the `params` subtree of a run's train state (metadata only, no arrays)."""
    handler = ocp.StandardCheckpointHandler()
    try:
        return dict(handler.metadata(step_dir / "state"))["params"]
    except Exception as e:  # orbax raises many types for unreadable metadata
        raise LoadError(f"{step_dir}/state: unreadable checkpoint metadata ({e})") from None
    finally:
        handler.close()


def _run_config(step_dir: Path, abstract: Any) -> tuple[LlamaConfig, dict[str, Any]]:
    """The model config of a run checkpoint: its `meta` item's resolved config, with the
    vocabulary read from the saved embedding (older checkpoints' meta does not hold it)."""
    try:
        meta = json.loads((step_dir / "meta" / "metadata").read_text())
    except (OSError, ValueError) as e:
        raise LoadError(f"{step_dir}/meta/metadata: unreadable ({e})") from None
    vocab = int(abstract["embed"].shape[0])
    # The run config's `model:` section (lemur.model.preset, below the trainer and eval).
    config = model_config_from_dict(meta["config"].get("model", {})).llama(vocab)
    want = jax.tree.leaves(param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
    got = [tuple(m.shape) for m in jax.tree.leaves(abstract)]
    if sorted(want) != sorted(got):
        raise LoadError(f"{step_dir}: saved parameter shapes do not match the run's config")
    return config, meta


def _run_params(step_dir: Path, abstract: Any) -> Params:
    """Only the `params` subtree of a run's train state (host numpy arrays)."""
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), abstract)
    item = jax.tree.map(lambda m: np.empty(0), abstract)  # structure only
    restored = ocp.PyTreeCheckpointer().restore(
        step_dir / "state",
        args=ocp.args.PyTreeRestore(
            item={"params": item}, restore_args={"params": restore_args}, partial_restore=True
        ),
    )
    return restored["params"]


def _run_origin(step_dir: Path, meta: dict[str, Any]) -> Path | None:
    """Where a run with relative paths in its config was started (see find_tokenizer)."""
    config = meta.get("config") or {}
    stored = (config.get("checkpoint") or {}).get("dir")
    if not stored and config.get("run_dir"):
        stored = str(Path(config["run_dir"]) / "checkpoints")
    return started_from(stored, step_dir.parent)


def _run_hf_tokenizer(meta: dict[str, Any]) -> dict[str, Path]:
    """The HF tokenizer files of the run's `model.init_from` when the run's data was built
    with that same tokenizer (its tokenizer.json or tokenizer.model, by sha256), else {}."""
    init_from = ((meta.get("config") or {}).get("model") or {}).get("init_from")
    data_sha = meta.get("tokenizer_sha256")
    if not init_from or not data_sha or not Path(init_from).is_dir():
        return {}
    files = pretrained.tokenizer_files(init_from)
    for name in ("tokenizer.json", "tokenizer.model"):
        if name in files and hashlib.sha256(files[name].read_bytes()).hexdigest() == data_sha:
            return files
    return {}


def _load_hf(path: Path) -> tuple[LlamaConfig, Params]:
    """Config and numpy params of an HF Llama folder (lemur.model.pretrained's reader)."""
    try:
        return pretrained.load_hf(path)
    except pretrained.PretrainedError as e:  # one line: it names the folder or the file
        raise LoadError(str(e)) from None


@dataclasses.dataclass
class _Read:
    """What a model path holds, read before its tokenizer is opened."""

    config: LlamaConfig
    params: Params  # host (numpy) arrays
    found: Found  # the tokenizer found beside the model
    kind: str  # "run" (a run directory or one of its steps), "lemur" or "hf"
    hf_tokenizer: dict[str, Path]


def _read(path: Path, step: int | None) -> _Read:
    """Config, host params, the tokenizer found and the HF tokenizer files of any path."""
    kind = pretrained.folder_kind(path)
    if kind is None:
        raise LoadError(
            f"{path}: not a lemur run directory, orbax step, lemur model checkpoint "
            "or Hugging Face Llama folder"
        )
    if kind == "hf":
        config, params = _load_hf(path)
        found = Found(_folder_tokenizer(path))
        return _Read(config, params, found, kind, pretrained.tokenizer_files(path))
    if kind == "lemur":
        params, config = model_checkpoint.load_params(path)
        found = Found(_folder_tokenizer(path))
        return _Read(config, params, found, kind, pretrained.tokenizer_files(path))
    step_dir = (
        path
        if kind == "step"
        else (_latest_step(path) if step is None else path / "checkpoints" / str(step))
    )
    if not (step_dir / "state").is_dir():
        raise LoadError(f"{step_dir}: no such checkpoint")
    abstract = _abstract_params(step_dir)
    config, meta = _run_config(step_dir, abstract)
    found = run_tokenizer(meta, _run_origin(step_dir, meta))
    params = _run_params(step_dir, abstract)
    return _Read(config, params, found, "run", _run_hf_tokenizer(meta))


def _to_device(params: Params) -> Params:
    """Host params onto the default device one array at a time, each host copy freed as it
    goes (a 7B model in fp32 is 27 GB: it should not be held twice)."""
    out: Params = {}
    for name in list(params):
        value = params.pop(name)
        out[name] = _to_device(value) if isinstance(value, dict) else jax.device_put(value)
        del value
    return out


def resolve_dtype(dtype: str | None) -> str | None:
    """'auto' -> float32 on CPU (XLA's CPU bf16 matmuls are slow), the model's own elsewhere."""
    if dtype == "auto":
        return "float32" if jax.default_backend() == "cpu" else None
    return dtype


def load_model(
    path: str | os.PathLike[str],
    *,
    step: int | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    dtype: str | None = "auto",
) -> LoadedModel:
    """Read any accepted model path; params go to the default device.

    `dtype` sets the compute dtype (None: the checkpoint's; "auto": see `resolve_dtype`).
    `tokenizer` overrides the tokenizer found beside the model.
    """
    root = Path(path).expanduser().absolute()  # orbax refuses relative checkpoint paths
    if not root.is_dir():
        raise LoadError(f"{root}: no such directory")
    read = _read(root, step)
    config = read.config
    if (dtype := resolve_dtype(dtype)) is not None:
        config = dataclasses.replace(config, dtype=dtype)
    tok = _tokenizer(tokenizer, read.found, config)
    problem = None if tok is not None else read.found.problem
    return LoadedModel(
        config,
        _to_device(read.params),  # emptied as it goes: the host copies are freed
        tok,
        read.kind,
        str(root),
        tokenizer_problem=problem,
        tokenizer_sha256=read.found.sha256,
        hf_tokenizer=read.hf_tokenizer,
    )


def _tokenizer(
    given: str | os.PathLike[str] | None, found: Found, config: LlamaConfig
) -> Tokenizer | None:
    """The given tokenizer (else the one found), checked against the model: no more pieces
    than its ids, and the hash its run recorded (when it recorded one)."""
    try:
        path = given_tokenizer(given) if given is not None else found.path
    except TokenizerLookupError as e:
        raise LoadError(str(e)) from None
    if path is None:
        return None
    tok = _open(path)
    if tok.vocab_size > config.vocab_size:
        raise LoadError(
            f"{path}: tokenizer of {tok.vocab_size} pieces for a model of "
            f"vocab_size {config.vocab_size}"
        )
    if found.sha256 and tok.sha256 != found.sha256:
        raise LoadError(
            f"{path}: not the tokenizer the model was trained with (sha256 "
            f"{tok.sha256[:12]}..., the run's {found.sha256[:12]}...)"
        )
    return tok

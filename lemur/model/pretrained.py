"""A pre-trained model folder, a lemur checkpoint or a Hugging Face folder, read either way.

`model.init_from` and `lemur-convert` take both: a lemur checkpoint (`config.json` of
LlamaConfig fields + orbax `params/`, lemur.model.checkpoint) or an HF folder
(`config.json` + safetensors of a Llama, Qwen2 or Mistral model), converted on load with
lemur.model.hf, one tensor at a time, as `lemur-eval` does.

Tokenizers travel with the weights: an HF folder's tokenizer files (`HF_TOKENIZER_FILES`)
are copied unchanged into a lemur checkpoint's `hf_tokenizer/`, and back out on export,
so a continued pre-training round trip hands back the tokenizer and chat template it
was given. A lemur checkpoint may also carry a SentencePiece `tokenizer.model` of its own
(a lemur-built tokenizer, exported through lemur.tokenizer.hf_writer).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lemur.model import checkpoint, hf
from lemur.model.config import LlamaConfig, Params

# What an HF folder holds beside the weights that tokenizes, renders chat or stops
# generation (generation_config.json: its eos ids are the tokenizer's stop tokens).
HF_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


class PretrainedError(ValueError):
    """A folder that is no model lemur can start from (one line, naming it)."""


def is_step_dir(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is one complete checkpoint step of a lemur-train run (`state/` + `meta/`)."""
    root = Path(path)
    return (root / "state").is_dir() and (root / "meta").is_dir()


def folder_kind(path: str | os.PathLike[str]) -> str | None:
    """What a model folder is, by the files inside: "lemur" (a lemur checkpoint), "hf" (a
    Hugging Face folder), "step" (one checkpoint step of a lemur-train run), "run" (a
    lemur-train run directory), None for none of these: the one test of a folder's kind
    (`kind` here, `lemur-eval`'s loader and `lemur-convert`'s source check)."""
    root = Path(path)
    if (root / "config.json").is_file() and (root / "params").is_dir():
        return "lemur"
    if (root / "config.json").is_file() and any(
        (root / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")
    ):
        return "hf"
    if is_step_dir(root):
        return "step"
    if (root / "config.yaml").is_file() or (root / "checkpoints").is_dir():
        return "run"
    return None


def kind(path: str | os.PathLike[str]) -> str:
    """ "lemur" or "hf" (what a model can start from) by the files inside; PretrainedError
    otherwise."""
    root = Path(path)
    found = folder_kind(root)
    if found in ("lemur", "hf"):
        return found
    raise PretrainedError(
        f"{root}: neither a lemur checkpoint (config.json + params/) nor a Hugging Face "
        "model folder (config.json + model.safetensors[.index.json])"
    )


def load_pretrained_config(path: str | os.PathLike[str]) -> LlamaConfig:
    """The model's LlamaConfig, from either kind of folder (PretrainedError naming it)."""
    try:
        if kind(path) == "lemur":
            return checkpoint.load_checkpoint_config(path)
        # The safetensors too (their headers): a folder that cannot be loaded is refused
        # before a run starts (no run directory left behind).
        hf_config, _ = hf.check_hf_checkpoint(path)
        return hf.config_from_hf(hf_config)
    except PretrainedError:
        raise
    except hf.HFCheckpointError as e:
        raise PretrainedError(str(e)) from None  # it names the file
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise PretrainedError(f"{path}/config.json: {e}") from None


def load_hf(path: str | os.PathLike[str], dtype: str = "float32") -> tuple[LlamaConfig, Params]:
    """The config and host (numpy) params of an HF folder in `dtype`, read one tensor at a
    time (`model.init_from` and `lemur-eval` alike; PretrainedError naming what is wrong)."""
    try:
        with hf.open_hf_checkpoint(path) as (hf_config, get_tensor):
            config = hf.config_from_hf(hf_config)
            return config, hf.params_from_hf(get_tensor, config, dtype)
    except hf.HFCheckpointError as e:
        raise PretrainedError(str(e)) from None  # it names the file
    except (OSError, ValueError, KeyError) as e:
        raise PretrainedError(f"{path}: {e}") from None


def tokenizer_files(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The HF tokenizer files the folder carries (name -> path): an HF folder's own, or
    those a lemur checkpoint keeps in `hf_tokenizer/`."""
    root = Path(path)
    if (root / "params").is_dir():
        root = root / checkpoint.HF_TOKENIZER_DIR
    return {name: root / name for name in HF_TOKENIZER_FILES if (root / name).is_file()}


def sentencepiece_model(path: str | os.PathLike[str]) -> Path | None:
    """The SentencePiece model the folder carries (`tokenizer.model`), or None."""
    candidate = Path(path) / checkpoint.TOKENIZER_FILE
    return candidate if candidate.is_file() else None


def source_token_ids(files: dict[str, Path]) -> dict[str, Any]:
    """The bos/eos ids the HF config.json of the model that `files` came from gave: an HF
    folder's own config.json, or those a lemur checkpoint recorded; {} when unknown."""
    if not files:
        return {}
    folder = next(iter(files.values())).parent
    if folder.name == checkpoint.HF_TOKENIZER_DIR:
        return checkpoint.load_hf_token_ids(folder.parent)
    try:
        return hf.token_ids_from_hf(json.loads((folder / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return {}


def hf_token_ids(files: dict[str, Path]) -> dict[str, int | list[int]]:
    """bos/eos ids for an exported config.json, from the carried generation_config.json."""
    if "generation_config.json" not in files:
        return {}
    try:
        generation = json.loads(files["generation_config.json"].read_text())
    except (OSError, ValueError):
        return {}
    return {
        key: generation[key]
        for key in ("bos_token_id", "eos_token_id")
        if isinstance(generation.get(key), int | list)
    }

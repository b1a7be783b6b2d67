"""Reading a Hugging Face tokenizer: `tokenizer.json`, or a model folder holding one.

A folder's `tokenizer_config.json` (and `special_tokens_map.json`) say which tokens are
BOS and EOS and carry the chat template; a bare `tokenizer.json` has no such settings, so
its BOS/EOS come from the recipe or from the usual names of its added tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from lemur.tokenizer.base import TokenizerError

CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
# End-of-document tokens of the families we know, in the order they are tried when a bare
# tokenizer.json says nothing (Llama-3, GPT/Qwen, Llama-2/Mistral).
EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>")
BOS_NAMES = ("<|begin_of_text|>", "<s>")


@dataclass(frozen=True)
class HFTokenizerFiles:
    """The parsed files of one HF tokenizer and the BOS/EOS a document is framed with."""

    path: Path  # the tokenizer.json
    data: dict[str, Any]  # its parsed JSON
    sha256: str
    config: dict[str, Any]  # tokenizer_config.json merged over special_tokens_map.json
    bos: str | None
    eos: str | None  # None: the files name none (a build must be told: `tokenizer.eos`)
    # More ids generation stops at: `eos_token_id` of a generation_config.json beside
    # (Llama-3-Instruct lists <|end_of_text|>, <|eom_id|> and <|eot_id|>).
    generation_eos: tuple[int, ...] = ()

    @property
    def added(self) -> dict[str, dict[str, Any]]:
        """Added tokens by content (`id`, `special`, ...)."""
        return {t["content"]: t for t in self.data.get("added_tokens", [])}

    @property
    def chat_template(self) -> str | None:
        """The folder's Jinja chat template, if it has one."""
        template = self.config.get("chat_template")
        if isinstance(template, list):  # the named-templates form: take "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        return template if isinstance(template, str) else None


_parsed: dict[str, dict[str, Any]] = {}


def _token_text(value: Any) -> str | None:
    """A special-token setting: a string, an AddedToken dict ({"content": ...}) or null."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _is_sentencepiece(raw: bytes) -> bool:
    """Whether `raw` is a SentencePiece model (a `tokenizer.model` given where JSON goes)."""
    import sentencepiece as spm

    try:
        return bool(spm.SentencePieceProcessor().LoadFromSerializedProto(raw))
    except RuntimeError:
        return False


def _read_json(path: Path, raw: bytes | None = None) -> dict[str, Any]:
    try:
        raw = path.read_bytes() if raw is None else raw
        data = orjson.loads(raw)
    except OSError as e:
        raise TokenizerError(f"{path}: cannot be read ({e.strerror or e})") from None
    except orjson.JSONDecodeError as e:
        if _is_sentencepiece(raw):
            raise TokenizerError(
                f"{path}: a SentencePiece model, not a tokenizer.json (a recipe gives it as "
                "tokenizer.model)"
            ) from None
        raise TokenizerError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def tokenizer_json_path(path: str | Path) -> Path:
    """The tokenizer.json a recipe's `tokenizer.hf` names: the file, or the one in a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise TokenizerError(f"{p}: no such tokenizer.json")
    return p


def read_hf_tokenizer(
    path: str | Path, bos: str | None = None, eos: str | None = None, no_bos: bool = False
) -> HFTokenizerFiles:
    """Read a tokenizer.json (and the config files beside it) and settle BOS and EOS.

    `bos`/`eos` override the folder's settings (e.g. an instruct folder whose `eos_token`
    is the end-of-turn token, while documents end with `<|end_of_text|>`); `no_bos` frames
    documents without a BOS whatever the folder says.
    """
    file = tokenizer_json_path(path)
    try:
        raw = file.read_bytes()
    except OSError as e:  # e.g. no permission: named, as a damaged file is
        raise TokenizerError(f"{file}: cannot be read ({e.strerror or e})") from None
    sha = hashlib.sha256(raw).hexdigest()
    if sha not in _parsed:  # 17 MB of JSON for Llama-3: parsed once per process
        _parsed.clear()
        _parsed[sha] = _read_json(file, raw)
    data = _parsed[sha]
    if not isinstance(data.get("model"), dict):
        raise TokenizerError(f"{file}: not a tokenizer.json (no 'model')")
    config: dict[str, Any] = {}
    for name in reversed(CONFIG_FILES):  # tokenizer_config.json wins
        beside = file.parent / name
        if beside.is_file():
            config.update(_read_json(beside))
    added = {t.get("content") for t in data.get("added_tokens", [])}
    bos_token = None if no_bos else (bos or _configured(config, "bos_token", BOS_NAMES, added))
    eos_token = eos or _configured(config, "eos_token", EOS_NAMES, added)
    return HFTokenizerFiles(
        path=file,
        data=data,
        sha256=sha,
        config=config,
        bos=bos_token,
        eos=eos_token,
        generation_eos=_generation_eos(file.parent / "generation_config.json"),
    )


def _generation_eos(path: Path) -> tuple[int, ...]:
    """The `eos_token_id` (an id or a list of them) of a generation_config.json, if any."""
    if not path.is_file():
        return ()
    value = _read_json(path).get("eos_token_id")
    ids = value if isinstance(value, list) else [value]
    return tuple(i for i in ids if isinstance(i, int) and not isinstance(i, bool) and i >= 0)


def _configured(
    config: dict[str, Any], key: str, names: tuple[str, ...], added: set[str]
) -> str | None:
    """The token a config names for `key`; without a config, the first known name present."""
    if key in config:  # present and null (Qwen2.5's bos_token) means: none
        return _token_text(config[key])
    return next((n for n in names if n in added), None)

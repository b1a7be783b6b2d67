"""Opening any tokenizer file lemur knows, by its kind."""

from __future__ import annotations

import os
from pathlib import Path

from lemur.tokenizer.base import Tokenizer
from lemur.tokenizer.bytelevel import ByteLevelTokenizer
from lemur.tokenizer.hf_files import read_hf_tokenizer
from lemur.tokenizer.sentencepiece import SentencePieceTokenizer


def is_tokenizer_json(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a tokenizer.json, or a folder holding one."""
    p = Path(path).expanduser()
    return p.suffix == ".json" or (p.is_dir() and (p / "tokenizer.json").is_file())


def open_tokenizer(
    path: str | os.PathLike[str],
    *,
    bos: str | None = None,
    eos: str | None = None,
    no_bos: bool = False,
    engine: str = "auto",
) -> Tokenizer:
    """The tokenizer in `path`: a tokenizer.json (or HF folder), else a SentencePiece model.

    `bos`, `eos`, `no_bos` and `engine` apply to tokenizer.json files only (see
    `read_hf_tokenizer` and `ByteLevelTokenizer`).
    """
    if is_tokenizer_json(path):
        return ByteLevelTokenizer(read_hf_tokenizer(path, bos, eos, no_bos), engine)
    return SentencePieceTokenizer(path)

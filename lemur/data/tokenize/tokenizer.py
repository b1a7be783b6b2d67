"""SentencePiece tokenizer: training with code-preserving Llama-2 conventions, loading, info."""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from lemur.data.recipe import TokenizerTrainConfig
from lemur.shards.format import atomic_write_bytes

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


class TokenizerError(ValueError):
    """A tokenizer model that cannot be used (missing, corrupt, wrong special ids)."""


class TokenizerSettingsError(TokenizerError):
    """Training settings that SentencePiece refuses for this corpus (a recipe mistake)."""


def _training_error(error: RuntimeError, vocab_size: int) -> TokenizerSettingsError:
    """A one-line message for SentencePiece's `INTERNAL: file(line) [check] text` errors."""
    text = str(error).strip()
    short = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text)
    if short:
        return TokenizerSettingsError(
            f"recipe: tokenizer.train.vocab_size {vocab_size} is too small for this corpus: its "
            f"characters alone need {short.group(2)} pieces (raise vocab_size or lower "
            "character_coverage)"
        )
    if "sentences_.empty()" in text:
        return TokenizerSettingsError("recipe: tokenizer.train: the sample holds no text")
    detail = re.sub(r"^INTERNAL: \S+ ", "", text).replace("\n", " ")
    return TokenizerSettingsError(f"recipe: tokenizer.train: SentencePiece refused: {detail}")


def load_tokenizer(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    """Load a SentencePiece model and check it follows the Llama-2 special-id layout."""
    p = Path(path).expanduser()
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(p))
    except (OSError, RuntimeError) as e:
        raise TokenizerError(f"{p}: not a SentencePiece model ({e})") from None
    if sp.bos_id() != BOS_ID or sp.eos_id() != EOS_ID:
        raise TokenizerError(
            f"{p}: expected <s>={BOS_ID} and </s>={EOS_ID}, got {sp.bos_id()} and {sp.eos_id()}"
        )
    return sp


def tokenizer_info(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest's `tokenizer` entry (without the file name) for a model file."""
    sp = load_tokenizer(path)
    return {
        "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        "vocab_size": sp.vocab_size(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
    }


def _lines(texts: Iterable[str]) -> Iterator[str]:
    # SentencePiece trains on "sentences"; we feed lines and make "\n" a user-defined
    # symbol so newlines get their own piece instead of a byte-fallback token.
    for text in texts:
        for line in text.split("\n"):
            if line.strip():
                yield line


def train_tokenizer(
    texts: Iterable[str], config: TokenizerTrainConfig, out_path: str | os.PathLike
) -> Path:
    """Train a BPE model with Llama-2 ids and code-preserving settings; write it atomically.

    Identity normalization, no dummy prefix, no whitespace collapsing, whitespace-only
    pieces, byte fallback and split digits make decode(encode(x)) == x byte for byte
    (except for the literal character U+2581, SentencePiece's own space marker).
    """
    model = io.BytesIO()
    try:
        _train(texts, config, model)
    except RuntimeError as e:
        raise _training_error(e, config.vocab_size) from None
    out = Path(out_path)
    atomic_write_bytes(out, model.getvalue())
    return out


def _train(texts: Iterable[str], config: TokenizerTrainConfig, model: io.BytesIO) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(texts),
        model_writer=model,
        model_type="bpe",
        vocab_size=config.vocab_size,
        character_coverage=config.character_coverage,
        input_sentence_size=config.input_sentence_size,
        shuffle_input_sentence=True,
        max_sentence_length=config.max_sentence_length,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        byte_fallback=True,
        split_by_whitespace=True,
        user_defined_symbols=["\n", "\t"],
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=-1,
        hard_vocab_limit=False,
        num_threads=1,  # single-threaded BPE training is deterministic run to run
        minloglevel=2,
    )

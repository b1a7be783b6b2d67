"""SentencePiece tokenizer: training with code-preserving Llama-2 conventions, loading, info."""

from __future__ import annotations

import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from lemur.data.recipe.tokenizer import TokenizerTrainConfig
from lemur.shards.format import atomic_write_bytes
from lemur.tokenizer.base import TokenizerError  # one error type for every tokenizer
from lemur.tokenizer.sentencepiece import load_processor, parse_model

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


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


def load_llama2_processor(path: str | os.PathLike) -> spm.SentencePieceProcessor:
    """The `SentencePieceProcessor` of a model file (the tokenizer package's loader), checked
    to follow the Llama-2 special-id layout: the build reads its piece types and offsets.
    (`lemur.tokenizer.open_tokenizer` gives lemur's `Tokenizer` of any tokenizer file.)"""
    p = Path(path).expanduser()
    sp = load_processor(p)
    if sp.bos_id() != BOS_ID or sp.eos_id() != EOS_ID:
        raise TokenizerError(
            f"{p}: expected <s>={BOS_ID} and </s>={EOS_ID}, got {sp.bos_id()} and {sp.eos_id()}"
        )
    return sp


def tokenizer_info(path: str | os.PathLike, pieces: Sequence[str] = ()) -> dict[str, Any]:
    """The manifest's `tokenizer` entry (without the file name) for a model file.

    With `pieces` (a chat build's markers), `added_pieces` lists each with its id; every one
    must be a USER_DEFINED piece of the model, so that it encodes as one id.
    """
    sp = load_llama2_processor(path)
    info: dict[str, Any] = {
        "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        "vocab_size": sp.vocab_size(),
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
    }
    if pieces:
        info["added_pieces"] = user_defined_ids(sp, pieces, path)
    return info


def model_proto(sp: spm.SentencePieceProcessor) -> tuple[Any, int]:
    """The parsed ModelProto of a loaded model, and the enum value of USER_DEFINED pieces."""
    model = parse_model(sp.serialized_model_proto(), "the loaded model")
    return model, model.SentencePiece.USER_DEFINED


def user_defined_ids(
    sp: spm.SentencePieceProcessor, pieces: Sequence[str], path: Any
) -> list[dict[str, Any]]:
    """`[{"piece", "id"}]` of USER_DEFINED pieces of a model (TokenizerError if one is not)."""
    model, user_defined = model_proto(sp)
    out = []
    for piece in pieces:
        i = sp.piece_to_id(piece)
        kind = model.pieces[i].type
        # The FIM markers are CONTROL pieces (encode never produces them): one id each too.
        if sp.id_to_piece(i) != piece or kind not in (user_defined, model.SentencePiece.CONTROL):
            raise TokenizerError(f"{path}: {piece!r} is not a user-defined piece of this model")
        out.append({"piece": piece, "id": i})
    return out


def _lines(texts: Iterable[str]) -> Iterator[str]:
    # SentencePiece trains on "sentences"; we feed lines and make "\n" a user-defined
    # symbol so newlines get their own piece instead of a byte-fallback token.
    for text in texts:
        for line in text.split("\n"):
            if line.strip():
                yield line


def train_tokenizer(
    texts: Iterable[str],
    config: TokenizerTrainConfig,
    out_path: str | os.PathLike,
    user_defined_symbols: Sequence[str] = (),
) -> Path:
    """Train a BPE model with Llama-2 ids and code-preserving settings; write it atomically.

    Identity normalization, no dummy prefix, no whitespace collapsing, whitespace-only
    pieces, byte fallback and split digits make decode(encode(x)) == x byte for byte
    (except for the literal character U+2581, SentencePiece's own space marker).
    `user_defined_symbols` (e.g. the ChatML markers) become one piece each, never split
    or merged with their neighbours.
    """
    model = io.BytesIO()
    try:
        _train(texts, config, model, list(user_defined_symbols))
    except RuntimeError as e:
        raise _training_error(e, config.vocab_size) from None
    out = Path(out_path)
    atomic_write_bytes(out, model.getvalue())
    return out


def _train(
    texts: Iterable[str], config: TokenizerTrainConfig, model: io.BytesIO, symbols: list[str]
) -> None:
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
        user_defined_symbols=["\n", "\t", *symbols],
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=-1,
        hard_vocab_limit=False,
        num_threads=1,  # single-threaded BPE training is deterministic run to run
        minloglevel=2,
    )


def extend_tokenizer(
    src: str | os.PathLike,
    pieces: Sequence[str],
    out_path: str | os.PathLike,
    control: Sequence[str] = (),
) -> Path:
    """Write `src` with `pieces` appended as USER_DEFINED pieces and then `control` as CONTROL
    pieces (atomically) to `out_path`.

    Appending keeps every existing id; the new pieces get ids `vocab_size`, `vocab_size + 1`,
    ... . Pieces the model already has as USER_DEFINED are kept where they are (extending
    twice changes nothing); one it has of another type is an error, because it would not
    encode as one id. A `control` piece (the FIM markers) is never produced from text: one
    the model has already as CONTROL is kept, one it has as USER_DEFINED becomes CONTROL
    (same id), so that a document that spells it is encoded as text.
    """
    sp = load_llama2_processor(src)  # a TokenizerError naming `src` if it is not a usable model
    model, user_defined = model_proto(sp)
    kinds = model.SentencePiece
    index = {p.piece: i for i, p in enumerate(model.pieces)}
    changed = False
    wanted = [(p, user_defined) for p in pieces] + [(p, kinds.CONTROL) for p in control]
    for piece, kind in wanted:
        if piece in index:
            have = model.pieces[index[piece]]
            if kind == kinds.CONTROL and have.type == user_defined:
                have.type, changed = kinds.CONTROL, True
            elif have.type != kind:
                raise TokenizerError(
                    f"{src}: already has {piece!r} as a piece of another type"
                    f" ({kinds.Type.Name(have.type)})"
                )
            continue
        new = model.pieces.add()
        new.piece, new.score, new.type = piece, 0.0, kind
        index[piece] = len(model.pieces) - 1
        changed = True
    out = Path(out_path)
    data = model.SerializeToString() if changed else Path(src).expanduser().read_bytes()
    atomic_write_bytes(out, data)
    load_llama2_processor(out)  # the written model loads
    return out

"""The SentencePiece engine (Llama-2-style models): the tokenizer interface over spm."""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from lemur.tokenizer.base import TokenizerError

SPACE = "\u2581"  # SentencePiece's whitespace marker


def parse_model(data: bytes, name: object) -> Any:
    """The SentencePiece ModelProto of a model's bytes: the one parser of model files (the
    HF export, the build's piece checks); TokenizerError naming `name` when it is none."""
    # sentencepiece's Python API cannot list piece types or add pieces; its own generated
    # schema module (which needs protobuf) reads and edits the model.
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb
    except Exception as e:  # noqa: BLE001 - protobuf missing, or older than the schema (VersionError)
        raise TokenizerError(
            f"cannot read SentencePiece model pieces: {e} (try: pip install -U protobuf)"
        ) from None
    model = pb.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError: the bytes are not a model
        raise TokenizerError(f"{name}: not a SentencePiece model ({e})") from None
    return model


def read_model(path: str | os.PathLike[str]) -> Any:
    """`parse_model` of a model file (TokenizerError naming it when it cannot be read)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise TokenizerError(f"{path}: cannot read the tokenizer ({e.strerror})") from None
    return parse_model(data, path)


def load_processor(path: str | os.PathLike[str]) -> spm.SentencePieceProcessor:
    """A SentencePiece model file loaded: the one loader of model files (this engine's
    tokenizer, and the build's `load_llama2_processor`); TokenizerError naming it otherwise."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise TokenizerError(f"{path}: not a SentencePiece model ({e})") from None
    return sp


class SentencePieceTokenizer:
    """A SentencePiece model: `<s>` doc `</s>` framing, pieces as ids."""

    kind = "sentencepiece"
    engine = "sentencepiece"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.sp = load_processor(self.path)
        self.vocab_size = int(self.sp.vocab_size())
        bos, self.eos_id = int(self.sp.bos_id()), int(self.sp.eos_id())
        self.bos_id: int | None = bos if bos >= 0 else None
        if self.eos_id < 0:
            raise TokenizerError(f"{self.path}: the model has no </s> id")
        self.stop_ids: tuple[int, ...] = (self.eos_id,)

    @functools.cached_property
    def sha256(self) -> str:
        """sha256 of the model file, computed on first use (start-up hashes each file once)."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def encode(self, text: str) -> list[int]:
        """Ids of `text` (no `<s>`/`</s>`; a literal `<s>` is text)."""
        return list(self.sp.encode(text))

    def encode_chat(self, text: str) -> list[int]:
        """Ids of ChatML text as the chat build encodes it (no dummy-prefix `▁`: chatml.py)."""
        return list(self._chat_sp.encode(text))

    def decode_continuing(self, ids: Sequence[int]) -> str:
        """The text of ids encoded as continuing text (`encode_chat`'s: no dummy prefix), its
        leading space kept (`decode` drops one as the dummy prefix's)."""
        return self._chat_sp.decode([int(i) for i in ids])

    @functools.cached_property
    def _chat_sp(self) -> spm.SentencePieceProcessor:
        from lemur.chatml import chat_processor  # a copy of the model, made on first use

        return chat_processor(self.sp)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text, on one thread."""
        return self.sp.encode(list(texts), num_threads=1)

    def encode_chat_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode_chat` of each text, on one thread."""
        return self._chat_sp.encode(list(texts), num_threads=1)

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode_batch` as uint32 arrays."""
        return [np.asarray(ids, np.uint32) for ids in self.encode_batch(texts)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (a numpy array's made into ints in one call, not one by one)."""
        if isinstance(ids, np.ndarray):
            return self.sp.decode(ids.tolist())
        return self.sp.decode([int(i) for i in ids])

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes each id decodes to in the middle of a text (control ids 0)."""
        return np.array([self._piece_bytes(i) for i in range(self.vocab_size)], np.int64)

    def _piece_bytes(self, i: int) -> int:
        sp = self.sp
        if sp.is_control(i):
            return 0
        if sp.is_byte(i):
            return 1
        if sp.is_unknown(i):
            return len(sp.decode([i]).encode())  # the " ⁇ " surface
        return len(sp.id_to_piece(i).replace(SPACE, " ").encode())

    def first_space(self) -> tuple[np.ndarray, bool]:
        """(ids whose piece starts with `▁`, whether decode drops that space at a text's start).

        A model with a dummy prefix (Llama-2's) adds `▁` before a text when encoding and
        drops it when decoding, so the first piece of a document decodes one byte shorter.
        """
        sp, V = self.sp, self.vocab_size
        space_first = np.array([sp.id_to_piece(i).startswith(SPACE) for i in range(V)])
        space_first &= ~np.array([sp.is_control(i) or sp.is_byte(i) for i in range(V)])
        ids = np.flatnonzero(space_first)
        if ids.size == 0:
            return space_first, False
        i = int(ids[0])
        return space_first, len(sp.decode([i]).encode()) == self._piece_bytes(i) - 1

    def piece_id(self, piece: str) -> int | None:
        """The id of `piece` when it is one piece of the vocabulary, else None."""
        i = int(self.sp.piece_to_id(piece))
        return i if self.sp.id_to_piece(i) == piece and not self.sp.is_unknown(i) else None

    def is_control(self, i: int) -> bool:
        """Whether `i` is a control piece (`<s>`, `</s>`, appended FIM pieces): SentencePiece
        never encodes text to one; a user-defined piece (ChatML's markers) it does."""
        return 0 <= i < self.vocab_size and bool(self.sp.is_control(i))

    def info(self) -> dict[str, Any]:
        """The manifest's tokenizer entry (without the file name)."""
        return {
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
        }

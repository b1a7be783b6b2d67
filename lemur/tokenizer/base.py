"""The one tokenizer interface the build, the trainer and eval use, whatever the engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


class TokenizerError(ValueError):
    """A tokenizer that cannot be used (missing, corrupt, unsupported); one line, naming it."""


@runtime_checkable
class Tokenizer(Protocol):
    """Encode/decode plus what the shard format needs to know about a vocabulary.

    `encode` never turns text into a control token: a literal `<s>` or `<|endoftext|>`
    inside a document is encoded as the characters it is made of.
    """

    kind: str  # "sentencepiece" or "tokenizer.json": the file format
    engine: str  # what encodes: "sentencepiece", "tiktoken" or "tokenizers"
    vocab_size: int  # every id, added tokens included
    bos_id: int | None  # None: the model frames documents without a BOS (Qwen2.5)
    eos_id: int | None  # None only for a tokenizer.json whose files name no EOS
    stop_ids: tuple[int, ...]  # generation ends at any: EOS, and a model folder's more
    sha256: str  # of the model file

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, with no BOS/EOS and no special-token parsing."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text (one thread: parallelism comes from the executor's tasks)."""
        ...

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode` of each text as a uint32 array (what the build writes; may skip lists)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`."""
        ...

    def token_bytes(self) -> np.ndarray:
        """UTF-8 byte length of every id in the middle of a text (0 for control tokens)."""
        ...

    def piece_id(self, piece: str) -> int | None:
        """The id of `piece` when it is one token (a special or added token included)."""
        ...

    def is_control(self, i: int) -> bool:
        """Whether no text ever encodes to id `i`: a control, special or added token."""
        ...

    def info(self) -> dict[str, Any]:
        """The manifest's `tokenizer` entry, without the file name."""
        ...


@runtime_checkable
class ChatMLTokenizer(Tokenizer, Protocol):
    """A tokenizer whose chat convention is ChatML (lemur/chatml.py): a SentencePiece model.

    A chat prompt is `bos_id` + `encode_chat` of its ChatML text; a tokenizer.json model
    chats by its own template instead (lemur.chat_template), and is not one of these.
    """

    def encode_chat(self, text: str) -> list[int]:
        """Ids of ChatML text as the chat build encodes it (lemur/chatml.py), without <s>."""
        ...

"""The UTF-8 bytes each token id stands for: what bits per byte divide by.

Bytes are counted per token from a table, so the trainer can count them for any window
without decoding: a SentencePiece piece decodes to its text with `▁` as one space, a
byte-fallback piece `<0xNN>` to one byte, a byte-level BPE token to its bytes, a control
token (`<s>`, `</s>`, `<|endoftext|>`) to nothing. One context rule makes the sum exact: a
SentencePiece model with a dummy prefix (Llama-2's) drops the leading space of a document's
first piece when decoding, so the token right after `<s>` counts one byte less when its
piece starts with `▁`. Byte-level tokenizers have no such rule.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from lemur.tokenizer.base import Tokenizer
from lemur.tokenizer.load import open_tokenizer


def bits_per_byte(nll_nats: float, n_bytes: int) -> float:
    """Summed NLL in nats over the bytes it predicted, in bits per byte (nan without bytes)."""
    return nll_nats / math.log(2) / n_bytes if n_bytes else math.nan


class TokenBytes:
    """UTF-8 bytes each token id decodes to (the table behind bits per byte)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.table = tok.token_bytes()
        self.bos_id = tok.bos_id
        first_space = getattr(tok, "first_space", None)  # SentencePiece's dummy prefix
        if first_space is not None:
            self.space_first, self.strips_first_space = first_space()
        else:
            self.space_first, self.strips_first_space = np.zeros(len(self.table), bool), False

    @classmethod
    def from_model_file(cls, path: str | os.PathLike[str]) -> TokenBytes:
        """The table of a tokenizer file (SentencePiece model or tokenizer.json)."""
        return cls(open_tokenizer(path))

    @classmethod
    def for_shards(cls, directory: Any) -> TokenBytes:
        """The table of a shard directory's tokenizer (the copy its manifest names)."""
        from lemur.shards.check import ShardDir

        return cls.from_model_file(ShardDir.of(directory).tokenizer_path)

    def target_bytes(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """Bytes of each target token (any shape), given the token before it (`inputs`)."""
        targets = np.asarray(targets, np.int64)
        n = self.table[targets]
        if self.strips_first_space:
            n = n - ((np.asarray(inputs) == self.bos_id) & self.space_first[targets])
        return n

    def batch_bytes(self, batch: Mapping[str, np.ndarray]) -> int:
        """Bytes of the scored targets of a loader batch (`inputs`, `targets`, `loss_mask`)."""
        n = self.target_bytes(batch["inputs"], batch["targets"])
        return int((n * np.asarray(batch["loss_mask"])).sum())

    def document_bytes(self, ids: np.ndarray) -> int:
        """Bytes of one document's ids (framed or bare), as decode would give them."""
        ids = np.asarray(ids, np.int64)
        start = -1 if self.bos_id is None else self.bos_id  # a bare document starts fresh
        before = np.concatenate(([start], ids[:-1]))
        return int(self.target_bytes(before, ids).sum())

"""Byte offsets of the tokens of one SentencePiece encoding of each text.

SentencePiece's own offset mapping (`encode(out_type="offset_mapping")`) builds Python
tuples and piece strings for every token and runs at about half the speed of a plain
`encode` here (docs/benchmarks.md). For a model whose pieces stand 1:1 for the text they
cover (identity normalization, whitespaces escaped as `▁`, no whitespace collapsing), the
offsets of a plain encoding follow from each piece's length in bytes: `▁` is one space, a
byte piece one byte, `<s>`/`<unk>` never appear (byte fallback). Every text is checked: the
pieces' lengths must add up to its UTF-8 length, else (e.g. a literal `▁` in the text, an
`<unk>`) its offsets come from SentencePiece's offset mapping, as they do for every text of
a model that does not qualify.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np
import sentencepiece as spm

from lemur.data.encode.tokenizer import model_proto

SPACE = "\u2581"  # SentencePiece's whitespace marker
NOT_TEXT = -(1 << 40)  # the length of a piece that stands for no text: forces the fallback


def piece_lengths(sp: spm.SentencePieceProcessor) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(bytes of text per piece id, which pieces start with `▁`, does the model add a dummy
    prefix?), or None when the model's pieces do not map 1:1 to text."""
    model, _ = model_proto(sp)
    norm = model.normalizer_spec
    if (
        norm.name != "identity"
        or norm.remove_extra_whitespaces
        or not norm.escape_whitespaces
        or model.trainer_spec.treat_whitespace_as_suffix
    ):
        return None
    kind = type(model).SentencePiece
    text_kinds = (kind.NORMAL, kind.USER_DEFINED)

    def length(p: Any) -> int:
        if p.type == kind.BYTE:
            return 1
        if p.type in text_kinds:
            return len(p.piece.replace(SPACE, " ").encode())
        return NOT_TEXT  # <unk>, <s>, </s>, unused: no fixed text

    lengths = np.array([length(p) for p in model.pieces], np.int64)
    space_first = np.array([p.piece.startswith(SPACE) for p in model.pieces], bool)
    return lengths, space_first, bool(norm.add_dummy_prefix)


class TokenOffsets:
    """Ids and byte offsets `[begin, end)` per token of one encoding of each text."""

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        self.sp = sp
        table = piece_lengths(sp)
        # With a dummy prefix a text's first piece starts with a `▁` that is not in the text.
        self.lengths, self.space_first, self.dummy = table or (None, None, False)

    def encode(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids int64, offsets int64 (tokens, 2) in UTF-8 bytes) of each text."""
        ids, offsets, starts = self.encode_flat(texts)
        bounds = zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
        return [(ids[a:b], offsets[a:b]) for a, b in bounds]

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch at once: ids, offsets (each text's own bytes) and each text's first row.

        Row `starts[i]` is text i's first token and `starts[i + 1]` one past its last; a
        whole batch is handled in a few numpy passes (conversations are short: per-text
        numpy calls would cost more than the encoding).
        """
        mapped: list[int] = list(range(len(texts)))
        if self.lengths is not None:
            # One thread: parallelism comes from the executor's tasks.
            ids, starts = _flatten(self.sp.encode(texts, num_threads=1))
            offsets, bad = self._from_pieces(texts, ids, starts)
            mapped = np.flatnonzero(bad).tolist()
        if mapped:
            encoded = self.sp.encode(
                [texts[i] for i in mapped],
                out_type="offset_mapping",
                return_bytes=True,
                num_threads=1,
            )
            if self.lengths is None:
                ids, starts = _flatten([m["ids"] for m in encoded])
                offsets = np.empty((len(ids), 2), np.int64)
            for i, m in zip(mapped, encoded, strict=True):
                flat = np.fromiter(chain.from_iterable(m["offsets"]), np.int64, 2 * len(m["ids"]))
                offsets[starts[i] : starts[i + 1]] = flat.reshape(-1, 2)
        return ids, offsets, starts

    def _from_pieces(
        self, texts: list[str], ids: np.ndarray, starts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Offsets from the pieces' lengths, and which texts they do not add up to."""
        assert self.lengths is not None
        counts = np.diff(starts)
        lengths = self.lengths[ids]
        first = starts[:-1][counts > 0]
        bad_first = np.zeros(len(texts), bool)
        if self.dummy and len(first):
            bad_first[counts > 0] = ~self.space_first[ids[first]]
            lengths[first] -= 1
        ends = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths, out=ends[1:])
        negative = np.zeros(len(ids) + 1, np.int64)
        np.cumsum(lengths < 0, out=negative[1:])
        base = ends[starts[:-1]]  # each text's own offsets start at 0
        sizes = np.fromiter(
            (len(t) if t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts),
            np.int64,
            len(texts),
        )
        bad = (ends[starts[1:]] - base != sizes) | (np.diff(negative[starts]) > 0) | bad_first
        local_ends = ends[1:] - np.repeat(base, counts)
        return np.stack((local_ends - lengths, local_ends), axis=1), bad


def _flatten(encoded: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """All ids of a batch in one int64 array, and each text's first row (plus the end)."""
    counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
    starts = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    return np.fromiter(chain.from_iterable(encoded), np.int64, int(starts[-1])), starts


def byte_offsets(text: str) -> np.ndarray | None:
    """UTF-8 byte offset of every char offset 0..len(text) of `text` (None: ASCII, the same)."""
    if text.isascii():
        return None
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), "<u4")
    sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    out = np.zeros(len(points) + 1, np.int64)
    np.cumsum(sizes, out=out[1:])
    return out

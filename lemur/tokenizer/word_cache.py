"""Documents encoded stretch by stretch with a cache: SentencePiece BPE's own ids at a
fraction of its cost, for models whose pieces never span a word start.

SentencePiece's BPE encode runs at about 2.6 MB/s on code, half of a build's CPU
(docs/benchmarks.md). Most of a corpus is words it has encoded before. BPE merges only
ever make pieces of the vocabulary, so a place in a text where no piece can span (no piece
holds the two characters on either side of it) splits the encoding: the ids of the text are
the ids of the stretches between such places, put end to end (merges on one side never see
the other; ties go to the leftmost pair, the same inside a stretch wherever it stands). Two
kinds of place are read from the model:

- a *word start*: a space (or a literal `▁`, which SentencePiece reads as one) after a
  character that is neither, where no piece holds a `▁` after another character, except
  runs of `▁` alone (lemur/tokenizer/fim_splice.py splits FIM parts at the same places);
- either side of a *lone* ASCII character, one that no piece of two or more characters
  holds: for the build's models (`split_digits`, `\\n` and `\\t` user-defined) the digits,
  newlines, tabs and control characters.

`WordCache.for_tokenizer(tok, dtype)` gives a cache only for a model where this holds:
BPE (not unigram, whose best path depends on the whole text), identity normalization (no
NFKC, no table, no removal of extra spaces), spaces escaped as a leading `▁`, byte fallback
(without it SentencePiece merges a run of unknown characters into one `<unk>`, across
stretches). The first stretch of a text is encoded as a text of its own (a dummy prefix
model adds its `▁` there), the rest as continuing text. Tests compare every id with
`encode` on real models and hostile text (tests/test_tokenizer_word_cache.py).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import numpy as np

from lemur.tokenizer.sentencepiece import SPACE, SentencePieceTokenizer, read_model

# ModelProto.SentencePiece.Type values of the pieces BPE merges through: normal, user
# defined, and unused (merged, then split back into their parts at the end).
MERGED_TYPES = (1, 4, 5)
_BPE = 2  # TrainerSpec.ModelType
# Entries each of a worker's caches holds before it starts again (~160 bytes each for the
# short words most are, up to ~350 for 64 CJK characters: ~80-180 MB; a dummy prefix model
# has two caches); a build's words repeat well within it (docs/benchmarks.md).
CACHE_ENTRIES = 1 << 19
# Stretches longer than this (characters) are encoded but not kept past their batch: they
# rarely come again (4.7% of the bench's text is distinct stretches over 50 characters),
# and a corpus of long unique ones (base64, minified code) would otherwise fill memory.
KEPT_CHARS = 64


def splits_at_word_starts(tok: SentencePieceTokenizer) -> bool:
    """Whether a SentencePiece model's encoding splits at word starts (module docstring):
    BPE, identity normalization, a leading `▁`, and no piece spanning a word start."""
    return _model_splits(read_model(tok.path))


def _model_splits(model: Any) -> bool:
    """`splits_at_word_starts` of a parsed ModelProto."""
    norm, trainer = model.normalizer_spec, model.trainer_spec
    if (
        trainer.model_type != _BPE
        or norm.name != "identity"
        or norm.precompiled_charsmap  # the table normalizes, whatever the name says
        or norm.remove_extra_whitespaces
        or not norm.escape_whitespaces
        or trainer.treat_whitespace_as_suffix
        or model.denormalizer_spec.precompiled_charsmap
    ):
        return False
    return not any(
        piece.type in MERGED_TYPES and _spans_a_word_start(piece.piece) for piece in model.pieces
    )


def _spans_a_word_start(piece: str) -> bool:
    """Whether a piece holds a `▁` after a character that is not one (`a▁b`, `▁a▁`), or
    two `▁` before other characters (`▁▁a`): the FIM splicer reads a space after a literal
    `▁` as a word start, which such a piece would span."""
    rest = piece.lstrip(SPACE)
    return SPACE in rest or (bool(rest) and len(piece) - len(rest) > 1)


def lone_characters(tok: SentencePieceTokenizer) -> str:
    """The ASCII characters (space aside) that no merged piece of two or more characters
    holds: the model's encoding splits on either side of each of them."""
    return _model_lone(read_model(tok.path))


def _model_lone(model: Any) -> str:
    """`lone_characters` of a parsed ModelProto."""
    held: set[str] = set()
    for piece in model.pieces:
        if piece.type in MERGED_TYPES and len(piece.piece) > 1:
            held.update(piece.piece)
    return "".join(chr(c) for c in range(128) if chr(c) not in held and chr(c) != " ")


def _typecode(dtype: np.dtype) -> str:
    """The `array` typecode of an unsigned token dtype (native order, as numpy's)."""
    for code in "BHILQ":
        if array(code).itemsize == dtype.itemsize:
            return code
    raise ValueError(f"no array typecode for {dtype}")


class WordCache:
    """Texts encoded stretch by stretch, each distinct stretch once (module docstring)."""

    def __init__(
        self,
        tok: SentencePieceTokenizer,
        dtype: np.dtype,
        lone: str = "",
        entries: int = CACHE_ENTRIES,
        dummy_prefix: bool | None = None,
    ) -> None:
        self.tok = tok
        self.dtype = np.dtype(dtype)
        self.entries = entries
        self._code = _typecode(self.dtype)
        self._swap = not self.dtype.isnative  # `array` writes native order, the dtype may not
        spaces = f" {SPACE}"
        alone = re.escape(lone) if lone else ""
        # A lone character; or spaces then characters up to the next space or lone one; or
        # spaces before a lone character or the end. Every character of a text is in one.
        lone_alt = f"[{alone}]|" if alone else ""
        self.stretches: Callable[[str], list[str]] = re.compile(
            f"{lone_alt}[{spaces}]*[^{spaces}{alone}]+|[{spaces}]+"
        ).findall
        # A dummy prefix model encodes a text's first stretch with its `▁`, the rest
        # without: two caches. Without one, the first stretch is like any other. (None:
        # read from the model file; `for_tokenizer` passes what it already parsed.)
        if dummy_prefix is None:
            dummy_prefix = read_model(tok.path).normalizer_spec.add_dummy_prefix
        self._dummy_prefix = bool(dummy_prefix)
        self._words: dict[str, bytes] = {}
        self._firsts: dict[str, bytes] = {}

    @classmethod
    def for_tokenizer(cls, tok: object, dtype: np.dtype) -> WordCache | None:
        """A cache for `tok` when its encoding splits at word starts, else None."""
        if not isinstance(tok, SentencePieceTokenizer):
            return None
        model = read_model(tok.path)  # parsed once for every check
        if not _model_splits(model) or not model.trainer_spec.byte_fallback:
            return None
        dummy = model.normalizer_spec.add_dummy_prefix
        return cls(tok, dtype, _model_lone(model), dummy_prefix=dummy)

    def __contains__(self, stretch: object) -> bool:
        """Whether the cache holds a stretch."""
        return stretch in self._words or stretch in self._firsts

    def __len__(self) -> int:
        """How many stretches the cache holds."""
        return len(self._words) + len(self._firsts)

    def _fill(
        self,
        cache: dict[str, bytes],
        stretches: set[str],
        encode: Callable[[Sequence[str]], list[list[int]]],
    ) -> list[str]:
        """Encode the stretches `cache` lacks, in one call, and hold their bytes; the long
        ones among them, for the caller to drop once the batch is joined."""
        new = list(stretches.difference(cache))
        if not new:
            return []
        if len(cache) + len(new) > self.entries:
            # Start again: the words seen next are the ones worth keeping. This batch's
            # stretches are all encoded now, those held before as well.
            cache.clear()
            new = list(stretches)
        code, swap = self._code, self._swap
        for stretch, ids in zip(new, encode(new), strict=True):
            held = array(code, ids)
            if swap:
                held.byteswap()
            cache[stretch] = held.tobytes()
        return [stretch for stretch in new if len(stretch) > KEPT_CHARS]

    def encode(self, texts: Sequence[str]) -> list[bytes]:
        """The ids of each text (as the tokenizer's `encode` gives them) as `dtype` bytes."""
        split, tok = self.stretches, self.tok
        parts = [split(t) for t in texts]
        words = self._words
        get = words.__getitem__
        if not self._dummy_prefix:
            long = self._fill(words, set().union(*parts), tok.encode_batch)
            out = [b"".join(map(get, p)) for p in parts]
            _drop(words, long)
            return out
        firsts = self._firsts
        long_firsts = self._fill(firsts, {p[0] for p in parts if p}, tok.encode_batch)
        rest = set(chain.from_iterable(p[1:] for p in parts))
        long = self._fill(words, rest, tok.encode_chat_batch)
        out = [firsts[p[0]] + b"".join(map(get, p[1:])) if p else b"" for p in parts]
        _drop(firsts, long_firsts)
        _drop(words, long)
        return out


def _drop(cache: dict[str, bytes], stretches: list[str]) -> None:
    """Forget `stretches` (the long ones a batch encoded)."""
    for stretch in stretches:
        del cache[stretch]

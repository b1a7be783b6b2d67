r"""Word n-grams of a text, hashed with numpy (no Python call per word or per n-gram).

Words are runs of letters, digits and `_` (`\w+`) of the lowercased text, as datatrove's
n-gram decontamination sees them when given that word splitter. A text becomes an array of
its characters with every non-word character replaced by a space: ASCII text (most code) as
bytes through one `bytes.translate`, other text as code points (UTF-32) through a table of
`\w` over all of Unicode (`str.isalnum()` or `_`, exactly what `re` uses; built once per
process). Each word's hash is a polynomial over its characters, computed for all words at
once from a prefix sum (`P^(end-1) * (S[end] - S[start])` with `S` the running sum of
`char * P^-j`, all mod 2^64, P odd so invertible); an ASCII word hashes the same either way.
n-gram hashes combine word hashes as dedup shingles do (`dedup.combine_ngrams`).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from lemur.data.dedup.signer import combine_ngrams

_SPACE = 32
_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_")
# ASCII: word characters lowercased, every other character a space (`\w` on ASCII text).
_ASCII_TABLE = bytes(
    (ord(chr(c).lower()) if chr(c) in _WORD_CHARS else _SPACE) if c < 128 else c for c in range(256)
)
_P = 0x100000001B3  # FNV prime (odd: invertible mod 2^64)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_POWERS: dict[str, np.ndarray] = {}
_TABLES: dict[str, np.ndarray] = {}


def word_chars(text: str) -> np.ndarray:
    """The lowercased text with non-word characters as spaces: uint8 if ASCII, else uint32."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii").translate(_ASCII_TABLE), np.uint8)
    points = np.frombuffer(text.lower().encode("utf-32-le", "surrogatepass"), "<u4")
    return np.where(_unicode_words()[points], points, np.uint32(_SPACE)).astype("<u4")


def _unicode_words() -> np.ndarray:
    r"""`\w` for every code point (what `re` matches: alphanumeric or `_`), built on first use."""
    if "w" not in _TABLES:
        table = np.fromiter((chr(c).isalnum() for c in range(0x110000)), bool, 0x110000)
        table[ord("_")] = True
        _TABLES["w"] = table
    return _TABLES["w"]


def _powers(length: int) -> tuple[np.ndarray, np.ndarray]:
    """P^k and P^-k for k in [0, length], cached per process and grown by doubling."""
    if len(_POWERS.get("p", ())) <= length:
        size = max(length + 1, 2 * len(_POWERS.get("p", ())), 1 << 16)
        with np.errstate(over="ignore"):
            for key, base in (("p", _P), ("q", pow(_P, -1, 2**64))):
                steps = np.full(size - 1, base, np.uint64)
                _POWERS[key] = np.concatenate(([np.uint64(1)], np.cumprod(steps)))
    return _POWERS["p"], _POWERS["q"]


@dataclass(frozen=True)
class Ngrams:
    """A text's words (as byte spans of `data`) and the hash of each word n-gram."""

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    hashes: np.ndarray

    def text(self, i: int, n: int) -> str:
        """The words of the n-gram at word `i`, joined by single spaces."""
        return " ".join(self.span(self.starts[i], self.ends[i + n - 1]).split())

    def span(self, start: int, end: int) -> str:
        """Characters `start:end` of `data` as text."""
        raw = self.data[start:end].tobytes()
        return raw.decode("ascii" if self.data.dtype == np.uint8 else "utf-32-le", "surrogatepass")


def word_hashes(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, hash) of every space-separated word of `data`, vectorized."""
    word = np.zeros(len(data) + 2, np.int8)
    word[1:-1] = data != _SPACE
    edges = word[1:] - word[:-1]
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    p, q = _powers(len(data))
    with np.errstate(over="ignore"):
        prefix = np.zeros(len(data) + 1, np.uint64)
        np.cumsum(data * q[: len(data)], out=prefix[1:])
        h = p[ends - 1] * (prefix[ends] - prefix[starts])
        # A finalizer spreads the bits so that the n-gram polynomial sees random words.
        h ^= h >> np.uint64(31)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return starts, ends, h


def text_ngrams(text: str, n: int) -> Ngrams:
    """The word n-grams of a text (no n-gram when it has fewer than `n` words)."""
    data = word_chars(text)
    starts, ends, h = word_hashes(data)
    return Ngrams(data, starts, ends, combine_ngrams(h, n))

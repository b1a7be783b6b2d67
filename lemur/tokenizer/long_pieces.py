"""Long regex pieces of byte-level BPE: finding them fast, and merging runs of one byte fast.

tiktoken's BPE is quadratic in a piece's length (tiktoken#195) and its regex overflows
the stack on ~1 MB of spaces, so long pieces must not reach it. Two things here, neither
in tiktoken nor `tokenizers`:
- `has_long_run` / `long_pieces` / `stretch_cut`: whether a text may hold a piece of
  MAX_RUN bytes, where its pieces longer than MAX_PIECE characters are (with a regex
  matching many pieces per match: a Python loop per piece cost 1 MB of digits 3x normal
  text), and where the stretch before each may end for tiktoken to split it as the
  whole text splits;
- `RunLengthBPE`: tiktoken's BPE on a piece made of a few long runs of one byte (a
  megabyte of spaces, `=`, newlines or `a`), on run-length encoded symbols: each merge is
  applied to all runs at once, so the cost is per run, not per byte (the reference's own
  BPE takes 0.3-0.5 s per MB there, 4-5x normal text).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import regex

# No piece can be longer than the longest run of "word-ish" or "space-ish" bytes
# (`has_long_run`), so a text whose runs are all shorter than MAX_RUN bytes goes to
# tiktoken whole; in any other text, pieces longer than MAX_PIECE characters are merged
# by `RunLengthBPE` or the reference's own BPE.
MAX_RUN = 4096
MAX_PIECE = 2048
# Pieces per match of the grouped regex: its matches are at most this many pieces long.
GROUP = 256
# Piece starts kept before each long piece, to find where a stretch before it may end.
BACK = 16
_NON_SPACE = regex.compile(r"\S")
# A long piece with more runs than this goes to the reference's BPE (not a run of one byte).
MAX_RUNS = 64


def _class_table(member: Any) -> bytes:
    return bytes(0x61 if member(b) else 0x20 for b in range(256))


_SPACE = {9, 10, 11, 12, 13, 32}
# Word-ish bytes: everything but ASCII whitespace, plus CR/LF (pieces end in them);
# space-ish bytes: ASCII whitespace and any non-ASCII byte (Unicode spaces), plus `/`
# (tekken's punctuation pieces end in `[\r\n/]*`). Bytes 0x1c-0x1f count as both. A regex
# piece of the byte-level patterns lies within one word-ish or one space-ish run, give or
# take a leading byte.
_WORDISH = _class_table(lambda b: b not in _SPACE or b in (10, 13) or 0x1C <= b <= 0x1F)
_SPACEISH = _class_table(lambda b: b in _SPACE or b >= 128 or b == 47 or 0x1C <= b <= 0x1F)
_LONG_RUN = b"a" * (MAX_RUN - 1)


def has_long_run(data: bytes) -> bool:
    """Whether a text (UTF-8) may hold a regex piece of MAX_RUN bytes or more.

    Two byte translations and two substring searches: ~400 MB/s, against tiktoken's ~20.
    """
    return _LONG_RUN in data.translate(_WORDISH) or _LONG_RUN in data.translate(_SPACEISH)


def grouped(pattern: str) -> str:
    """A regex whose matches are runs of up to GROUP consecutive pieces of `pattern`.

    A backtracking engine takes, in each repetition, the first way the pattern matches
    there (stopping the repetition is tried before any earlier choice is revisited), so
    the pieces inside a match are exactly the pieces `pattern` alone finds.
    """
    return f"(?:{pattern}){{1,{GROUP}}}"


@dataclass(frozen=True)
class LongPiece:
    """A piece longer than MAX_PIECE characters, and where the pieces before it start."""

    start: int
    end: int
    before: tuple[int, ...]  # starts of up to BACK pieces right before it, nearest last


def long_pieces(text: str, groups: Any, pieces: Any) -> Iterator[LongPiece]:
    """The pieces of `text` longer than MAX_PIECE characters, in order.

    `groups` is the compiled `grouped` pattern, `pieces` the compiled pattern: only a
    group longer than MAX_PIECE can hold a long piece, and only those (and the group before
    each, for `before`) are split into pieces.
    """
    before: deque[int] = deque(maxlen=BACK)
    unsplit: int | None = None  # start of the group before, if it was not split
    for group in groups.finditer(text):
        start, end = group.span()
        if end - start <= MAX_PIECE:
            unsplit = start
            continue
        if unsplit is not None:
            before.clear()
            before.extend(s for s, _ in _spans(pieces, text, unsplit, start))
            unsplit = None
        for piece in pieces.finditer(text, start):
            s, e = piece.span()
            if s >= end:
                break
            if e - s > MAX_PIECE:
                yield LongPiece(s, e, tuple(before))
            before.append(s)


def stretch_cut(
    text: str, lo: int, piece: LongPiece, pieces: Any
) -> tuple[int, list[tuple[int, int]]]:
    """(cut, spans): tiktoken may encode `text[lo:cut]` alone; `spans` are the pieces from
    `cut` to the long piece, to be encoded one by one.

    `lo` is a piece boundary (0 or the end of the long piece before). A stretch may end at
    a boundary right after a non-space character (see `tiktoken_exact.restartable`).
    """
    cut, spans = piece.start, []
    for start in reversed(piece.before):
        if cut <= lo or _NON_SPACE.match(text, cut - 1):
            return cut, spans[::-1]
        spans.append((start, cut))
        cut = start
    if cut <= lo or _NON_SPACE.match(text, cut - 1):
        return cut, spans[::-1]
    # No such boundary among the last BACK pieces (rare): each piece from `lo` on its own.
    return lo, [*_spans(pieces, text, lo, cut), *spans[::-1]]


def _spans(pieces: Any, text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Spans of the pieces from boundary `start` up to `end`."""
    for piece in pieces.finditer(text, start):
        if piece.start() >= end:
            return
        yield piece.span()


class RunLengthBPE:
    """tiktoken's BPE (ids = ranks) applied to run-length encoded symbols.

    tiktoken merges the adjacent pair whose joined bytes rank lowest, the leftmost among
    equals, one at a time. Applying that merge to all runs at once is the same while no
    other pair ranks as low and no pair it makes ranks lower; `merge` checks both at every
    step and gives up (None) otherwise, and the caller asks the reference. Its ranks are
    tiktoken's for this tokenizer, whose ids equal the reference's (`tiktoken_plan`).
    """

    def __init__(self, ranks: dict[bytes, int]) -> None:
        self.ranks = ranks

    def runs(self, piece: str) -> list[list] | None:
        """[token bytes, count] runs of a piece, each character already merged into one
        token where tiktoken would do that first (None: not so, or more than MAX_RUNS runs).

        A character of several bytes (`é`, `中`) is first merged on its own; that this is
        tiktoken's order too is checked: no pair across two characters, at any point of
        their own merging, may rank as low as a merge inside one.
        """
        points = np.frombuffer(piece.encode("utf-32-le"), np.uint32)
        starts = np.flatnonzero(points[1:] != points[:-1]) + 1
        if len(starts) >= MAX_RUNS:
            return None
        bounds = [0, *starts.tolist(), len(piece)]
        chars = [(piece[s], e - s) for s, e in zip(bounds, bounds[1:], strict=False)]
        units = {c: _own_merges(c.encode("utf-8"), self.ranks) for c, _ in chars}
        if any(len(u.tokens) != 1 for u in units.values()):
            return None  # a character of two tokens repeats as a pattern, not a run
        inner = max(u.top for u in units.values())
        pairs = {(c, d) for (c, _), (d, _) in zip(chars, chars[1:], strict=False)}
        pairs |= {(c, c) for c, n in chars if n > 1}
        for c, d in pairs:
            for x in units[c].lasts:
                for y in units[d].firsts:
                    rank = self.ranks.get(x + y)
                    if rank is not None and rank <= inner:
                        return None
        return [[units[c].tokens[0], n] for c, n in chars]

    def merge(self, runs: list[list]) -> list[int] | None:
        """The ids BPE makes of the bytes `runs` stand for (None: not by runs, see above)."""
        while True:
            best = self._lowest(runs)
            if best is None:
                return [self.ranks[token] for token, count in runs for _ in range(count)]
            rank, pairs = best
            if len(pairs) > 1:
                return None  # two different pairs tie: the leftmost of either goes first
            a, b = pairs.pop()
            runs = _normalized(_apply(runs, a, b))
            made = self._lowest(runs, involving=a + b)
            if made is not None and made[0] <= rank:
                return None

    def _lowest(
        self, runs: list[list], involving: bytes | None = None
    ) -> tuple[int, set[tuple[bytes, bytes]]] | None:
        """(rank, pairs of that rank) of the lowest-ranked pairs present (that have the
        token `involving`, if given)."""
        best: tuple[int, set[tuple[bytes, bytes]]] | None = None
        for i, (token, count) in enumerate(runs):
            pairs = [(token, token)] if count > 1 else []
            if i + 1 < len(runs):
                pairs.append((token, runs[i + 1][0]))
            for pair in pairs:
                rank = self.ranks.get(pair[0] + pair[1])
                if rank is None or (involving is not None and involving not in pair):
                    continue
                if best is None or rank < best[0]:
                    best = (rank, {pair})
                elif rank == best[0]:
                    best[1].add(pair)
        return best


@dataclass(frozen=True)
class _Unit:
    """A character's bytes merged on their own: the tokens, the highest rank merged, and
    the first and last tokens it had at any point."""

    tokens: tuple[bytes, ...]
    top: int
    firsts: frozenset[bytes]
    lasts: frozenset[bytes]


def _own_merges(data: bytes, ranks: dict[bytes, int]) -> _Unit:
    """tiktoken's BPE of a few bytes (one character), with what `runs` checks."""
    parts = [data[i : i + 1] for i in range(len(data))]
    firsts, lasts, top = {parts[0]}, {parts[-1]}, -1
    while len(parts) > 1:
        ranked = [
            (r, i)
            for i in range(len(parts) - 1)
            if (r := ranks.get(parts[i] + parts[i + 1])) is not None
        ]
        if not ranked:
            break
        rank, i = min(ranked)  # the lowest rank, the leftmost of equals
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        top = max(top, rank)
        firsts.add(parts[0])
        lasts.add(parts[-1])
    return _Unit(tuple(parts), top, frozenset(firsts), frozenset(lasts))


def _apply(runs: list[list], a: bytes, b: bytes) -> list[list]:
    """Runs after merging every `a b` from the left (adjacent runs hold different tokens)."""
    out = a + b
    new: list[list] = []
    for i, (token, count) in enumerate(runs):
        if a == b:  # pairs inside each run of `a`, from its left; an odd one stays
            new += [[out, count // 2], [a, count % 2]] if token == a else [[token, count]]
            continue
        if token == b and i > 0 and runs[i - 1][0] == a:
            new.append([out, 1])  # the last `a` before and this run's first `b`
            count -= 1
        if token == a and i + 1 < len(runs) and runs[i + 1][0] == b:
            count -= 1  # its last `a` goes into the pair made at the next run
        new.append([token, count])
    return new


def _normalized(runs: list[list]) -> list[list]:
    """Runs without empty ones, neighbours of one token joined."""
    out: list[list] = []
    for token, count in runs:
        if count == 0:
            continue
        if out and out[-1][0] == token:
            out[-1][1] += count
        else:
            out.append([token, count])
    return out

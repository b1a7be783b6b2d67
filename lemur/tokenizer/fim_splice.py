"""FIM ids of a document built from the document's own ids: only the words at the cuts are
encoded again (SentencePiece BPE and byte-level BPE models).

The build tokenizes every document left to right; a FIM document is the same text cut in
three and encoded part by part (lemur/tokenizer/fim.py). Encoding the three parts again
costs as much as tokenizing the document a second time, which made a build with `fim.rate
0.5` about 1.2x slower. For a SentencePiece BPE model this is not needed: no piece of a
model trained with `split_by_whitespace` (every Llama-2-style model) holds a `▁` (a space)
after another character, so no piece can span a *word start*: a space whose previous
character is not a space. BPE merges on either side of a word start never see the other
side (and ties go to the leftmost pair, the same inside a word wherever it stands), so the
encoding of any text is the encodings of its stretches between word starts, put end to
end. A part of a FIM document is therefore: the encoding of the few characters from the
part's start to the first word start inside it, the document's own ids up to the last word
start inside the part, and the encoding of the few characters after it.

`WordSplicer.for_tokenizer(tok)` gives a splicer only for a model where this holds, read
from the model file: a BPE model (not unigram: its best path breaks ties between
segmentations of equal score, such as `** *` and `* **`, by floating-point rounding of the
whole text's sum, so a word's ids depend on the text before it: measured), identity
normalization (no NFKC, no normalization table, no removal of extra spaces), spaces escaped
as `▁` at the start of a word (not as a suffix), and no normal, user-defined or unused piece
(BPE merges through unused pieces too) with a `▁` after another character.
`WordSplicer.ids(layout, text, doc_ids)` gives the ids of a `fim_layout` of the text that
`doc_ids` decode to, or None when they do not line up with it (an unknown piece, a byte
count that does not add up, a text the model would normalize): the caller then encodes the
parts as text. Tests compare the result with `encode_parts` on real models, on sampled cuts
of real and hostile documents (tests/test_tokenizer_fim_splice.py).

Byte-level BPE (tokenizer.json: Llama-3, Qwen2.5, tekken) splits text into
pieces by a regex and merges bytes within a piece, so the same holds at every piece boundary
that the regex finds wherever the text is cut: for the patterns in use, a space right after a
visible ASCII character always starts a piece (no alternative holds a space after another
character, except in runs of whitespace), and a piece ending there looks ahead at a space,
as the end of a text looks (`tiktoken_exact.restartable`). `for_tokenizer` takes such a model
when its tokenizer.json is a BPE over one split regex (`tiktoken_exact.byte_level_split`,
no normalizer or NFC; StarCoder2's digit-splitting pre-tokenizer is not one, so its parts
are encoded) whose pieces start at such a space in probes of every visible ASCII character
(once to three times) before it and letters, digits, marks, spaces and symbols after it.
The probe is a check against the patterns in use (each of which was read: no alternative
holds a space after a non-space outside a whitespace run), not a proof for any regex; the
tests compare the splice with encoding the parts on each of them.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from lemur.tokenizer.bytelevel import ByteLevelTokenizer
from lemur.tokenizer.fim import Span
from lemur.tokenizer.sentencepiece import SentencePieceTokenizer
from lemur.tokenizer.tiktoken_exact import byte_level_split, restartable
from lemur.tokenizer.word_cache import splits_at_word_starts

# Which byte may stand right before a word start's space, per kind of model: SentencePiece,
# any but a space; byte-level BPE, a visible ASCII character (no `\s` run can hold it).
_NOT_SPACE = bytes(b != 0x20 for b in range(256))
_VISIBLE_ASCII = bytes(0x21 <= b <= 0x7E for b in range(256))
# Characters around the word starts probed in a byte-level model's split regex.
_PROBE_BEFORE = [chr(c) for c in range(0x21, 0x7F)]
_PROBE_AFTER = [
    *_PROBE_BEFORE,
    " ",
    "\t",
    "\n",
    "\r",
    "\u00e9",
    "\u4e2d",
    "\u0301",
    "\u0663",
    "\U0001f600",
]


def _word_start_at_or_after(data: bytes, i: int, end: int, before: bytes) -> int:
    """The first word start (a space after a byte `before` allows) at or after byte `i` and
    before `end`, or `end` when there is none. `i > 0`."""
    while True:
        i = data.find(b" ", i, end)
        if i < 0:
            return end
        if before[data[i - 1]]:
            return i
        i += 1


def _word_start_at_or_before(data: bytes, i: int, start: int, before: bytes) -> int:
    """The last word start at or before byte `i` and after `start`, or `start` when none."""
    at = data.rfind(b" ", start + 1, i + 1)
    while at > start and not before[data[at - 1]]:
        at = data.rfind(b" ", start + 1, at)
    return at if at > start else start


@functools.cache
def _splits_at_word_starts(pattern: str) -> bool:
    """Whether a split regex always ends a piece before a space that follows a visible
    ASCII character, probed with every such character before it and letters, digits,
    marks, spaces and symbols after it (true of GPT-2's, Llama-3's, Qwen2's and tekken's)."""
    import regex

    split = regex.compile(pattern)
    for a in _PROBE_BEFORE:
        for b in _PROBE_AFTER:
            for text, at in ((f"{a} {b}", 1), (f"{a}{a} {b}{b}x", 2), (f"{a}{a}{a} {b}", 3)):
                if at not in {m.start() for m in split.finditer(text)}:
                    return False
    return True


class WordSplicer:
    """Exact FIM ids of a document from the document's own ids (`for_tokenizer`)."""

    def __init__(
        self,
        tok: SentencePieceTokenizer | ByteLevelTokenizer,
        continuing: Callable[[str], list[int]],
        before: bytes,
        nfc: bool = False,
    ) -> None:
        self.tok = tok
        self.nfc = nfc  # the model normalizes to NFC: only NFC text is the ids' own
        self.leading = tok.encode  # a text of its own (a SentencePiece dummy prefix)
        self.continuing = continuing
        self.before = before
        self.piece_bytes = tok.token_bytes()  # UTF-8 bytes of each id inside a text
        first_space = getattr(tok, "first_space", None)  # SentencePiece's dummy prefix
        self.space_first, self.strips_first = first_space() if first_space else (None, False)
        unknown = getattr(tok, "sp", None)
        self.unknown = int(unknown.unk_id()) if unknown is not None else -1

    @classmethod
    def for_tokenizer(cls, tok: object) -> WordSplicer | None:
        """A splicer for `tok` when its encoding splits exactly at word starts, else None."""
        if isinstance(tok, SentencePieceTokenizer) and splits_at_word_starts(tok):
            return cls(tok, tok.encode_chat, _NOT_SPACE)
        if isinstance(tok, ByteLevelTokenizer):
            split = byte_level_split(tok.files.data)
            if split is not None and restartable(split[0]) and _splits_at_word_starts(split[0]):
                return cls(tok, tok.encode, _VISIBLE_ASCII, nfc=split[1])
        return None

    def _starts(self, ids: np.ndarray, n_bytes: int) -> np.ndarray | None:
        """Byte offset in the text where each id's text starts, or None when the ids'
        bytes do not add up to the text's (an unknown piece: the text is not the ids')."""
        ids = np.asarray(ids, np.int64)
        if ids.size == 0:
            return ids if n_bytes == 0 else None  # an empty document: every span is empty
        if self.unknown >= 0 and bool((ids == self.unknown).any()):
            return None
        sizes = self.piece_bytes[ids]
        if self.strips_first and self.space_first[ids[0]]:
            sizes = sizes.copy()
            sizes[0] -= 1  # the dummy prefix `▁` is not in the text
        ends = np.cumsum(sizes)
        if int(ends[-1]) != n_bytes:
            return None
        return ends - sizes

    def ids(self, layout: Sequence[int | Span], text: str, doc_ids: np.ndarray) -> list[int] | None:
        """The ids of `layout` (markers and spans of `text`, lemur/tokenizer/fim.py), as
        `encode_parts` would give them. `text` must be what the ids decode to and `doc_ids`
        its encoding (the FIM stage decodes a document's ids); None when they do not line up
        (the caller then encodes the parts)."""
        if self.nfc and not unicodedata.is_normalized("NFC", text):
            return None  # the model would encode another text than this one's characters
        data = text.encode("utf-8")
        starts = self._starts(doc_ids, len(data))
        if starts is None:
            return None
        byte_at = _CharToByte(text)
        out: list[int] = []
        for part in layout:
            if isinstance(part, Span):
                x, y = byte_at(part.start), byte_at(part.end)
                got = self._span(data, starts, doc_ids, x, y, part.leading)
                if got is None:
                    return None
                out += got
            else:
                out.append(int(part))
        return out

    def _span(
        self,
        data: bytes,
        starts: np.ndarray,
        doc_ids: np.ndarray,
        x: int,
        y: int,
        leading: bool,
    ) -> list[int] | None:
        """Ids of the text in bytes `x:y` (a leading span starts at 0): the document's ids
        between the first and the last word start inside it, the edges encoded alone."""
        n = len(data)
        if x == y:
            return []
        if leading and x != 0:
            raise ValueError("a leading span starts the document")
        # From the document's start (leading) or to its end, one side is the document's own.
        p = 0 if leading else _word_start_at_or_after(data, max(x, 1), y, self.before)
        q = n if y == n else _word_start_at_or_before(data, y, p, self.before)
        if p == q or (not leading and p == y):  # no word start inside: encode it whole
            return self._encode(data[x:y], leading)
        k_p, k_q = self._index(starts, p, n), self._index(starts, q, n)
        if k_p is None or k_q is None:
            return None  # no id starts at a word start: the ids are not the text's
        head = [] if leading else self._encode(data[x:p], False)
        tail = self._encode(data[q:y], False)
        return head + doc_ids[k_p:k_q].tolist() + tail

    def _encode(self, data: bytes, leading: bool) -> list[int]:
        """Ids of `data`'s text encoded alone (with the dummy prefix when `leading`)."""
        if not data:
            return []
        text = data.decode("utf-8")
        return list(self.leading(text) if leading else self.continuing(text))

    @staticmethod
    def _index(starts: np.ndarray, at: int, n: int) -> int | None:
        """The index of the id whose text starts at byte `at` (`len(starts)` at the end, 0
        at the start), None when no id starts there."""
        if at == 0:
            return 0
        if at == n:
            return len(starts)
        k = int(np.searchsorted(starts, at))
        return k if k < len(starts) and int(starts[k]) == at else None


class _CharToByte:
    """Byte offset of a character index of one text (ASCII texts: the same number)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.ascii = text.isascii()

    def __call__(self, i: int) -> int:
        return i if self.ascii else len(self.text[:i].encode("utf-8"))

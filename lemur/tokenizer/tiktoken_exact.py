"""Encoding a byte-level BPE `tokenizer.json` with tiktoken, only where the ids are exact.

tiktoken encodes 5x faster than `tokenizers` (docs/benchmarks.md) but knows only one
algorithm: split by a regex, then merge byte pairs by rank, a whole piece found in the
vocabulary taken as one id. A tokenizer.json is that algorithm when every check of
`tiktoken_plan` holds (Llama-3, Qwen2.5, GPT-4-style and tekken-derived files do); else
`plan.reason` says why not and the caller encodes with `tokenizers`. Nothing here is in
either library: tiktoken has no tokenizer.json reader, and `tokenizers` no tiktoken engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# GPT-2's pre-tokenizer pattern: what a ByteLevel pre-tokenizer with use_regex applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Zero-width constructs other than `\s+(?!\S)`: with one of them in a pattern, encoding a
# stretch of a text alone could split it differently than the whole text (see
# `restartable`).
_CONTEXT = re.compile(r"\(\?[=!<]|\\[bBAzZG]|(?<![\\\[])\^|(?<!\\)\$")


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level vocabularies are spelled in.

    Written out here because neither tiktoken nor `tokenizers` exposes the mapping itself.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return chars


BYTE_CHARS = byte_level_alphabet()
CHAR_BYTES = {c: b for b, c in BYTE_CHARS.items()}
# str.translate table from latin-1 characters (one per byte) to the byte-level spelling.
TO_BYTE_LEVEL = {b: BYTE_CHARS[b] for b in range(256)}
# ... and back; characters below 256 that are not in the alphabet become one that latin-1
# cannot encode, so `token_to_bytes` refuses them.
FROM_BYTE_LEVEL = {
    **{b: "\uffff" for b in range(256)},
    **{ord(c): chr(b) for c, b in CHAR_BYTES.items()},
}


def token_to_bytes(token: str) -> bytes | None:
    """The bytes a byte-level vocabulary entry stands for (None if it is not byte-level)."""
    try:
        return token.translate(FROM_BYTE_LEVEL).encode("latin-1")
    except UnicodeEncodeError:
        return None


@dataclass
class TiktokenPlan:
    """The verdict on one tokenizer.json: tiktoken's inputs when exact, else the reason."""

    reason: str = ""  # empty: tiktoken gives the reference's ids
    pattern: str = ""
    nfc: bool = False  # the tokenizer normalizes to NFC first
    ranks: dict[bytes, int] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """Whether tiktoken may encode for this tokenizer."""
        return not self.reason


def _pattern(pre: Any) -> tuple[str | None, str]:
    """The split regex of a byte-level pre-tokenizer, or (None, why it is not one)."""
    if not isinstance(pre, dict):
        return None, "no pre-tokenizer"
    if pre.get("type") == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            return None, "ByteLevel pre-tokenizer with a prefix space or without its regex"
        return GPT2_PATTERN, ""
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None, f"pre-tokenizer {pre.get('type')} is not Split + ByteLevel"
    split, level = steps
    ok_split = (
        split.get("type") == "Split"
        and split.get("behavior") == "Isolated"
        and not split.get("invert")
        and isinstance(split.get("pattern"), dict)
        and "Regex" in split["pattern"]
    )
    ok_level = (
        level.get("type") == "ByteLevel"
        and not level.get("add_prefix_space")
        and not level.get("use_regex", True)
    )
    if not (ok_split and ok_level):
        return None, "pre-tokenizer is not an isolating regex Split then ByteLevel"
    return split["pattern"]["Regex"], ""


def _normalizer(norm: Any) -> tuple[bool, str]:
    """(NFC or not, why not supported) for a tokenizer.json normalizer."""
    if norm is None or (norm.get("type") == "Sequence" and not norm.get("normalizers")):
        return False, ""
    if norm.get("type") == "NFC":
        return True, ""
    return False, f"normalizer {norm.get('type')}"


def _model_problem(model: dict[str, Any]) -> str:
    if model.get("type") != "BPE":
        return f"model {model.get('type')} is not BPE"
    if model.get("dropout") or model.get("byte_fallback"):
        return "BPE with dropout or byte fallback"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE with subword prefixes or suffixes"
    return ""


def _merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    """Merges as pairs, whichever of the two spellings (`"a b"` or `["a", "b"]`) is used."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in merges]


def _ranks(vocab: dict[str, int]) -> tuple[dict[bytes, int], str]:
    ranks: dict[bytes, int] = {}
    for token, i in vocab.items():
        b = token_to_bytes(token)
        if b is None:
            return {}, f"vocabulary entry {token!r} is not byte-level"
        ranks[b] = int(i)
    missing = sum(bytes([b]) not in ranks for b in range(256))
    return ranks, (f"{missing} single bytes missing from the vocabulary" if missing else "")


def _merges_problem(vocab: dict[str, int], merges: list[Any]) -> str:
    """Why BPE by these merges differs from BPE by rank (tiktoken), or "".

    Equal when (1) every merge makes a vocabulary token, (2) merges come in the order of
    the ids they make (tiktoken's priority is the id), and (3) every way to write a token
    as two tokens is a merge (tiktoken merges any adjacent pair that forms a token).
    Byte-level spellings have one character per byte, so this works on the strings.
    """
    pairs = _merge_pairs(merges)
    listed = set(pairs)
    last = -1
    for a, b in pairs:
        made = vocab.get(a + b)
        if made is None:
            return f"merge {a!r} + {b!r} makes no token"
        if made < last:
            return "merges are not in the order of the ids they make"
        last = made
    for token in vocab:
        for cut in range(1, len(token)):
            x, y = token[:cut], token[cut:]
            if x in vocab and y in vocab and (x, y) not in listed:
                return f"{token!r} can be formed from {x!r} + {y!r}, which is no merge"
    return ""


def _unreachable(ranks: dict[bytes, int], tokenize: Any) -> list[bytes]:
    """Tokens BPE never outputs (its merges end elsewhere even on the token's own bytes).

    Without `ignore_merges` the reference never takes a whole piece as one id by lookup,
    as tiktoken does; dropping such tokens from tiktoken's ranks makes the two agree.
    """
    out = []
    for token, i in ranks.items():
        if len(token) > 1:
            got = tokenize(token.decode("latin-1").translate(TO_BYTE_LEVEL))
            if len(got) != 1 or got[0].id != i:
                out.append(token)
    return out


def _special_piece(data: dict[str, Any], pattern: str) -> str:
    """A special token of the model vocabulary that could be a whole regex piece, or "".

    Such tokens are left out of tiktoken's ranks (the reference never merges into them),
    which is exact only if no piece can equal one (the reference would look it up whole).
    """
    import regex

    split = regex.compile(pattern)
    vocab = data["model"].get("vocab", {})
    for t in data.get("added_tokens", []):
        if t["content"] in vocab and split.fullmatch(t["content"]):
            return f"special token {t['content']!r} can be a whole piece"
    return ""


def byte_level_split(data: dict[str, Any]) -> tuple[str, bool] | None:
    """(split regex, NFC first) of a tokenizer.json that is byte-level BPE over the pieces of
    one regex (what tiktoken's algorithm is, whether or not its ids are exact), else None."""
    pattern, why = _pattern(data.get("pre_tokenizer"))
    nfc, norm_problem = _normalizer(data.get("normalizer"))
    if pattern is None or why or norm_problem or _model_problem(data["model"]):
        return None
    return pattern, nfc


def tiktoken_plan(data: dict[str, Any], tokenize: Any) -> TiktokenPlan:
    """Whether tiktoken reproduces this tokenizer.json's ids exactly, with its inputs.

    `tokenize` is the reference model's `tokenize` (of a byte-level spelled piece), used
    only to find tokens that BPE cannot reach.
    """
    model = data["model"]
    problem = _model_problem(model)
    pattern, why = _pattern(data.get("pre_tokenizer"))
    nfc, norm_problem = _normalizer(data.get("normalizer"))
    problem = problem or why or norm_problem
    # Added tokens, special or not, are never matched inside text: the reference is loaded
    # with every one special (bytelevel.py) and special-token parsing off.
    added = data.get("added_tokens", [])
    if problem:  # a Unigram's vocabulary is a list of [piece, score]: not read at all
        return TiktokenPlan(reason=problem)
    special_ids = {t["id"] for t in added}
    vocab = {k: v for k, v in model.get("vocab", {}).items() if v not in special_ids}
    ranks: dict[bytes, int] = {}
    problem = _special_piece(data, str(pattern))
    if not problem:
        ranks, problem = _ranks(vocab)
    problem = problem or (_merges_problem(vocab, model.get("merges", [])) if ranks else "")
    if problem:
        return TiktokenPlan(reason=problem)
    if not model.get("ignore_merges"):
        for token in _unreachable(ranks, tokenize):
            del ranks[token]
    return TiktokenPlan(pattern=str(pattern), nfc=nfc, ranks=ranks)


def restartable(pattern: str) -> bool:
    """Whether a stretch of a text, cut at the right piece boundaries, splits alone as in it.

    True when the only zero-width construct is `\\s+(?!\\S)` (what every byte-level pattern
    we know uses). Then a stretch that starts at a piece boundary and ends at one right
    after a non-space character (`long_pieces.stretch_cut`) yields the same pieces: no
    `\\s+` can end there, so end of text and the text that followed look alike to the
    pattern. A boundary right after a space is not enough: `" \\t"` before `"."` is two
    pieces, at the end of a text one.
    """
    return not _CONTEXT.search(pattern.replace(r"\s+(?!\S)", ""))

"""Natural-language quality filters: Gopher quality and repetition, C4 and FineWeb rules.

At default settings every rule decides exactly as datatrove's filter of the same name
(GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter;
datatrove 0.10), with the same reason strings and, for C4, the same line removal, given the
same word and sentence splitters (tests/test_data_filter_conformance.py checks this on real
documents). Those follow the papers: Gopher (Rae et al. 2021, Table A1), C4 (Raffel et al.
2020; datatrove's defaults, which docs/filters.md compares with the paper's) and FineWeb
(Penedo et al. 2024). Two things differ by design:
- words are whitespace-separated tokens (`str.split`); datatrove splits with spaCy for
  English, which makes every punctuation mark a word (and so rejects most technical prose
  for its alphabetic-word ratio) and needs spaCy installed;
- C4 counts sentences per kept line with a small punctuation rule (`sentence_spans`)
  instead of spaCy's or NLTK's sentence splitter.
Repeated n-grams are found by ranking word-id pairs with numpy rather than joining strings
(datatrove's repetition filter was 96% of a Gopher chain's time on this machine), each n
only where the n - 1 first words repeat.
Each behaviour that departs from the reference is a named option, off by default
(docs/filters.md lists them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import compress, repeat
from operator import methodcaller, not_
from typing import Any

import numpy as np
from datatrove.data import Document
from datatrove.utils.text import PUNCTUATION_SET, TERMINAL_PUNCTUATION

from lemur.data.filter.base import DomainFilter
from lemur.data.recipe.filters import FineWebConfig
from lemur.data.samples.records import Dropped

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
GOPHER_BULLETS = ("•", "-")
# FineWeb's terminal punctuation: `.`, `!`, `?` and their counterparts in other scripts.
FINEWEB_STOP_CHARS = tuple(sorted(TERMINAL_PUNCTUATION))
C4_END_PUNCT = (".", "?", "!", '"', "'")
C4_POLICY = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
# A word every C4_POLICY phrase holds one of: a line without any holds no phrase.
C4_POLICY_KEYS = ("cookie", "policy", "terms of use")
_C4_CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")
# A word is a "symbol" when every character is punctuation: stripping them all leaves "".
_PUNCT = "".join(sorted(PUNCTUATION_SET))
# `\n\n+` and `\n\n*` are `\n{2,}` and `\n+`, spelled so that `re` searches for the literal
# prefix (about 4x faster)
_PARAGRAPHS = re.compile(r"\n\n+")
_LINES = re.compile(r"\n\n*")
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’»)\]]*(?=\s|$)|[。！？]+")


def _has_policy(lower: str) -> bool:
    """Whether a lowercased line holds a C4 policy phrase."""
    # each phrase holds one of C4_POLICY_KEYS (a test checks): look for the rest only then
    if not any(k in lower for k in C4_POLICY_KEYS):
        return False
    return any(p in lower for p in C4_POLICY)


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence: runs ending in `. ! ? …` before a space, and the rest."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    if text[start:].strip():
        spans.append((start, len(text)))
    return spans


def count_sentences(text: str) -> int:
    """Sentences in a line, as datatrove counts pieces: at least one, even for a blank line."""
    return max(1, len(sentence_spans(text)))


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(number of repeated items, characters in repeated items), first occurrences excluded."""
    # every distinct item has exactly one first occurrence: the rest are the repeats
    distinct = set(items)
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))


class TextRule(DomainFilter):
    """A filter over the text domain with its recipe section (`filters.text.<name>`)."""

    def __init__(self, config: Any, domains: tuple[str, ...] = ("text",)) -> None:
        super().__init__(domains)
        self.config = config


class GopherQualityFilter(TextRule):
    """Gopher's document quality rules; reasons `gopher_*` as in datatrove."""

    name = "🥇 gopher quality"

    def check(self, doc: Document) -> bool | tuple[bool, str]:
        """Apply the rules in datatrove's order; the first failing rule names the reason."""
        config, text = self.config, doc.text
        words = text.split()
        # length rules ignore words made only of punctuation, as datatrove does (stripping
        # their punctuation leaves ""); C-level maps, no Python call per word
        symbols = list(compress(words, map(not_, map(str.strip, words, repeat(_PUNCT)))))
        n = len(words) - len(symbols)
        if config.min_doc_words and n < config.min_doc_words:
            return Dropped("gopher_short_doc", "words", n, "<", config.min_doc_words)
        if config.max_doc_words and n > config.max_doc_words:
            return Dropped("gopher_long_doc", "words", n, ">", config.max_doc_words)
        if n:
            avg = (sum(map(len, words)) - sum(map(len, symbols))) / n
            if config.min_avg_word_length and avg < config.min_avg_word_length:
                low = config.min_avg_word_length
                return Dropped("gopher_below_avg_threshold", "mean_word_length", avg, "<", low)
            if config.max_avg_word_length and avg > config.max_avg_word_length:
                high = config.max_avg_word_length
                return Dropped("gopher_above_avg_threshold", "mean_word_length", avg, ">", high)
        if words and config.max_symbol_word_ratio is not None:
            limit = config.max_symbol_word_ratio
            hashes = text.count("#") / len(words)
            if hashes > limit:
                return Dropped("gopher_too_many_hashes", "hash_word_ratio", hashes, ">", limit)
            ellipsis = (text.count("...") + text.count("…")) / len(words)
            if ellipsis > limit:
                reason = "gopher_too_many_ellipsis"
                return Dropped(reason, "ellipsis_word_ratio", ellipsis, ">", limit)
        verdict = self._line_rules(text)
        if verdict:
            return verdict
        if words and config.min_alpha_words_ratio is not None:
            alpha = sum(any(map(str.isalpha, w)) for w in words) / len(words)
            if alpha < config.min_alpha_words_ratio:
                low = config.min_alpha_words_ratio
                return Dropped("gopher_below_alpha_threshold", "alpha_fraction", alpha, "<", low)
        if config.min_stop_words:
            found = {w.lower() for w in words} if config.stop_words_ignore_case else set(words)
            stops = len(STOP_WORDS.intersection(found))
            if stops < config.min_stop_words:
                least = config.min_stop_words
                return Dropped("gopher_enough_stop_words", "stop_words", stops, "<", least)
        return True

    def _line_rules(self, text: str) -> Dropped | None:
        """The bullet and end-ellipsis rules over lines (blank ones too, unless skipped)."""
        config = self.config
        lines = text.splitlines()
        if config.skip_blank_lines:
            lines = [line for line in lines if line.strip()]
        if not lines:
            return None
        if config.max_bullet_lines_ratio is not None:
            marks = (
                tuple(config.bullet_markers)
                if config.bullet_markers is not None
                else GOPHER_BULLETS
            )
            bullets = sum(line.lstrip().startswith(marks) for line in lines) / len(lines)
            if bullets > config.max_bullet_lines_ratio:
                limit = config.max_bullet_lines_ratio
                return Dropped("gopher_too_many_bullets", "bullet_lines", bullets, ">", limit)
        if config.max_ellipsis_lines_ratio is not None:
            ell = sum(line.rstrip().endswith(("...", "…")) for line in lines) / len(lines)
            if ell > config.max_ellipsis_lines_ratio:
                limit = config.max_ellipsis_lines_ratio
                reason = "gopher_too_many_end_ellipsis"
                return Dropped(reason, "end_ellipsis_lines", ell, ">", limit)
        return None


def repeated_ngrams(
    ids: np.ndarray, max_n: int
) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """For n = 2 .. max_n: (n, positions, keys, counts) of the n-grams that occur more than once.

    `ids` are exact word ids (0 .. V - 1). An n-gram can repeat only where its first n - 1
    words do, so each level looks only at the previous level's repeated positions and tells
    n-grams apart exactly, by (class of the first n - 1 words, last word id) pairs ranked with
    `np.unique`: `keys[k]` names the n-gram at `positions[k]`, `counts[k]` how often it occurs.
    """
    vocab = int(ids.max()) + 1 if len(ids) else 1
    counts = np.bincount(ids, minlength=vocab)
    positions = np.flatnonzero(counts[ids] > 1)
    keys = ids[positions]
    for n in range(2, max_n + 1):
        inside = positions <= len(ids) - n
        positions, keys = positions[inside], keys[inside]
        if len(positions):
            pairs = keys * vocab + ids[positions + n - 1]
            _, keys, counts = np.unique(pairs, return_inverse=True, return_counts=True)
            counts = counts[keys]
            repeated = counts > 1
            positions, keys, counts = positions[repeated], keys[repeated], counts[repeated]
        else:
            counts = positions  # none repeats: empty, as are positions and keys
        yield n, positions, keys, counts


def _top_ngram_chars(
    positions: np.ndarray, counts: np.ndarray, lengths: np.ndarray, n: int, min_count: int
) -> int:
    """Characters of the most common n-gram times its count (ties: the earliest), or 0.

    `positions` and `counts` are the repeated n-grams; with none, every n-gram occurs once
    and the earliest is the first.
    """
    top = int(counts.max()) if len(counts) else 1
    if top < min_count:
        return 0
    start = int(positions[counts == top].min()) if len(counts) else 0
    # the n-gram as datatrove joins it: its words and the n - 1 spaces between them
    return (int(lengths[start : start + n].sum()) + n - 1) * top


def _greedy_dup_chars(positions: np.ndarray, keys: np.ndarray, cum: np.ndarray, n: int) -> int:
    """Characters in repeated n-grams, scanning left to right and skipping past each repeat.

    datatrove's walk: an n-gram seen earlier at a visited position counts its characters
    and the scan jumps n words ahead, else it is remembered and the scan moves one word.
    Only n-grams occurring more than once can repeat, so the walk visits just those
    (`positions`, ascending, with their `keys`).
    """
    if not len(positions):
        return 0
    seen: set[int] = set()
    chars = idx = 0
    for pos, key in zip(positions.tolist(), keys.tolist(), strict=True):
        if pos < idx:
            continue  # skipped over by an earlier repeat
        if key in seen:
            chars += int(cum[pos + n] - cum[pos])
            idx = pos + n
        else:
            seen.add(key)
            idx = pos + 1
    return chars


class GopherRepetitionFilter(TextRule):
    """Gopher's repetition rules, vectorized; reasons as in datatrove (`dup_line_frac`, ...)."""

    name = "👯 gopher repetition"

    def check(self, doc: Document) -> bool | tuple[bool, str]:
        """Apply paragraph, line, top n-gram and duplicated n-gram rules in that order."""
        config, text = self.config, doc.text
        if not text:
            return Dropped("empty", "chars", 0, "==", 0)
        verdict = self._paragraph_and_line_rules(text)
        if verdict:
            return verdict
        words = text.split()
        if not words:
            return True
        # exact ids in order of first occurrence, by C-level maps (no Python call per word)
        vocab = dict(zip(dict.fromkeys(words), range(len(words)), strict=False))
        ids = np.fromiter(map(vocab.__getitem__, words), np.int64, len(words))
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        cum = np.concatenate(([0], np.cumsum(lengths)))
        for n, positions, keys, counts in repeated_ngrams(ids, 10):
            if len(words) < n:
                break  # no n-grams, nor longer ones
            if n <= 4:
                limit = getattr(config, f"top_{n}_gram")
                if limit is None:
                    continue
                min_count = config.top_ngram_min_count
                chars = _top_ngram_chars(positions, counts, lengths, n, min_count)
                if chars / len(text) > limit:
                    share = chars / len(text)
                    return Dropped(f"top_{n}_gram", f"top_{n}_gram_char_frac", share, ">", limit)
            elif n >= 5:
                limit = getattr(config, f"dup_{n}_gram")
                if limit is None:
                    continue
                share = _greedy_dup_chars(positions, keys, cum, n) / len(text)
                if share > limit:
                    measure = f"dup_{n}_gram_char_frac"
                    return Dropped(f"duplicated_{n}_n_grams", measure, share, ">", limit)
        return True

    def _paragraph_and_line_rules(self, text: str) -> Dropped | None:
        """Duplicate paragraph and line fractions (by count and by characters)."""
        config, size = self.config, len(text)
        for unit, pieces in (
            ("para", _PARAGRAPHS.split(text.strip())),
            ("line", _LINES.split(text)),
        ):
            n_dup, chars = _duplicates(pieces)
            for name, value in (
                (f"dup_{unit}_frac", n_dup / len(pieces)),
                (f"dup_{unit}_char_frac", chars / size),
            ):
                limit = getattr(config, name)
                if limit is not None and value > limit:
                    return Dropped(name, name, value, ">", limit)
        return None


class C4Filter(TextRule):
    """C4 rules: drop lines that fail the line rules, then drop documents with too few sentences."""

    name = "⛰ c4"

    def check(self, doc: Document) -> bool | tuple[bool, str]:
        """Apply C4's rules line by line; keep the surviving lines (reasons as datatrove's)."""
        config = self.config
        kept: list[str] = []
        sentences = 0
        least = config.min_sentences
        for line in self._candidates(doc.text):
            line = self._clean_line(line)
            if line is None:
                continue
            lower = line.lower()
            if config.lorem_ipsum and "lorem ipsum" in lower:
                return Dropped("lorem_ipsum", "phrase", "lorem ipsum", "in", "a line")
            if config.javascript and "javascript" in lower:
                continue
            if config.curly_bracket and "{" in line:
                return Dropped("curly_bracket", "character", "{", "in", "a kept line")
            if config.policy and _has_policy(lower):
                continue
            # the count only matters while below the minimum (a drop reports it)
            if least and sentences < least:
                sentences += count_sentences(line)
            kept.append(line)
        if least and sentences < least:
            return Dropped("too_few_sentences", "sentences", sentences, "<", least)
        if config.remove_lines:
            doc.text = "\n".join(kept).strip()
        return True

    def _candidates(self, text: str) -> list[str]:
        """The stripped lines, less those the end-mark rule drops whatever citations go.

        Removing citations (each ending in `]`) can change a line's last character only if
        it ends in `]`, so a line ending in neither an end mark nor `]` can't be kept.
        """
        lines = map(str.strip, text.splitlines())
        if not self.config.terminal_punct:
            return list(lines)
        ends = C4_END_PUNCT + ("]",) if self.config.remove_citations else C4_END_PUNCT
        return list(filter(methodcaller("endswith", ends), lines))

    def _clean_line(self, line: str) -> str | None:
        """The line without citations, or None if a long word, no end mark or few words."""
        config = self.config
        # datatrove counts the words before citations are removed
        original = line
        if config.remove_citations and "[" in line:  # every citation starts with `[`
            line = _C4_CITATION.sub("", line)
        if config.terminal_punct and (not line.endswith(C4_END_PUNCT) or line.endswith("...")):
            return None
        least = config.min_words_per_line
        # split at most least - 1 times: fewer than `least` pieces iff fewer words
        if least is not None and least > 0 and len(original.split(None, least - 1)) < least:
            return None
        longest = config.max_word_length
        # no word is longer than its line, so only a longer line needs its words looked at
        if longest is not None and len(original) > longest:
            if any(len(w) > longest for w in original.split()):
                return None
        return line


class FineWebFilter(TextRule):
    """FineWeb's line rules; reasons as in datatrove (`line_punct_ratio`, `list_ratio`, ...)."""

    name = "🍷 fineweb"

    def __init__(self, config: FineWebConfig, domains: tuple[str, ...] = ("text",)) -> None:
        super().__init__(config, domains)
        stop = config.stop_chars
        self.stop_chars = tuple(stop) if stop is not None else FINEWEB_STOP_CHARS

    def check(self, doc: Document) -> bool | tuple[bool, str]:
        """Apply the punctuation, short-line, duplicate-line and newline rules."""
        config, text = self.config, doc.text
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return Dropped("empty", "non_blank_lines", 0, "==", 0)
        if config.strip_lines:
            lines = [line.strip() for line in lines]
        if config.line_punct_thr is not None:
            ratio = sum(line.endswith(self.stop_chars) for line in lines) / len(lines)
            if ratio < config.line_punct_thr and not (
                ratio == 0 and config.line_punct_exclude_zero
            ):
                least = config.line_punct_thr
                return Dropped("line_punct_ratio", "line_punct_ratio", ratio, "<", least)
        if config.short_line_thr is not None:
            short = sum(len(line) <= config.short_line_length for line in lines) / len(lines)
            if short > config.short_line_thr:
                limit = config.short_line_thr
                return Dropped("short_line_ratio", "short_line_ratio", short, ">", limit)
        if config.char_duplicates_ratio is not None:
            _, chars = _duplicates(lines)
            dup = chars / len(text.replace("\n", ""))
            if dup > config.char_duplicates_ratio:
                limit = config.char_duplicates_ratio
                return Dropped("char_dup_ratio", "char_dup_ratio", dup, ">", limit)
        if config.new_line_ratio is not None:
            per_word = text.count("\n") / len(text.split())
            if per_word > config.new_line_ratio:
                limit = config.new_line_ratio
                return Dropped("list_ratio", "newlines_per_word", per_word, ">", limit)
        return True

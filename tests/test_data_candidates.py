"""The secret prefilter's numpy and joined-regex shortcuts give what a per-token scan gives."""

from __future__ import annotations

import random
import re

import numpy as np
from conftest import real_python_files

from lemur.data.filter.candidates import (
    KNOWN_KEYS,
    candidate_lines,
    is_quoted,
    line_bounds,
    long_tokens,
    names_credential,
    numbered_lines,
)
from lemur.data.filter.code import true_runs

TOKEN = re.compile(r"[A-Za-z0-9+/=_.\-]{16,}")


def reference_tokens(text: str) -> list[tuple[int, int, bool]]:
    """Every long token with a letter, by regex and a check per character."""
    return [
        (m.start(), m.end(), any(c.isdigit() for c in m.group()))
        for m in TOKEN.finditer(text)
        if any(c.isalpha() for c in m.group())
    ]


def reference_lines(text: str) -> list[tuple[int, int, str]]:
    """The candidate lines, `KNOWN_KEYS` searched in every token."""
    lines: dict[int, str] = {}
    for start, end, has_digit in reference_tokens(text):
        known = KNOWN_KEYS.search(text[start:end]) is not None
        if not known and not has_digit:
            continue
        a, b = line_bounds(text, start, end)
        if a in lines:
            continue
        if not known and not is_quoted(text, start, end) and not names_credential(text[a:b]):
            continue
        lines[a] = text[a:b]
    return numbered_lines(text, lines)


def fuzz_texts(n: int, seed: int = 5) -> list[str]:
    """Texts of key shapes, near misses, identifiers, non-ASCII and lone surrogates."""
    rng = random.Random(seed)
    pieces = ["AKIA", "ASIA", "A3TX", "AKC", "ghp_", "gho_", "github_pat_", "xoxb-", "xox1-"]
    pieces += ["hooks.slack", "sk_live_", "rk_live_", "SG.", "eyJ", "AccountKey=", "_authToken"]
    pieces += ["-us1", "-usx", "AC", "SK", "M", "N", "O", ".", "-", "_", "=", "+", "/"]
    pieces += ["abcdefgh" * 2, "0123456789abcdef" * 2, "Zm9vYmFy", "x1", "é", "\u2003", "\ud800"]
    pieces += [" ", "\n", "\t", '"', "'", "key=", "token: ", "secret ", "(", ","]
    return ["".join(rng.choices(pieces, k=rng.randint(0, 200))) for _ in range(n)]


def test_long_tokens_equal_a_regex_scan():
    texts = [p.read_text() for p in real_python_files(20)] + fuzz_texts(1500)
    texts += ["", "a" * 16, "é" + "a1" * 8, "a1" * 8 + "\ud800"]
    for text in texts:
        assert long_tokens(text) == reference_tokens(text), text[:80]


def test_candidate_lines_equal_a_per_token_scan():
    texts = [p.read_text() for p in real_python_files(20)] + fuzz_texts(3000, seed=6)
    # Each shape `KNOWN_KEYS` knows, whole, as its own token and inside a longer one.
    shapes = [
        "AKIAABCDEFGHIJKLMNOP",
        "ghp_" + "a" * 36,
        "xoxb-abcdefghijklmnop",
        "abcdefghijklmnopqrstuvwxyz012345-us12",
        "AC" + "abcdefghij" * 4,
        "SK" + "q" * 32,
        "M" + "w" * 24 + "." + "abcdef" + ".xyzxyz",
        "Nabcdefghijklmnopqrstuvwx.abcdef.",
        "eyJhbGciOiJIUzI1NiJ9abcdef",
    ]
    texts += [f"x = {s}\ny = pre_{s}_post\nz = '{s}'" for s in shapes]
    found = 0
    for text in texts:
        want = reference_lines(text)
        assert candidate_lines(text) == want, text[:80]
        found += bool(want)
    assert found >= 500


def test_true_runs():
    rng = random.Random(1)
    for _ in range(300):
        member = np.array([rng.random() < 0.6 for _ in range(rng.randint(0, 40))], bool)
        s = "".join("1" if m else "0" for m in member)
        want = [(m.start(), m.end()) for m in re.finditer("1+", s)]
        starts, ends = true_runs(member)
        assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == want

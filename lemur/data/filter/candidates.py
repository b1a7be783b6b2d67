"""The cheap prefilter of secret detection: which lines of a document may hold a key.

A candidate is a long token (16+ characters of `[A-Za-z0-9+/=_.-]` with a letter) that
- has a known key shape (AWS `AKIA`..., GitHub `ghp_`..., Slack `xox?-`, Stripe
  `sk_live_`, SendGrid `SG.`, JWT `eyJ`, Azure `AccountKey=`, Artifactory `AKC`, npm
  `_authToken`, Twilio `AC`/`SK` + 32, Mailchimp `-us1`, Discord), or
- has a digit too, and is quoted (what detect-secrets' entropy plugins read) or sits on a
  line that names a credential (`key`, `secret`, `token`, `password`, `aws`, ...: what its
  keyword-anchored detectors need).
Long identifiers with digits (`_mm512_mask_cvtepi32_storeu_epi8`) are most of the long
tokens of C code; they pass only on a credential line. For ASCII text (most code) tokens
are found with numpy over the bytes; other text takes a regex and a Python check per token.
"""

from __future__ import annotations

import re
import string

import numpy as np

MIN_TOKEN = 16
_TOKEN_CHARS = string.ascii_letters + string.digits + "+/=_.-"
_IS_TOKEN = np.zeros(256, bool)
_IS_TOKEN[np.frombuffer(_TOKEN_CHARS.encode(), np.uint8)] = True
_IS_DIGIT = np.zeros(256, bool)
_IS_DIGIT[np.frombuffer(string.digits.encode(), np.uint8)] = True
_IS_LETTER = np.zeros(256, bool)
_IS_LETTER[np.frombuffer(string.ascii_letters.encode(), np.uint8)] = True
_TOKEN = re.compile(rf"[A-Za-z0-9+/=_.\-]{{{MIN_TOKEN},}}")
_KNOWN = re.compile(
    r"^A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9]|KC)|gh[pousr]_|github_pat_|xox[a-z]-|hooks\.slack|"
    r"[rs]k_live_|SG\.|eyJ|AccountKey=|_authToken|[a-z0-9]{32}-us\d|(?:AC|SK)[a-z0-9]{32}|"
    r"^[MNO][\w-]{23,25}\.[\w-]{6}\."
)
_CREDENTIAL = re.compile(r"key|secret|passw|pwd|token|auth|aws|ibm|iam|cred|cloudant|softlayer")


def names_credential(text: str) -> bool:
    """`text` names a credential (`key`, `secret`, `token`, `password`, `aws`, ...)."""
    return bool(_CREDENTIAL.search(text.lower()))


def long_tokens(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, has a digit) of every long token with a letter."""
    if not text.isascii():
        return [
            (m.start(), m.end(), any(c.isdigit() for c in m.group()))
            for m in _TOKEN.finditer(text)
            if any(c.isalpha() for c in m.group())
        ]
    b = np.frombuffer(text.encode("ascii"), np.uint8)
    edges = np.diff(_IS_TOKEN[b].astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    keep = ends - starts >= MIN_TOKEN
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return []
    # Whether each token has a digit, a letter: `or` over [start, end) and the gaps between
    # (the last index reduces to the end of the text, so an end there is left out).
    bounds = np.empty(2 * len(starts), np.intp)
    bounds[0::2], bounds[1::2] = starts, ends
    bounds = bounds[:-1] if bounds[-1] == len(b) else bounds
    digit = np.logical_or.reduceat(_IS_DIGIT[b], bounds)[0::2]
    keep = np.logical_or.reduceat(_IS_LETTER[b], bounds)[0::2]
    has_digit = digit[keep].tolist()
    return list(zip(starts[keep].tolist(), ends[keep].tolist(), has_digit, strict=True))


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    stop = text.find("\n", end)
    return text.rfind("\n", 0, start) + 1, len(text) if stop < 0 else stop


def _quoted(text: str, start: int, end: int) -> bool:
    """The token is a whole string literal: the same quote right before and right after."""
    return (
        0 < start and end < len(text) and text[start - 1] in "\"'" and text[end] == text[start - 1]
    )


def candidate_lines(text: str) -> list[tuple[int, int, str]]:
    """(1-based number, start offset, text) of each line with a candidate token, in order."""
    lines: dict[int, str] = {}  # line start -> line text
    credential: dict[int, bool] = {}
    for start, end, has_digit in long_tokens(text):
        known = _KNOWN.search(text[start:end]) is not None
        if not known and not has_digit:
            continue  # most long tokens of code (words and identifiers): no line look-up
        a, b = _line_bounds(text, start, end)
        if a in lines:
            continue
        if not known:
            if not _quoted(text, start, end):
                if a not in credential:
                    credential[a] = names_credential(text[a:b])
                if not credential[a]:
                    continue
        lines[a] = text[a:b]
    return _numbered(text, lines)


def _numbered(text: str, lines: dict[int, str]) -> list[tuple[int, int, str]]:
    """Fill in line numbers, counting newlines incrementally between sorted line starts."""
    out, number, pos = [], 1, 0
    for a in sorted(lines):
        number += text.count("\n", pos, a)
        pos = a
        out.append((number, a, lines[a]))
    return out

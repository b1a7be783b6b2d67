"""The cheap prefilter of secret detection: which lines of a document may hold a key.

A candidate is a long token (16+ characters of `[A-Za-z0-9+/=_.-]` with a letter) that
- has a known key shape (AWS `AKIA`..., GitHub `ghp_`..., Slack `xox?-`, Stripe
  `sk_live_`, SendGrid `SG.`, JWT `eyJ`, Azure `AccountKey=`, Artifactory `AKC`, npm
  `_authToken`, Twilio `AC`/`SK` + 32, Mailchimp `-us1`, Discord), or
- has a digit too, and is quoted (what detect-secrets' entropy plugins read) or sits on a
  line that names a credential (`key`, `secret`, `token`, `password`, `aws`, ...: what its
  keyword-anchored detectors need).
Long identifiers with digits (`_mm512_mask_cvtepi32_storeu_epi8`) are most of the long
tokens of C code; they pass only on a credential line. Tokens are found with numpy over the
text's bytes (a non-ASCII character, never part of a token, read as one `?`); whether a token
has a known shape is asked only of the few that one regex over all of a document's tokens
flags.
"""

from __future__ import annotations

import re
import string

import numpy as np

from lemur.data.filter.code import run_bounds, true_runs

MIN_TOKEN = 16
# Each byte's class: 0 not a token character, else a bit set of 1 (`+/=_.-`), 2 (a digit),
# 4 (a letter), so one pass (`bytes.translate`) classifies and one reduce per token tells
# whether it has a digit and a letter.
_BITS = (("+/=_.-", 1), (string.digits, 2), (string.ascii_letters, 4))
_CLASS = bytes(sum(bit for chars, bit in _BITS if chr(i) in chars) for i in range(256))
# Known credential key shapes (AWS, GitHub, Slack, Stripe, SendGrid, JWT, ...) in a token.
KNOWN_KEYS = re.compile(
    r"^A(?:KIA|SIA|BIA|CCA|3T[A-Z0-9]|KC)|gh[pousr]_|github_pat_|xox[a-z]-|hooks\.slack|"
    r"[rs]k_live_|SG\.|eyJ|AccountKey=|_authToken|[a-z0-9]{32}-us\d|(?:AC|SK)[a-z0-9]{32}|"
    r"^[MNO][\w-]{23,25}\.[\w-]{6}\."
)
# What every `KNOWN_KEYS` match in a token holds: in the tokens joined as `\n` + token, a
# `_KNOWN_HINT` match (`^` read as the newline before the token; `[a-z0-9]{32}-us\d` as its
# `-us\d`). Each branch starts with a literal, so `re` skips to the candidates fast. A prefilter
# only: `KNOWN_KEYS` decides on the tokens it flags.
_KNOWN_HINT = re.compile(
    r"\nA(?:KIA|SIA|BIA|CCA|3T[A-Z0-9]|KC)|\n[MNO][\w-]{23,25}\.[\w-]{6}\.|gh[pousr]_|github_pat_|"
    r"xox[a-z]-|hooks\.slack|rk_live_|sk_live_|SG\.|eyJ|AccountKey=|_authToken|-us\d|"
    r"AC[a-z0-9]{32}|SK[a-z0-9]{32}"
)
_CREDENTIAL = re.compile(r"key|secret|passw|pwd|token|auth|aws|ibm|iam|cred|cloudant|softlayer")


def names_credential(text: str) -> bool:
    """`text` names a credential (`key`, `secret`, `token`, `password`, `aws`, ...)."""
    return bool(_CREDENTIAL.search(text.lower()))


def _token_arrays(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, has a digit) of the long tokens with a letter, as numpy arrays."""
    # Token characters are ASCII: any other character encodes to one `?` (not a token
    # character), so byte offsets stay character offsets and one numpy pass serves all text.
    cls = np.frombuffer(text.encode("ascii", "replace").translate(_CLASS), np.uint8)
    starts, ends = true_runs(cls != 0)
    keep = ends - starts >= MIN_TOKEN
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return starts, ends, np.zeros(0, bool)
    # The classes in each token: `or` over each run.
    kinds = np.bitwise_or.reduceat(cls, run_bounds(starts, ends, len(cls)))[0::2]
    keep = (kinds & 4) != 0
    return starts[keep], ends[keep], (kinds[keep] & 2) != 0


def long_tokens(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, has a digit) of every long token with a letter."""
    starts, ends, digit = _token_arrays(text)
    return list(zip(starts.tolist(), ends.tolist(), digit.tolist(), strict=True))


def line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """(start, end) of the line holding text[start:end] (end before its newline)."""
    stop = text.find("\n", end)
    return text.rfind("\n", 0, start) + 1, len(text) if stop < 0 else stop


def is_quoted(text: str, start: int, end: int) -> bool:
    """The token is a whole string literal: the same quote right before and right after."""
    return (
        0 < start and end < len(text) and text[start - 1] in "\"'" and text[end] == text[start - 1]
    )


def _known(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which tokens `KNOWN_KEYS` finds a key shape in (searched in only the flagged ones)."""
    known = np.zeros(len(starts), bool)
    if len(starts) == 0:
        return known
    # All tokens, each after a newline (`\n` then the token: where `^` matched), searched
    # once: a regex per token cost ~1.6 us, ~0.9 s over the bench's 540k tokens.
    firsts = np.concatenate(([1], np.cumsum(ends - starts + 1)[:-1] + 1))
    spans = zip(starts.tolist(), ends.tolist(), strict=True)
    joined = "\n" + "\n".join([text[a:b] for a, b in spans])
    at = [m.start() + (joined[m.start()] == "\n") for m in _KNOWN_HINT.finditer(joined)]
    for i in set(np.searchsorted(firsts, at, side="right").tolist()):
        known[i - 1] = KNOWN_KEYS.search(text[starts[i - 1] : ends[i - 1]]) is not None
    return known


def candidate_lines(text: str) -> list[tuple[int, int, str]]:
    """(1-based number, start offset, text) of each line with a candidate token, in order."""
    lines: dict[int, str] = {}  # line start -> line text
    credential: dict[int, bool] = {}
    starts, ends, has_digit = _token_arrays(text)
    known = _known(text, starts, ends)
    # Only tokens with a digit or a known shape can make a line a candidate; the rest, most
    # long tokens of code (words and identifiers), are skipped without a line look-up.
    pick = has_digit | known
    for start, end, is_known in zip(
        starts[pick].tolist(), ends[pick].tolist(), known[pick].tolist(), strict=True
    ):
        a, b = line_bounds(text, start, end)
        if a in lines:
            continue
        if not is_known:
            if not is_quoted(text, start, end):
                if a not in credential:
                    credential[a] = names_credential(text[a:b])
                if not credential[a]:
                    continue
        lines[a] = text[a:b]
    return numbered_lines(text, lines)


def numbered_lines(text: str, lines: dict[int, str]) -> list[tuple[int, int, str]]:
    """Fill in line numbers, counting newlines incrementally between sorted line starts."""
    out, number, pos = [], 1, 0
    for a in sorted(lines):
        number += text.count("\n", pos, a)
        pos = a
        out.append((number, a, lines[a]))
    return out

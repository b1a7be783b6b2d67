"""Where a secret lies in its line: the whole value, never the part detect-secrets reports.

detect-secrets reports a value, not a span, and for a pattern with a capture group it reports
the group: `ghp` for a GitHub token (`(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}`); its JWT pattern
ends lazily before the signature. Replacing what it reports left `<KEY>_` and the token's 36
secret characters. `value_spans` runs the detector's own patterns over the line again and takes
the whole match (or the group, where the group is the value after a keyword, as in AWS's
`aws...key..."(40 characters)"`), carried on to the end of the token it starts.

Its entropy plugins read quoted strings only, so an unquoted `AWS_SECRET_ACCESS_KEY=...` (an
env file, `export`) or `secret_access_key: ...` (YAML) went unseen while the key id above it,
which has a fixed shape, was found. `QuotedView` quotes the value of such an assignment (a name
that names a credential, `=` or `:`, then one token to the end of the line) so that the same
plugins read it, and maps what they find back to the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from lemur.data.filter.candidates import names_credential

# The rest of a token after a match: word characters and `-`, single `.`, `+` or `/` between
# them (JWT parts, base64), then `=` padding. ASCII only: a secret is never other letters.
_TOKEN_TAIL = re.compile(r"(?:[\w\-]|[.+/](?=[\w\-]))*=*", re.ASCII)
# What a pattern may match around a value (Artifactory's `(?:\s|=|:|"|^)AKC...(?:\s|"|$)`).
_DELIMITERS = " \t=:\"'"
_ASSIGNMENT = re.compile(
    r"^\s*(?:export\s+|-\s+)?[\"']?(?P<name>[A-Za-z_][\w.\-]*)[\"']?\s*[:=]\s*"
    r"(?:(?:Bearer|Basic|token)\s+)?(?P<value>[A-Za-z0-9+/=_.\-]{16,})\s*$"
)


@cache
def _patterns() -> dict[str, tuple[re.Pattern[str], ...]]:
    """Each regex detector's patterns by the secret type it reports."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins.base import RegexBasedDetector

    return {
        kind: tuple(cls.denylist)
        for kind, cls in get_mapping_from_secret_type_to_class().items()
        if issubclass(cls, RegexBasedDetector)
    }


def _match_span(m: re.Match[str], value: str) -> tuple[int, int] | None:
    """The secret's span in a match that reported `value` (as `findall` does), or None."""
    for g in range(1, (m.re.groups or 0) + 1) if m.re.groups else (0,):
        if m.group(g) != value:
            continue
        # A group that starts the match is part of the secret (`ghp` of `ghp_...`); a later
        # one is the value after its keyword, which is not.
        return m.span() if m.start(g) == m.start() else m.span(g)
    return None


def _occurrences(line: str, value: str) -> Iterator[tuple[int, int]]:
    i = line.find(value)
    while i >= 0:
        yield i, i + len(value)
        i = line.find(value, i + len(value))


def value_spans(line: str, value: str, detector: str) -> list[tuple[int, int]]:
    """The spans in `line` of each whole secret detect-secrets reported as `value`.

    For a regex detector: where one of its patterns reports `value`, the match without the
    delimiters around it, carried to the end of its token. For the entropy plugins, which
    report a whole quoted string: each occurrence of `value`.
    """
    spans: set[tuple[int, int]] = set()
    for pattern in _patterns().get(detector, ()):
        for m in pattern.finditer(line):
            span = _match_span(m, value)
            if span is None:
                continue
            a, b = span
            while a < b and line[a] in _DELIMITERS:
                a += 1
            while b > a and line[b - 1] in _DELIMITERS:
                b -= 1
            spans.add((a, _TOKEN_TAIL.match(line, b).end()))
    return sorted(spans) if spans else list(_occurrences(line, value))


@dataclass(frozen=True)
class QuotedView:
    """A line as detect-secrets is given it: an unquoted credential value put in quotes."""

    text: str
    start: int = -1  # where the value starts in the original line (-1: not quoted)
    end: int = -1

    def original(self, i: int) -> int:
        """The offset in the original line of offset `i` in `text`."""
        if self.start < 0 or i <= self.start:
            return i
        return i - 1 if i <= self.end + 1 else i - 2


def quoted_view(line: str) -> QuotedView:
    """`line`, with the value quoted if it is an unquoted assignment to a credential name."""
    m = _ASSIGNMENT.match(line)
    if m is None or not names_credential(m.group("name")):
        return QuotedView(line)
    a, b = m.span("value")
    return QuotedView(f'{line[:a]}"{line[a:b]}"{line[b:]}', a, b)

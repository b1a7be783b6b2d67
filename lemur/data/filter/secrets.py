"""Secrets in code: detect-secrets with StarCoder's plugins, run only on candidate lines.

detect-secrets costs ~85 us per line with these plugins (0.4 MB/s on Python code), and
almost no line of code holds a secret: `candidates.candidate_lines` picks the few lines
worth scanning, and detect-secrets scans them as its `scan_file` does (line by line; the
entropy plugins read quoted strings only), so every finding is one detect-secrets made.
Two things `secret_spans` adds: the span of each finding is the whole secret (detect-secrets
reports `ghp` for a GitHub token), and an unquoted credential assignment (`KEY=value`,
`key: value`) is scanned with its value in quotes, as the entropy plugins need.

Plugins and filters are StarCoder's (bigcode-dataset `pii/utils/keys_detection.py`): the
high-signal detectors, no keyword, basic-auth or private-key plugin. StarCoder then dropped
findings with a gibberish model trained on a text corpus and two hash rules; without the
model we keep the hash rules and a cheap randomness test:
- a 32/40/64-character value on a line naming a hash (`sha`, `sha256`, `md5`, `hash`,
  `digest`, `checksum`) is a checksum (StarCoder's `is_hash`);
- a hex string in a document that names hashes at least 3 times and as often as 2% of its
  lines is a test vector (StarCoder's `file_has_hashes`, which skipped every key of such a
  file);
- an entropy finding with 5 ascending characters (`...0123456789abcdef`) is an alphabet,
  and a base64 one must change character class (upper, lower, digit, other) at least 0.4
  times per character: random base64 does ~0.6, identifiers like
  `HEXAGON_V6_vgathermhwq_128B` ~0.3.
PEM private key blocks, which detect-secrets reports only by their header line, are found
by a regex and their body replaced. Verification (network calls) is never enabled: its
filter is not in the list.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from lemur.data.filter.candidates import candidate_lines
from lemur.data.filter.secret_spans import quoted_view, value_spans

PLUGINS = [
    {"name": name}
    for name in (
        "ArtifactoryDetector",
        "AWSKeyDetector",
        "AzureStorageKeyDetector",
        "CloudantDetector",
        "DiscordBotTokenDetector",
        "GitHubTokenDetector",
        "IbmCloudIamDetector",
        "IbmCosHmacDetector",
        "JwtTokenDetector",
        "MailchimpDetector",
        "NpmDetector",
        "SendGridDetector",
        "SlackDetector",
        "SoftlayerDetector",
        "StripeDetector",
        "TwilioKeyDetector",
        # Last, so that a value both name (a GitHub token is high-entropy too) is reported
        # by the specific detector.
        "Base64HighEntropyString",
        "HexHighEntropyString",
    )
]
FILTERS = [
    {"path": f"detect_secrets.filters.heuristic.{name}"}
    for name in (
        "is_potential_uuid",
        "is_likely_id_string",
        "is_templated_secret",
        "is_sequential_string",
    )
]
# `sha` only as a word or with digits (`sha256`): StarCoder's substring count took `shared`
# and `shape` for hashes.
_HASH_MENTION = re.compile(r"(?<![a-z])sha(?![a-z])|md5|hash|digest|checksum")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY-----(.+?)-----END \1PRIVATE KEY-----", re.DOTALL
)


@dataclass(frozen=True)
class Secret:
    """A secret's character span in a document, its 1-based line and the detector's name."""

    start: int
    end: int
    line: int
    detector: str


_DEPTH = [0]  # open `secret_settings` blocks: the settings are configured once, outermost


@contextmanager
def secret_settings() -> Iterator[None]:
    """detect-secrets configured with our plugins and filters (its settings are global).

    Re-entrant and free when already open: a task opens it once around all its documents,
    and `find_secrets` opens it again so that it is never called unconfigured.
    """
    from detect_secrets.settings import transient_settings

    if _DEPTH[0]:
        _DEPTH[0] += 1
        try:
            yield
        finally:
            _DEPTH[0] -= 1
        return
    with transient_settings({"plugins_used": PLUGINS, "filters_used": FILTERS}):
        _DEPTH[0] = 1
        try:
            yield
        finally:
            _DEPTH[0] = 0


def line_number(text: str, offset: int) -> int:
    """The 1-based line of a character offset."""
    return text.count("\n", 0, offset) + 1


def _has_run(value: str, length: int = 5) -> bool:
    """`length` consecutive characters in ascending order (`abcde`, `01234`): an alphabet."""
    run = 1
    for x, y in zip(value, value[1:], strict=False):
        run = run + 1 if ord(y) == ord(x) + 1 else 1
        if run >= length:
            return True
    return False


def _class_changes(value: str) -> float:
    """Changes between upper, lower, digit and other characters per character."""
    kinds = [
        "u" if c.isupper() else "l" if c.islower() else "d" if c.isdigit() else "o" for c in value
    ]
    return sum(a != b for a, b in zip(kinds, kinds[1:], strict=False)) / max(len(value), 1)


def looks_random(value: str, detector: str) -> bool:
    """An entropy finding that is not an alphabet or an identifier (other detectors pass).

    Stands in for StarCoder's gibberish model: random base64 changes character class at
    ~0.6 per character, identifiers like `HEXAGON_V6_vgathermhwq_128B` at ~0.3.
    """
    if "High Entropy" not in detector:
        return True
    if _has_run(value):
        return False
    return "Base64" not in detector or _class_changes(value) >= 0.4


def about_hashes(text: str) -> bool:
    """A document naming hashes 3 times and as often as 2% of its lines: its hex strings are
    checksums (StarCoder's `file_has_hashes`, applied here to hex strings only)."""
    mentions = len(_HASH_MENTION.findall(text.lower()))
    return mentions >= max(3, 0.02 * (text.count("\n") + 1))


def is_checksum(value: str, line: str) -> bool:
    """A hash-length value on a line about hashes (StarCoder's `is_hash`)."""
    return len(value) in (32, 40, 64) and bool(_HASH_MENTION.search(line.lower()))


def scan_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str, str]]:
    """(line number, value, detector) of detect-secrets' findings; inside `secret_settings`."""
    # The per-line loop of detect-secrets' `scan_file`, without writing a temporary file.
    from detect_secrets.core.scan import _process_line_based_plugins

    for s in _process_line_based_plugins(lines=lines, filename="document"):
        if s.secret_value:
            yield s.line_number, s.secret_value, s.type


def find_secrets(text: str) -> list[Secret]:
    """Secrets in a document: detect-secrets' findings on candidate lines (each whole value,
    see `secret_spans`), then private key blocks (fastest inside an open `secret_settings`)."""
    lines = {number: (start, line) for number, start, line in candidate_lines(text)}
    views = {number: quoted_view(line) for number, (_, line) in lines.items()}
    found: list[Secret] = []
    hashy: bool | None = None
    with secret_settings():
        findings = list(scan_lines([(n, view.text) for n, view in views.items()]))
    for number, value, detector in findings:
        start, line = lines[number]
        if is_checksum(value, line) or not looks_random(value, detector):
            continue
        if detector == "Hex High Entropy String":
            hashy = about_hashes(text) if hashy is None else hashy
            if hashy:
                continue
        view = views[number]
        for a, b in value_spans(view.text, value, detector):
            found.append(
                Secret(start + view.original(a), start + view.original(b), number, detector)
            )
    return found + private_keys(text)


def private_keys(text: str) -> list[Secret]:
    """The bodies of PEM private key blocks (header and footer lines stay)."""
    out = []
    if "PRIVATE KEY-----" not in text:
        return out
    for m in _PRIVATE_KEY.finditer(text):
        body = m.group(2)
        a = m.start(2) + len(body) - len(body.lstrip())
        b = m.end(2) - (len(body) - len(body.rstrip()))
        if b > a:
            out.append(Secret(a, b, line_number(text, a), "Private Key"))
    return out

"""PII redaction: e-mail addresses, global IP addresses and secrets, replaced in place.

A build step (after the filters and decontamination, before dedup signatures and
tokenization) over documents of the configured domains (`pii.domains`, code by default).
Each finding is replaced and nothing else changes: `<EMAIL>`, `<KEY>`, and for an IP one
of a few fixed private addresses of the same version, picked by a hash of the document id
and the address (so one address maps to one replacement within a document, the same on
every run). Counts per source and kind go to the task stats as `pii:<source>:<kind>`;
with `pii.report` each redaction is written to `<report>/<task>.jsonl` as
`{id, source, kind, line, detector}`, never the value itself.

Rules (after StarCoder's PII pipeline, bigcode-dataset `pii/`):
- e-mail: `local@domain.tld`; addresses at reserved example domains (RFC 2606), asset
  names like `icon@2x.png` and the login of a URL or git remote (`ssh://git@host/...`,
  `git@github.com:org/repo.git`) are left alone;
- IP: an IPv4 or IPv6 address that `ipaddress` calls global (IPv6 also in 2000::/3);
  not popular public DNS resolvers; not part of a longer dotted number (OIDs, versions);
  not after `-` (`linux-2.6.16.60`); not on a line that speaks of versions or OIDs; an
  IPv4 address whose first three parts are under 32 (`1.2.3.4`, the C++ standard's
  section `23.3.5.2`) only on a line about networking (StarCoder's rule for `x.x.x.x`,
  widened after the section numbers in libstdc++ and kernel headers);
- key: see `lemur.data.filter.secrets`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.atomic_files import atomic_open
from lemur.data.filter.secrets import find_secrets, line_number, secret_settings
from lemur.data.labels import pii_label
from lemur.data.recipe.filters import PiiConfig
from lemur.data.samples.collect import TaskSamples
from lemur.data.samples.records import PII, SampleSettings

EMAIL, IP, KEY = "email", "ip", "key"
PRIVATE_IPV4 = ("10.0.42.17", "172.16.31.10", "192.168.88.14", "10.128.5.203")
PRIVATE_IPV6 = ("fd00:1a2b:3c4d::17", "fd12:3456:789a:1::42", "fdab:cdef:1234::9")
# Public resolvers are infrastructure, not anyone's data (StarCoder kept them too).
DNS_SERVERS = frozenset(
    "8.8.8.8 8.8.4.4 1.1.1.1 1.0.0.1 9.9.9.9 149.112.112.112 208.67.222.222 208.67.220.220 "
    "2001:4860:4860::8888 2001:4860:4860::8844 2606:4700:4700::1111 2606:4700:4700::1001".split()
)
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}$")
_EMAIL_DOMAIN = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.)+([A-Za-z]{2,24})(?![\w\-]|\.\w)"
)
_NOT_EMAIL_TLD = frozenset(
    "png jpg jpeg gif svg webp ico bmp css js json map html py txt md".split()
)
_RESERVED_DOMAIN = re.compile(
    r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost)$"
)
# Both start with a literal or a small class, so `re` skips ahead fast (a leading
# lookbehind made it try every position); what precedes a match is checked in Python.
_IPV4_TAIL = re.compile(r"\.\d{1,3}\.\d{1,3}\.\d{1,3}(?!\w|\.\d)")
IPV6_PATTERN = re.compile(r"[23][0-9A-Fa-f]{3}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
# Every IPV6_PATTERN match has such a colon 4 characters after its start. `re` scans for a
# leading literal fast, where IPV6_PATTERN's leading class made it try every `2` and `3` of a
# text (14% of the PII stage's time on code, before).
_IPV6_COLON = re.compile(r":(?=[0-9A-Fa-f]{0,4}:)")
_VERSION_CONTEXT = re.compile(
    r"(?i)version|(?<![a-z])(?:ver|rev)(?![a-z])|release|revision|"
    r"(?<![a-z])oids?(?![a-z])|object_?identifier|asn\.?1|(?<![a-z])mib(?![a-z])|snmp"
)
_SERVER_CONTEXT = re.compile(
    r"(?i)dns|server|host|addr|gateway|proxy|route|ping|connect|(?<![a-z])ip(?:v4)?(?![a-z])|://"
)


@dataclass(frozen=True)
class Redaction:
    """A span of a document to replace, what it was and with what."""

    start: int
    end: int
    kind: str
    replacement: str
    detector: str = ""


def find_emails(text: str) -> list[Redaction]:
    """E-mail addresses, found from each `@` (cheap: code has few)."""
    out: list[Redaction] = []
    at = text.find("@")
    while at >= 0:
        local = _EMAIL_LOCAL.search(text, max(0, at - 64), at)
        domain = _EMAIL_DOMAIN.match(text, at + 1)
        if local and domain and _is_personal(text, local.start(), domain):
            out.append(Redaction(local.start(), domain.end(), EMAIL, "<EMAIL>"))
        at = text.find("@", at + 1)
    return out


def _is_personal(text: str, start: int, domain: re.Match[str]) -> bool:
    """Not inside a longer token, not an asset name, not at a reserved example domain, not
    the login of a URL (`git+ssh://git@gitlab.com/...`) or of scp syntax (`git@host:path`)."""
    if start > 0 and (text[start - 1].isalnum() or text[start - 1] in "._%+-"):
        return False
    after = text[domain.end() : domain.end() + 2]
    if text[max(0, start - 3) : start] == "://" or (after[:1] == ":" and after[1:].strip()):
        return False
    name = domain.group().lower()
    return domain.group(1).lower() not in _NOT_EMAIL_TLD and not _RESERVED_DOMAIN.search(name)


def _line_of(text: str, start: int, end: int) -> str:
    return text[text.rfind("\n", 0, start) + 1 : (text.find("\n", end) + 1 or len(text) + 1) - 1]


def _is_global_ip(value: str, line: str) -> bool:
    """A global address outside version/OID context (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return False
    if not ip.is_global or value in DNS_SERVERS or _VERSION_CONTEXT.search(line):
        return False
    if ip.version == 4 and all(int(part) < 32 for part in value.split(".")[:3]):
        # `1.2.3.4`, `23.3.5.2` (a C++ standard section), `9.4.2.168` (IEEE 802.11):
        # numbering, unless the line is about networking.
        return bool(_SERVER_CONTEXT.search(line))
    return True


def replacement_ip(doc_id: str, value: str) -> str:
    """The private address that replaces `value` in document `doc_id` (fixed per pair)."""
    choices = PRIVATE_IPV4 if "." in value else PRIVATE_IPV6
    digest = hashlib.blake2b(f"{doc_id}\0{value}".encode(), digest_size=8).digest()
    return choices[int.from_bytes(digest, "little") % len(choices)]


def _free_start(text: str, start: int, also: str) -> bool:
    """Nothing word-like (or in `also`) right before `start`: not inside a longer token."""
    return start == 0 or not (text[start - 1].isalnum() or text[start - 1] in also)


def _ipv4_candidates(text: str) -> list[tuple[int, int]]:
    """Spans of dotted quads not inside a longer dotted number or word."""
    out = []
    for m in _IPV4_TAIL.finditer(text):
        start = m.start()
        while start > 0 and m.start() - start < 4 and text[start - 1].isdigit():
            start -= 1
        if 1 <= m.start() - start <= 3 and _free_start(text, start, "_.-"):
            out.append((start, m.end()))
    return out


def ipv6_matches(text: str) -> list[tuple[int, int]]:
    """The spans `IPV6_PATTERN.finditer(text)` gives, tried only where `_IPV6_COLON` allows."""
    out: list[tuple[int, int]] = []
    end = 0
    for colon in _IPV6_COLON.finditer(text):
        start = colon.start() - 4
        if start >= end and (m := IPV6_PATTERN.match(text, start)):
            out.append(m.span())
            end = m.end()
    return out


def find_ips(text: str, doc_id: str) -> list[Redaction]:
    """Global IPv4 and IPv6 addresses with their per-document replacements."""
    spans = _ipv4_candidates(text) if "." in text else []
    spans += [(s, e) for s, e in ipv6_matches(text) if _free_start(text, s, "_:.")]
    out: list[Redaction] = []
    for start, end in spans:
        value = text[start:end]
        if _is_global_ip(value, _line_of(text, start, end)):
            out.append(Redaction(start, end, IP, replacement_ip(doc_id, value)))
    return out


def find_keys(text: str) -> list[Redaction]:
    """Secrets: detect-secrets on candidate lines, and private keys."""
    return [Redaction(s.start, s.end, KEY, "<KEY>", s.detector) for s in find_secrets(text)]


def apply(text: str, found: list[Redaction]) -> tuple[str, list[Redaction]]:
    """The text with the findings replaced, and the redactions made.

    Overlapping findings become one redaction over their union, with the kind of the first
    (earliest, then longest): none is left half replaced, and each is counted once.
    """
    kept: list[Redaction] = []
    for r in sorted(found, key=lambda r: (r.start, -r.end)):
        if not kept or r.start >= kept[-1].end:
            kept.append(r)
        elif r.end > kept[-1].end:
            kept[-1] = replace(kept[-1], end=r.end)
    parts, pos = [], 0
    for r in kept:
        parts += [text[pos : r.start], r.replacement]
        pos = r.end
    parts.append(text[pos:])
    return "".join(parts), kept


def redact(
    text: str, doc_id: str, kinds: tuple[str, ...] = (EMAIL, IP, KEY)
) -> tuple[str, list[Redaction]]:
    """(redacted text, applied redactions) of one document (for many, open `secret_settings`)."""
    found: list[Redaction] = []
    if EMAIL in kinds and "@" in text:
        found += find_emails(text)
    if IP in kinds:
        found += find_ips(text, doc_id)
    if KEY in kinds:
        found += find_keys(text)
    return apply(text, found) if found else (text, [])


class PiiRedactor(PipelineStep):
    """Rewrites documents of some domains with their PII replaced; counts per source and kind."""

    type = "🔒 - PII"
    name = "🔒 redact PII"

    def __init__(
        self, config: PiiConfig, samples: tuple[SampleSettings, str] | None = None
    ) -> None:
        super().__init__()
        self.domains = frozenset(config.domains)
        self.kinds = tuple(config.kinds)
        self.report = config.report
        self.samples = samples  # (settings, part folder): the build's PII samples, or None

    def redact_doc(self, doc: Document) -> list[Redaction]:
        """Redact one document in place and count what was replaced."""
        doc.text, done = redact(doc.text, str(doc.id), self.kinds)
        source = doc.metadata.get("source", "?")
        for r in done:
            self.stat_update(pii_label(source, r.kind))
        return done

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        """Pass every document on, redacted when its domain is configured."""
        opened = Report.open(self.report, rank) if self.report else nullcontext()
        samples = TaskSamples(*self.samples) if self.samples else None
        with secret_settings(), opened as report:
            for doc in data:
                if doc.metadata.get("domain") in self.domains:
                    original = doc.text
                    with self.track_time():
                        done = self.redact_doc(doc)
                    if report and done:
                        report.write(doc, original, done)
                    if samples is not None and done:
                        sample_redacted(samples, doc, done)
                yield doc
        if samples is not None:
            samples.write(rank)


def sample_redacted(samples: TaskSamples, doc: Document, done: list[Redaction]) -> None:
    """Count a redacted document's redactions by kind; offer it, redacted, to its source's
    sample (the text as the build wrote it: never a secret)."""
    kinds: dict[str, int] = {}
    for r in done:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
        samples.count(("pii_counts", r.kind))
    source = str(doc.metadata.get("source", "?"))

    def record() -> dict[str, Any]:
        return {"source": source, "id": str(doc.id), "kinds": kinds, **samples.text(doc.text)}

    samples.offer(PII, (source,), samples.seeded(PII, source, str(doc.id)), record)


class PiiScrub:
    """What the samples show of a document the build did not get to redact (dropped before
    the PII step): the text redacted as the build would have, in PII's domains."""

    def __init__(self, config: PiiConfig) -> None:
        self.domains = frozenset(config.domains) if config.enabled else frozenset()
        self.kinds = tuple(config.kinds)

    def __call__(self, text: str, doc_id: str, domain: str) -> str:
        """The text as the samples may show it."""
        if domain not in self.domains or not self.kinds:
            return text
        with secret_settings():
            return redact(text, doc_id, self.kinds)[0]


class Report:
    """A task's redaction report, `<directory>/<rank>.jsonl`, in place once the task ends."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    @classmethod
    @contextmanager
    def open(cls, directory: str, rank: int) -> Iterator[Report]:
        """Task `rank`'s report: renamed into place when the task ends, removed if it fails."""
        path = Path(directory).expanduser() / f"{rank:05d}.jsonl"
        with atomic_open(path, "w", encoding="utf-8") as fh:
            yield cls(fh)

    def write(self, doc: Document, original: str, done: list[Redaction]) -> None:
        """One row per redaction: document id, source, kind, line (in the original), detector."""
        source = doc.metadata.get("source", "?")
        for r in done:
            row: dict[str, Any] = {"id": doc.id, "source": source, "kind": r.kind}
            row["line"] = line_number(original, r.start)
            if r.detector:
                row["detector"] = r.detector
            self.file.write(json.dumps(row) + "\n")

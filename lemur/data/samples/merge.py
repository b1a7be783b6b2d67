"""Every task's samples joined into the build's samples folder (docs/format.md#samples).

Per (kind, key) the K records of lowest rank over every part file are kept (the ranks are
seeded hashes of the documents, so the same whatever the tasks), tallies are summed, and
each file is written whole, its lines sorted; `write_samples` returns the manifest's entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lemur.atomic_files import atomic_write_bytes
from lemur.data.samples.collect import (
    LENGTH_EDGES,
    SCORE_EDGES,
    add_tally,
    json_bytes,
    read_parts,
)
from lemur.data.samples.drops import BORDERLINE
from lemur.data.samples.records import (
    DECONTAMINATION,
    DROPS,
    EXACT_DUPLICATES,
    FORMAT,
    KEPT,
    NEAR_DUPLICATES,
    PII,
    SUMMARY,
    SampleSettings,
)

# How each file's lines are ordered (by these fields of its records).
ORDER = {
    DROPS: ("source", "reason", "id"),
    DECONTAMINATION: ("source", "benchmark", "id"),
    PII: ("source", "id"),
    KEPT: ("kind", "source", "language", "id"),
}


class Merged:
    """The K lowest-ranked records per (kind, key), the summed tallies and the facts."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.held: dict[tuple[str, tuple[str, ...]], list[tuple[Any, str, dict]]] = {}
        self.tallies: dict[str, Any] = {}
        self.facts: dict[str, dict[str, Any]] = {}

    def add_part(self, part: dict[str, Any]) -> None:
        """Join one part file."""
        for r in part["records"]:
            held = self.held.setdefault((r["kind"], tuple(r["key"])), [])
            # The record's text breaks a tie of ranks (a 64-bit hash collision).
            held.append((r["rank"], json.dumps(r["record"], sort_keys=True), r["record"]))
            if len(held) > 4 * self.k:
                held.sort(key=lambda e: (e[0], e[1]))
                del held[self.k :]
        _add_tallies(self.tallies, part["tallies"], ())
        for name, values in part.get("facts", {}).items():
            self.facts.setdefault(name, {}).update(values)

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The kept records of `kind`, every key's, in the file's order."""
        out = []
        for (k, _), held in self.held.items():
            if k == kind:
                out += [r for _, _, r in sorted(held, key=lambda e: (e[0], e[1]))[: self.k]]
        fields = ORDER.get(kind, ("id",))
        return sorted(out, key=lambda r: tuple(str(r.get(f, "")) for f in fields))

    def ranked(self, kind: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
        """The kept records of one key, lowest rank first."""
        held = sorted(self.held.get((kind, key), []), key=lambda e: (e[0], e[1]))
        return [r for _, _, r in held[: self.k]]


def _add_tallies(into: dict[str, Any], tallies: dict[str, Any], path: tuple[str, ...]) -> None:
    for key, value in tallies.items():
        if isinstance(value, dict):
            _add_tallies(into, value, (*path, key))
        else:
            add_tally(into, (*path, key), value)


def merge_parts(parts_dirs: Iterable[Path], settings: SampleSettings) -> Merged:
    """Every part file under the given runs' samples folders, joined."""
    merged = Merged(settings.per_reason)
    for parts_dir in parts_dirs:
        for part in read_parts(parts_dir):
            merged.add_part(part)
    return merged


def summary(merged: Merged, settings: SampleSettings) -> dict[str, Any]:
    """The summary file: settings, PII counts, histograms, classifier borderline documents."""
    hist = merged.tallies.get("histograms", {})
    cuts: dict[str, dict[str, float]] = {}
    for key, cut in merged.facts.get("cuts", {}).items():
        name, source = key.split("\x1f", 1)
        cuts.setdefault(name, {})[source] = cut
    classifiers = {}
    for name, counts in sorted(hist.get("classifier", {}).items()):
        per = dict(sorted(cuts.get(name, {}).items()))
        one = set(per.values())
        cut = one.pop() if len(one) == 1 else None
        classifiers[name] = {"edges": SCORE_EDGES, "counts": counts, "cut": cut, "cuts": per}
    borderline = {
        name: sorted(merged.ranked(BORDERLINE, (name,)), key=lambda r: (r["score"], r["id"]))
        for name in sorted(classifiers)
    }
    return {
        "format": FORMAT,
        "per_reason": settings.per_reason,
        "max_bytes": settings.max_bytes,
        "seed": settings.seed,
        "pii_counts": dict(sorted(merged.tallies.get("pii_counts", {}).items())),
        "histograms": {
            "length": {
                d: {"edges": LENGTH_EDGES, "counts": c}
                for d, c in sorted(hist.get("length", {}).items())
            },
            "language": {
                d: dict(sorted(per.items())) for d, per in sorted(hist.get("language", {}).items())
            },
            "classifier": classifiers,
        },
        "classifier_borderline": borderline,
    }


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json_bytes(r) + b"\n" for r in records)


def write_samples(
    folder: Path,
    merged: Merged,
    settings: SampleSettings,
    extra: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Write the samples folder (each file whole or not at all); `extra`: records made
    after the tasks (duplicates; FIM and repository documents, added to kept.jsonl).
    Returns the manifest's `samples` entry: format and each file's sha256."""
    bodies = {
        DROPS: _jsonl(merged.records(DROPS)),
        NEAR_DUPLICATES: _jsonl(extra.get(NEAR_DUPLICATES, [])),
        EXACT_DUPLICATES: _jsonl(extra.get(EXACT_DUPLICATES, [])),
        DECONTAMINATION: _jsonl(merged.records(DECONTAMINATION)),
        PII: _jsonl(merged.records(PII)),
        KEPT: _jsonl(merged.records(KEPT) + extra.get(KEPT, [])),
        SUMMARY: json.dumps(summary(merged, settings), sort_keys=True, indent=1).encode(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in bodies.items():
        atomic_write_bytes(folder / name, body)
    files = {name: hashlib.sha256(body).hexdigest() for name, body in bodies.items()}
    return {"format": FORMAT, "files": files}

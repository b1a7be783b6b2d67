"""A task's samples: up to K records per key, those of lowest seeded priority, and tallies
(counts and fixed-edge histograms), written as one part file per task and step.

A step (a filter, the PII redactor, the kept-documents step) makes a `TaskSamples` when
its task starts and writes it when its documents are exhausted, so a task killed half way
leaves no part and a rerun of it writes the same one. Records are built only when they
enter a reservoir (a few dozen per key over a whole task), so sampling costs a hash per
document. `merge.py` keeps the K lowest priorities per key over every part: the same
documents whatever the number of tasks or workers.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.atomic_files import atomic_write_bytes
from lemur.data.samples.records import KEPT, SampleSettings, capped, priority

# Document length (UTF-8 bytes) bins: 0, then powers of two from 16 B to 16 MiB; scores in
# twentieths. A value past the last edge counts in the last bin.
LENGTH_EDGES = [0] + [2**i for i in range(4, 25)]
SCORE_EDGES = [round(i / 20, 2) for i in range(21)]


def bin_of(edges: list[float], value: float) -> int:
    """The bin of `value` among `edges` (len(edges) - 1 bins; outside values clamp)."""
    return min(max(bisect.bisect_right(edges, value) - 1, 0), len(edges) - 2)


def add_tally(tallies: dict[str, Any], path: tuple[str, ...], value: int | list[int]) -> None:
    """Add a count (or a histogram's counts) at a nested `path` of `tallies`."""
    *parents, leaf = path
    for p in parents:
        tallies = tallies.setdefault(p, {})
    old = tallies.get(leaf)
    if isinstance(value, list):
        tallies[leaf] = [a + b for a, b in zip(old or [0] * len(value), value, strict=True)]
    else:
        tallies[leaf] = (old or 0) + value


class TaskSamples:
    """One task's samples of one step, in memory until `write`."""

    def __init__(self, settings: SampleSettings, folder: str) -> None:
        self.settings, self.folder = settings, folder
        self.reservoirs: dict[tuple[str, tuple[str, ...]], list[tuple[Any, dict]]] = {}
        self.tallies: dict[str, Any] = {}
        self.facts: dict[str, Any] = {}  # values every task states alike (a classifier's cut)

    def seeded(self, *parts: str) -> int:
        """The seeded priority of a document (`records.priority` with the build's seed)."""
        return priority(self.settings.seed, *parts)

    def offer(
        self, kind: str, key: tuple[str, ...], rank: Any, make: Callable[[], dict[str, Any]]
    ) -> None:
        """Keep the record `make()` under (kind, key) if `rank` is among the K lowest seen."""
        held = self.reservoirs.setdefault((kind, key), [])
        k = self.settings.per_reason
        if k <= 0 or (len(held) >= k and rank >= held[-1][0]):
            return
        bisect.insort(held, (rank, make()), key=lambda entry: entry[0])
        del held[k:]

    def text(self, text: str) -> dict[str, Any]:
        """`{"text", "cut", "bytes"}` of a text under the byte cap."""
        return capped(text, self.settings.max_bytes)

    def count(self, path: tuple[str, ...], n: int = 1) -> None:
        """Count `n` at `path` of the tallies (e.g. ("pii_counts", "email"))."""
        add_tally(self.tallies, path, n)

    def histogram(self, path: tuple[str, ...], edges: list[float], value: float) -> None:
        """Count `value` in the fixed-edge histogram at `path`."""
        *parents, leaf = path
        node = self.tallies
        for p in parents:
            node = node.setdefault(p, {})
        counts = node.get(leaf)
        if counts is None:  # once per histogram: every document after counts in place
            counts = node[leaf] = [0] * (len(edges) - 1)
        counts[bin_of(edges, value)] += 1

    def note(self, name: str, key: str, value: Any) -> None:
        """State a fact the merge keeps as is (the same in every task), e.g. a cut."""
        self.facts.setdefault(name, {})[key] = value

    def write(self, rank: int) -> None:
        """Write the task's part file (`<folder>/<rank>.json`), whole or not at all."""
        records = [
            {"kind": kind, "key": list(key), "rank": rank_, "record": record}
            for (kind, key), held in sorted(self.reservoirs.items())
            for rank_, record in held
        ]
        part = {"records": records, "tallies": self.tallies, "facts": self.facts}
        atomic_write_bytes(Path(self.folder) / f"{rank:05d}.json", json_bytes(part))


def json_bytes(obj: Any) -> bytes:
    """`obj` as UTF-8 JSON; a lone surrogate in a text (a file read with one) is written as
    its JSON escape (`\\udc80`), so every file stays valid UTF-8."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8", "backslashreplace")


def read_parts(parts_dir: Path) -> Iterator[dict[str, Any]]:
    """Every part file under a run's samples folder (each step's, each task's), in order."""
    for path in sorted(parts_dir.glob("*/*.json")):
        yield json.loads(path.read_text(encoding="utf-8"))


class KeptSamples(PipelineStep):
    """Samples the documents that passed every filter, per source and language, and counts
    every one of them in the length and language histograms per domain. Passes every
    document on unchanged."""

    name = "🔎 kept samples"
    type = "🔎 - SAMPLES"

    def __init__(self, settings: SampleSettings, folder: str) -> None:
        super().__init__()
        self.settings, self.folder = settings, folder

    def add(self, samples: TaskSamples, doc: Document) -> None:
        """Count one kept document and offer it to its (source, language) sample."""
        meta = doc.metadata
        source, domain = str(meta.get("source", "?")), str(meta.get("domain", "?"))
        language = str(meta.get("language") or "unknown")
        size = len(doc.text.encode("utf-8", "surrogatepass"))
        samples.histogram(("histograms", "length", domain), LENGTH_EDGES, size)
        samples.count(("histograms", "language", domain, language))

        def record() -> dict[str, Any]:
            return {
                "source": source,
                "domain": domain,
                "language": language,
                "id": str(doc.id),
                **samples.text(doc.text),
                "kind": "document",
            }

        rank = samples.seeded(KEPT, source, language, str(doc.id))
        samples.offer(KEPT, (source, language), rank, record)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Pass every document on; the task's part file appears when they are exhausted."""
        samples = TaskSamples(self.settings, self.folder)
        for doc in data:
            with self.track_time():
                self.add(samples, doc)
            yield doc
        samples.write(rank)

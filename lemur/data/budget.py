"""Budgeted reading: read only as many input units of a source as the mix plan needs.

A recipe whose budget (`mix.total_tokens`, or a ratio that needs only a small part of the
abundant domain) takes a small fraction of a source would otherwise read, filter and
tokenize all of it. With `mix.budgeted_reading` on, the build first runs the same per-file
pipeline over a seeded sample of each source's units (files, or parts of split files),
measures tokens kept per input byte, and reads of each source only a seeded prefix of its
units big enough for its domain's need times `mix.read_margin`. When what was read falls
short (the sample overestimated the yield), a top-up round reads a longer prefix of the
same order and the build re-plans; every choice depends only on the recipe and the inputs,
so a rerun reads the same units and writes the same shards. See docs/scale.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data import work as work_folders
from lemur.data.corpus import Corpus
from lemur.data.read.listing import InputFile, Listing
from lemur.data.read.split import ROW_GROUPS
from lemur.data.recipe.recipe import Recipe
from lemur.data.runs.format import task_records

DEFAULT_MARGIN = 1.3
DEFAULT_SAMPLE_FRACTION = 0.02
MAX_TOP_UPS = 3  # after this many short rounds, the next one reads everything left
# A read round: (units to read, "sample" or "read") -> (tokenize work, tasks, dedup folder).
ReadRound = Callable[[list[InputFile], str], tuple[Path, int, Path | None]]


def unit_bytes(files: list[InputFile]) -> list[int]:
    """Input bytes of every unit: a file's size, a byte part's length, a row-group run's share."""
    groups: dict[str, int] = {}
    for f in files:
        if f.unit == ROW_GROUPS:
            groups[f.open_path] = max(groups.get(f.open_path, 0), f.end)
    sizes = []
    for f in files:
        try:
            size = 0 if f.error else f.size if f.size >= 0 else Path(f.open_path).stat().st_size
        except OSError:
            size = 0
        if f.unit == ROW_GROUPS:  # row groups of a file are taken as equal in size
            size = size * (f.end - f.start) // max(1, groups[f.open_path])
        elif f.unit:
            size = f.end - f.start
        sizes.append(size)
    return sizes


def seeded_order(seed: int, files: list[InputFile]) -> dict[int, list[int]]:
    """Per source index, its units' indices into `files` in a seeded pseudo-random order."""

    def key(i: int) -> bytes:
        # The path below the source's root: the same data elsewhere is read the same way.
        f = files[i]
        return hashlib.blake2b(f"{seed}\0{f.rel}\0{f.start}".encode(), digest_size=8).digest()

    order: dict[int, list[int]] = {}
    for i, f in enumerate(files):
        order.setdefault(f.source, []).append(i)
    return {s: sorted(ix, key=lambda i: (key(i), i)) for s, ix in order.items()}


@dataclass
class Reading:
    """Which units of each source are read, and the estimates that chose them."""

    files: list[InputFile]
    sizes: list[int]
    order: dict[int, list[int]]
    take: dict[int, int]  # source index -> number of units read (a prefix of its order)
    estimate: dict[str, Any] = field(default_factory=dict)
    rounds: int = 1

    def selected(self) -> list[InputFile]:
        """The units to read, in listing order (so tasks get them as a full read would)."""
        keep = sorted(i for s, ix in self.order.items() for i in ix[: self.take[s]])
        return [self.files[i] for i in keep]

    def read_bytes(self, s: int) -> int:
        """Bytes of source `s` read."""
        return sum(self.sizes[i] for i in self.order[s][: self.take[s]])

    def available_bytes(self, s: int) -> int:
        """Bytes of source `s` listed."""
        return sum(self.sizes[i] for i in self.order[s])

    def is_full(self, s: int) -> bool:
        """Whether every unit of source `s` is read."""
        return self.take[s] >= len(self.order[s])

    def counts(self, recipe: Recipe) -> dict[str, dict[str, int]]:
        """Per source name: read_bytes, available_bytes, units_read, units_total."""
        out = {}
        for s, src in enumerate(recipe.sources):
            if s not in self.order:
                continue
            out[src.name] = {
                "read_bytes": self.read_bytes(s),
                "available_bytes": self.available_bytes(s),
                "units_read": self.take[s],
                "units_total": len(self.order[s]),
            }
        return out

    def summary(self, recipe: Recipe) -> dict[str, Any]:
        """What `--plan-only` shows: per-source counts, the estimate, the read rounds."""
        return {"sources": self.counts(recipe), "estimate": self.estimate, "rounds": self.rounds}

    def prefix_for(self, s: int, fraction: float) -> int:
        """Units of the order covering `fraction` of source `s`'s bytes (at least one)."""
        if fraction >= 1:
            return len(self.order[s])
        goal, done = fraction * self.available_bytes(s), 0
        for k, i in enumerate(self.order[s]):
            if done >= goal:
                return max(1, k)
            done += self.sizes[i]
        return len(self.order[s])


def full_reading(recipe: Recipe, listing: Listing) -> Reading:
    """Every unit of every source (budgeted reading off, or not worth it)."""
    files = listing.files
    order = seeded_order(recipe.seed, files)
    return Reading(files, unit_bytes(files), order, {s: len(ix) for s, ix in order.items()})


def _fractions(recipe: Recipe) -> dict[str, float]:
    rsum = sum(recipe.mix.ratio.values())
    return {d: r / rsum for d, r in recipe.mix.ratio.items()}


def tokens_by_source(run_dir: Path, n_tasks: int, dedup: Path | None) -> dict[int, int]:
    """Tokens kept per source index in a tokenize stage's work (after dedup when given)."""
    out: dict[int, int] = {}
    for rank in range(n_tasks):
        rec = task_records(work_folders.tokens_dir(run_dir), rank, dedup)
        kept = ~rec.removed
        sums = np.bincount(rec.source[kept], weights=rec.tokens[kept])
        for s in np.flatnonzero(sums):
            out[int(s)] = out.get(int(s), 0) + int(sums[s])
    return out


def domain_needs(recipe: Recipe, avail: dict[str, float], full: set[str]) -> dict[str, float]:
    """Tokens each domain must offer (val included) for the plan: from `mix.total_tokens`,
    else from the scarcest fully read domain (the natural total), else the scarcest one."""
    frac = _fractions(recipe)
    if recipe.mix.total_tokens is not None:
        total = float(recipe.mix.total_tokens)
    else:
        weighted = [d for d in frac if frac[d] > 0]  # a 0-weight domain binds nothing
        binding = [d for d in weighted if d in full] or weighted
        total = min(avail.get(d, 0.0) / frac[d] for d in binding)
    keep = max(1e-9, 1.0 - recipe.val_fraction)  # val documents leave before the mix
    return {d: total * f / keep for d, f in frac.items()}


def _domain_avail(recipe: Recipe, per_source: dict[int, float]) -> dict[str, float]:
    avail: dict[str, float] = {}
    for s, src in enumerate(recipe.sources):
        avail[src.domain] = avail.get(src.domain, 0.0) + per_source.get(s, 0.0)
    return avail


def plan_reading(recipe: Recipe, listing: Listing, run: ReadRound) -> Reading:
    """Sample every source, estimate its yield, and choose the prefix of units to read."""
    reading = full_reading(recipe, listing)
    frac = recipe.mix.sample_fraction or DEFAULT_SAMPLE_FRACTION
    margin = recipe.mix.read_margin or DEFAULT_MARGIN
    sample = {s: max(1, math.ceil(frac * len(ix))) for s, ix in reading.order.items()}
    picked = sorted(i for s, ix in reading.order.items() for i in ix[: sample[s]])
    run_dir, n_tasks, _ = run([reading.files[i] for i in picked], "sample")
    got = tokens_by_source(run_dir, n_tasks, None)
    est: dict[int, float] = {}
    per_byte: dict[str, float] = {}
    for s, src in enumerate(recipe.sources):
        sampled = sum(reading.sizes[i] for i in reading.order[s][: sample[s]])
        per_byte[src.name] = got.get(s, 0) / sampled if sampled else 0.0
        est[s] = per_byte[src.name] * reading.available_bytes(s)
    avail = _domain_avail(recipe, est)
    needs = domain_needs(recipe, avail, set())
    shared = set(recipe.mix.shares or {})  # per-language shares: read those domains whole
    for s, src in enumerate(recipe.sources):
        d = src.domain
        need = margin * needs[d] / avail[d] if avail[d] > 0 and d not in shared else 1.0
        reading.take[s] = reading.prefix_for(s, need)
    reading.estimate = {
        "sample_units": {src.name: sample[s] for s, src in enumerate(recipe.sources)},
        "tokens_per_byte": {k: round(v, 6) for k, v in per_byte.items()},
        "estimated_tokens": {src.name: int(est[s]) for s, src in enumerate(recipe.sources)},
        "needed_tokens": {d: int(n) for d, n in needs.items()},
        "margin": margin,
    }
    return reading


def top_up(recipe: Recipe, reading: Reading, run_dir: Path, n_tasks: int, dd: Path | None) -> bool:
    """After a round: extend the short domains' sources (True) or accept the round (False)."""
    got = tokens_by_source(run_dir, n_tasks, dd)
    avail = _domain_avail(recipe, {s: float(t) for s, t in got.items()})
    doms = {src.domain for src in recipe.sources}
    full = {
        d
        for d in doms
        if all(reading.is_full(s) for s, x in enumerate(recipe.sources) if x.domain == d)
    }
    needs = domain_needs(recipe, avail, full)
    margin = recipe.mix.read_margin or DEFAULT_MARGIN
    grew = False
    for d in sorted(doms - full):
        if avail[d] >= needs[d]:
            continue
        mine = [s for s, src in enumerate(recipe.sources) if src.domain == d]
        read = sum(reading.read_bytes(s) for s in mine)
        total = sum(reading.available_bytes(s) for s in mine)
        per_byte = avail[d] / read if read else 0.0  # the measured yield of this domain
        want = margin * needs[d] / (per_byte * total) if per_byte > 0 else 1.0
        if reading.rounds > MAX_TOP_UPS:
            want = 1.0
        for s in mine:  # at least one more unit per source, so every round makes progress
            more = max(reading.take[s] + 1, reading.prefix_for(s, want))
            reading.take[s] = min(more, len(reading.order[s]))
        grew = True
    if grew:
        reading.rounds += 1
    return grew


def read_sources(
    recipe: Recipe, corpus: Corpus, listing: Listing, run: ReadRound
) -> tuple[Reading, Path, int, Path | None]:
    """Read what the recipe needs: everything, or budgeted rounds (when the corpus reads on
    a budget: chat builds take every conversation); the last round's work."""
    if not corpus.budgeted_reading():
        reading = full_reading(recipe, listing)
        return reading, *run(listing.files, "read")
    reading = plan_reading(recipe, listing, run)
    while True:
        run_dir, n_tasks, dd = run(reading.selected(), "read")
        if not top_up(recipe, reading, run_dir, n_tasks, dd):
            return reading, run_dir, n_tasks, dd

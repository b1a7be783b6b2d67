"""The plan step: sum the prep tasks' histograms, choose the val and mix cuts, size the shuffle.

It holds one token histogram per mix unit (2^16 bins) and a few numbers per task, never
one entry per document. Each unit's budget becomes whole passes over the unit plus a set
of mix-hash bins for the partial pass (`unit_bins`). The number of train shards
is the planned train tokens over `shard_tokens`; a copy's shuffle key picks its shard.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.corpus import Corpus
from lemur.data.mix import MixInfeasible, MixPlan, fill_to_budget
from lemur.data.pack.select import HIST, N_BINS, Groups, Unit
from lemur.data.recipe.recipe import Recipe
from lemur.shards.format import open_array

# Peak bytes per document of a histogram / scatter task (records, hashes, copies, keys,
# order); copies of a shard's tokens a gather task holds (as read, shuffled) and its bytes
# per document (keys, order, offsets): measured with tools/bench_scale.py
# (docs/benchmarks.md) and rounded up. The interpreter itself adds ~65 MiB.
PREP_BYTES_PER_DOC = 150
SCATTER_BYTES_PER_DOC = 300
GATHER_COPIES = 2
GATHER_BYTES_PER_DOC = 100


class PackError(ValueError):
    """The tokenized corpus cannot be packed as the recipe asks (e.g. an empty domain)."""


@dataclass
class PackPlan:
    """The plan: mix budgets, the cuts every task applies, and the shuffle's shard counts."""

    mix: MixPlan
    val_cut: dict[str, int]  # domain -> val hash cut
    units: dict[Unit, tuple[int, bytes]]  # (group, language) -> (passes, partial-pass bins)
    train_shards: int
    val_shards: dict[str, int]  # domain -> number of val shards (recipe domain order)
    memory: dict[str, int] = field(default_factory=dict)  # expected peak bytes per stage

    def buckets(self) -> list[tuple[str, str, str]]:
        """(shard name, split, domain) of every gather task, in rank order."""
        out = [(f"train/{b:05d}", "train", "mixed") for b in range(self.train_shards)]
        for d, n in self.val_shards.items():
            out += [(f"val/{d}/{k:05d}", "val", d) for k in range(n)]
        return out


def unit_bins(tokens: np.ndarray, budget: int) -> tuple[int, bytes]:
    """(whole passes, bitmap of the mix-hash bins of the partial pass) meeting `budget`.

    A bin is taken whole: the bins in hash order up to the budget, then (first fit) every
    later bin that still fits, as `fill_to_budget` does with documents. With many
    documents per bin the error is within half a bin (~1/131072 of the unit); with one
    document per bin (small units) this is exactly the document-level first fit.
    """
    total = int(tokens.sum())
    if total == 0 or budget <= 0:
        return 0, np.packbits(np.zeros(N_BINS, bool)).tobytes()
    passes, rest = divmod(int(budget), total)
    full = np.flatnonzero(tokens > 0)  # empty bins would stop first fit from looking ahead
    take = np.zeros(N_BINS, bool)
    take[full[fill_to_budget(tokens[full], rest)]] = True
    return passes, np.packbits(take).tobytes()


class _Sums:
    """Histograms and val summaries summed over the prep tasks."""

    def __init__(self, g: Groups) -> None:
        self.g = g
        self.tokens: dict[Unit, np.ndarray] = {}
        self.docs: dict[Unit, np.ndarray] = {}
        self.val: dict[str, dict[str, Any]] = {}
        self.task_docs: list[int] = []
        self.task_tokens: list[int] = []

    def _arrays(self, unit: Unit) -> tuple[np.ndarray, np.ndarray]:
        if unit not in self.tokens:
            self.tokens[unit] = np.zeros(N_BINS, np.int64)
            self.docs[unit] = np.zeros(N_BINS, np.int64)
        return self.tokens[unit], self.docs[unit]

    def add_task(self, hist: np.ndarray, meta: dict[str, Any]) -> None:
        """Add one prep task's output."""
        self.task_docs.append(meta["documents"])
        self.task_tokens.append(meta["tokens"])
        units = [(self.g.groups[s], lang) for s, lang in meta["keys"]]
        for k, unit in enumerate(units):
            rows = hist[hist["key"] == k]
            tok, docs = self._arrays(unit)
            np.add.at(tok, rows["bin"].astype(np.int64), rows["tokens"].astype(np.int64))
            np.add.at(docs, rows["bin"].astype(np.int64), rows["docs"].astype(np.int64))
        for d, e in meta["val"].items():
            agg = self.val.setdefault(d, {"n": 0, "below": 0, "below_tokens": 0})
            for k in ("n", "below", "below_tokens"):
                agg[k] += e[k]
            if "min" in e and ("min" not in agg or e["min"]["h"] < agg["min"]["h"]):
                agg["min"] = e["min"]
            if "max_below" in e and (
                "max_below" not in agg or e["max_below"]["h"] > agg["max_below"]["h"]
            ):
                agg["max_below"] = e["max_below"]

    def move(self, doc: dict[str, Any], sign: int) -> None:
        """Add (+1) a document to the mix pool or take it out (-1)."""
        tok, docs = self._arrays((self.g.groups[doc["source"]], doc["language"]))
        tok[doc["bin"]] += sign * doc["tokens"]
        docs[doc["bin"]] += sign

    def val_cuts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(val cut, val tokens) per domain; moves the documents the fixes change."""
        thr, cuts, tokens = self.g.val_threshold(), {}, {}
        for d, e in sorted(self.val.items()):
            n, k, cut, held = e["n"], e["below"], thr, e["below_tokens"]
            if thr == 0:
                cut = 0
            elif n < 2 or k == n:  # never every document of a domain (nor the only one)
                cut = e["max_below"]["h"] if n >= 2 else 0
                if k:
                    self.move(e["max_below"], +1)
                    held -= e["max_below"]["tokens"]
            elif k == 0:  # at least one: the document of smallest val hash
                cut = e["min"]["h"] + 1
                self.move(e["min"], -1)
                held += e["min"]["tokens"]
            cuts[d], tokens[d] = cut, held
        return cuts, tokens


def read_prep(prep_dir: Path, rank: int) -> tuple[np.ndarray, dict[str, Any]]:
    """One prep task's histogram and summary."""
    meta = json.loads((prep_dir / f"{rank:05d}.json").read_text())
    return np.array(open_array(prep_dir / f"{rank:05d}.hist", HIST)), meta


def make_plan(
    recipe: Recipe, corpus: Corpus, prep_dir: Path, n_tasks: int, itemsize: int
) -> PackPlan:
    """Sum the prep tasks' outputs and plan the mix, the val split and the shuffle."""
    g = Groups.of(recipe, corpus)
    sums = _Sums(g)
    for rank in range(n_tasks):
        sums.add_task(*read_prep(prep_dir, rank))
    val_cut, val_tokens = sums.val_cuts()
    available = {u: int(sums.tokens[u].sum()) for u, docs in sums.docs.items() if docs.sum() > 0}
    mix = _plan_mix(corpus, available)
    units = {u: unit_bins(sums.tokens[u], unit.budget) for u, unit in mix.units.items()}
    st = max(1, recipe.shard_tokens)
    planned = sum(u.budget for u in mix.units.values())
    val_shards = {d: math.ceil(val_tokens.get(d, 0) / st) for d in recipe.domains()}
    plan = PackPlan(mix, val_cut, units, max(1, math.ceil(planned / st)), val_shards)
    mask = 1 if corpus.loss_masks else 0  # a byte per token beside it
    shard = int(max(1, planned // plan.train_shards) * 1.05)  # buckets vary around the mean
    shard_docs = int(shard * sum(sums.task_docs) / max(1, sum(sums.task_tokens)))
    docs, tokens = max(sums.task_docs, default=0), max(sums.task_tokens, default=0)
    plan.memory = {
        "plan": len(sums.tokens) * N_BINS * 16,
        "histograms (per task)": docs * PREP_BYTES_PER_DOC,
        "scatter (per task)": docs * SCATTER_BYTES_PER_DOC + tokens * (itemsize + mask),
        "gather (per shard)": shard * GATHER_COPIES * (itemsize + mask)
        + shard_docs * GATHER_BYTES_PER_DOC,
    }
    return plan


def _plan_mix(corpus: Corpus, available: dict[tuple[str, str], int]) -> MixPlan:
    try:
        return corpus.plan_mix(available)
    except MixInfeasible as e:
        raise PackError(str(e)) from None

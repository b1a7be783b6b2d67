"""Per-task decisions of the pack stage, each a seeded hash of the document id, so that any
task decides its own documents without seeing the others:

- val: a document is held out when its "val" hash is below its domain's cut;
- mix: a unit (the mix's domain, or source in weighted chat builds, and a language) takes
  `passes` whole copies of every document plus one more copy of the documents whose "mix"
  hash falls in one of the unit's chosen bins (its top 16 bits);
- shuffle: every copy gets a "shuffle" key; its top bits pick the output shard (bucket) and
  its order inside the shard.

The plan step (plan.py) chooses the cuts and bins from the histograms that the prep tasks
write (`task_histogram`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lemur.data.corpus import Corpus
from lemur.data.dedup.signer import GOLDEN64
from lemur.data.mix import seeded_hash
from lemur.data.recipe.recipe import Recipe
from lemur.data.runs.format import TaskRecords

HIST_BITS = 16  # histogram bins: the top bits of the mix hash
BIN_SHIFT = 64 - HIST_BITS
N_BINS = 1 << HIST_BITS
FULL = 1 << 64  # a cut that takes every document
HIST = np.dtype([("key", "<u4"), ("bin", "<u4"), ("tokens", "<u8"), ("docs", "<u8")])
Unit = tuple[str, str]  # a mix unit: (mix group, language)


@dataclass(frozen=True)
class Groups:
    """What the per-task decisions need of the recipe (small, pickled into every task)."""

    seed: int
    val_fraction: float
    domains: tuple[str, ...]  # the domain of each source
    groups: tuple[str, ...]  # the mix group of each source: its domain, or its name

    @classmethod
    def of(cls, recipe: Recipe, corpus: Corpus) -> Groups:
        """The groups of a recipe: per domain, or per source in weighted chat builds."""
        domains = tuple(s.domain for s in recipe.sources)
        return cls(recipe.seed, recipe.val_fraction, domains, corpus.mix_groups())

    def val_threshold(self) -> int:
        """The val hash below which a document is held out (before small-domain fixes)."""
        return min(FULL - 1, int(self.val_fraction * FULL)) if self.val_fraction > 0 else 0


def below(h: np.ndarray, cut: int) -> np.ndarray:
    """Mask of hashes strictly below a cut in [0, 2^64] (2^64 takes all)."""
    if cut >= FULL:
        return np.ones(len(h), bool)
    return h < np.uint64(max(0, cut))


def keys_of(rec: TaskRecords) -> tuple[list[tuple[int, str]], np.ndarray]:
    """The task's (source, language) keys and each document's key index."""
    code = rec.source.astype(np.int64) * 65536 + rec.language
    uniq, inverse = np.unique(code, return_inverse=True)
    keys = [(int(c) // 65536, rec.languages[int(c) % 65536]) for c in uniq.tolist()]
    return keys, inverse.reshape(-1)


def task_histogram(
    rec: TaskRecords, g: Groups
) -> tuple[list[tuple[int, str]], np.ndarray, dict[str, dict]]:
    """A prep task's output: (keys, sparse token histogram, per-domain val summary).

    The histogram counts the documents that are kept and not val by the plain threshold,
    per key and mix-hash bin. The val summary lets the plan fix tiny domains (at least one
    val document, never all): per domain the kept documents, those below the threshold,
    their tokens, the kept document of smallest val hash and the val one of largest.
    """
    keys, key = keys_of(rec)
    domain = np.array(g.domains, dtype=object)[rec.source] if len(rec) else np.zeros(0, object)
    kept = ~rec.removed
    vh = seeded_hash(rec.id_hash, g.seed, "val")
    mh = seeded_hash(rec.id_hash, g.seed, "mix")
    held = kept & below(vh, g.val_threshold())
    pool = kept & ~held
    code = key[pool].astype(np.uint64) << np.uint64(HIST_BITS) | (mh[pool] >> np.uint64(BIN_SHIFT))
    uniq, inverse = np.unique(code, return_inverse=True)
    hist = np.zeros(len(uniq), HIST)
    hist["key"] = (uniq >> np.uint64(HIST_BITS)).astype(np.uint32)
    hist["bin"] = (uniq & np.uint64(N_BINS - 1)).astype(np.uint32)
    np.add.at(hist["tokens"], inverse.reshape(-1), rec.tokens[pool].astype(np.uint64))
    np.add.at(hist["docs"], inverse.reshape(-1), np.uint64(1))

    def doc(i: int) -> dict:
        s, lang = keys[key[i]]
        b = int(mh[i] >> np.uint64(BIN_SHIFT))
        return {
            "h": int(vh[i]),
            "source": s,
            "language": lang,
            "bin": b,
            "tokens": int(rec.tokens[i]),
        }

    val: dict[str, dict] = {}
    for d in sorted(set(g.domains)):
        in_d = kept & (domain == d)
        held_d = held & in_d
        entry = {"n": int(in_d.sum()), "below": int(held_d.sum())}
        entry["below_tokens"] = int(rec.tokens[held_d].sum())
        if in_d.any():
            idx = np.flatnonzero(in_d)
            entry["min"] = doc(int(idx[np.argmin(vh[idx])]))
        if held_d.any():
            idx = np.flatnonzero(held_d)
            entry["max_below"] = doc(int(idx[np.argmax(vh[idx])]))
        val[d] = entry
    return keys, hist, val


@dataclass
class Fates:
    """Per document of a task: held out for val, in the mix's pool, copies the mix takes."""

    val: np.ndarray
    pool: np.ndarray
    copies: np.ndarray
    unit: np.ndarray  # each document's mix unit, an index into `units`
    units: list[Unit]


def units_of(rec: TaskRecords, g: Groups) -> tuple[list[Unit], np.ndarray]:
    """The task's mix units (group, language) and each document's unit index."""
    names = sorted(set(g.groups))
    group = np.array([names.index(x) for x in g.groups], np.int64)
    code = group[rec.source] * 65536 + rec.language
    uniq, inverse = np.unique(code, return_inverse=True)
    units = [(names[int(c) // 65536], rec.languages[int(c) % 65536]) for c in uniq.tolist()]
    return units, inverse.reshape(-1)


def task_fates(
    rec: TaskRecords, g: Groups, val_cut: dict[str, int], units: dict[Unit, tuple[int, bytes]]
) -> Fates:
    """Apply the plan to one task's documents (`units`: unit -> (passes, packed bin bitmap))."""
    n = len(rec)
    domain = np.array(g.domains, dtype=object)[rec.source] if n else np.zeros(0, object)
    unit_keys, unit = units_of(rec, g)
    kept = ~rec.removed
    vh = seeded_hash(rec.id_hash, g.seed, "val")
    val = np.zeros(n, bool)
    for d, cut in val_cut.items():
        m = kept & (domain == d)
        val[m] = below(vh[m], cut)
    pool = kept & ~val
    mh = seeded_hash(rec.id_hash, g.seed, "mix")
    copies = np.zeros(n, np.int64)
    for u in np.unique(unit[pool]).tolist():
        if unit_keys[u] not in units:
            continue  # a language the plan gives no budget
        passes, bits = units[unit_keys[u]]
        m = pool & (unit == u)
        take = np.unpackbits(np.frombuffer(bits, np.uint8)).astype(bool)
        copies[m] = passes + take[(mh[m] >> np.uint64(BIN_SHIFT)).astype(np.int64)]
    return Fates(val, pool, copies, unit, unit_keys)


def bucket_of(key: np.ndarray, n: int) -> np.ndarray:
    """Bucket in [0, n) of each uint64 key: its top 32 bits scaled to n (hash-balanced)."""
    return ((key >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32)


def shuffle_keys(rec: TaskRecords, copies: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(document of each copy, its shuffle key): copies of one document get distinct keys."""
    entry = np.repeat(np.arange(len(copies)), copies)
    first = np.repeat(np.cumsum(copies) - copies, copies)
    copy_no = (np.arange(len(entry)) - first).astype(np.uint64)
    with np.errstate(over="ignore"):
        salted = rec.id_hash[entry] ^ (copy_no * GOLDEN64)
    return entry, seeded_hash(salted, seed, "shuffle")

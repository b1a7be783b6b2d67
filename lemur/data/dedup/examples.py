"""The build's samples of what dedup removed (docs/format.md#samples): per source of the
kept document, up to K near-duplicate clusters (the kept document and up to 3 removed
members with their estimated Jaccard) and up to K exact-duplicate groups with their
copy count.

Made after the cluster task from its removals (lemur/data/runs/format.py), the clusters
picked by a seeded hash of the kept document's id (so the same whatever the tasks), the
texts decoded from the token run (what the build trains on: PII already redacted).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.runs.format import removals
from lemur.data.samples.records import CLUSTER_MEMBERS, SampleSettings, capped
from lemur.shards.format import open_array

# (token ids of a document, framing included) -> its text.
Decode = Callable[[np.ndarray], str]
_MIX = np.uint64(0x9E3779B97F4A7C15)


def seeded_order(id_hash: np.ndarray, seed: int) -> np.ndarray:
    """A seeded 64-bit rank per document id hash (splitmix64 of id ^ seed)."""
    with np.errstate(over="ignore"):
        z = id_hash.astype(np.uint64) ^ np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
        z = z + _MIX
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class TokenRunReader:
    """Documents of a token run by (task, local index): records, ids, tokens, signatures."""

    def __init__(self, tok_dir: Path, num_perm: int | None) -> None:
        self.tok_dir, self.num_perm = tok_dir, num_perm
        self._records: dict[int, np.ndarray] = {}

    def records(self, task: int) -> np.ndarray:
        """Task `task`'s document records (cached: two bytes of source per document kept)."""
        if task not in self._records:
            # Mapped, not read: a sample touches a few documents of each task.
            self._records[task] = np.load(self.tok_dir / f"{task:05d}.docs.npy", mmap_mode="r")
        return self._records[task]

    def doc_id(self, task: int, local: int) -> str:
        """A document's id."""
        return _ids(self.tok_dir / f"{task:05d}.ids.txt")[local]

    def language(self, task: int, index: int) -> str:
        """The language of index `index` of a task's language table."""
        return _table(self.tok_dir / f"{task:05d}.json")["languages"][index]

    def tokens(self, task: int, local: int) -> np.ndarray:
        """A document's tokens, as the run holds them."""
        rec = self.records(task)[local]
        dtype = _table(self.tok_dir / f"{task:05d}.json")["dtype"]
        flat = open_array(self.tok_dir / f"{task:05d}.bin", np.dtype(dtype))
        end = int(rec["end"])
        return np.array(flat[end - int(rec["tokens"]) : end])

    def jaccard(self, a: tuple[int, int], b: tuple[int, int]) -> float | None:
        """The MinHash estimate of two documents' Jaccard similarity (None: no signatures)."""
        if not self.num_perm:
            return None
        sigs = []
        for task, local in (a, b):
            path = self.tok_dir / f"{task:05d}.minhash.bin"
            if not path.is_file():
                return None
            sigs.append(np.array(open_array(path, np.uint32, (self.num_perm,))[local]))
        return round(float(np.mean(sigs[0] == sigs[1])), 4)


def _removal_table(dedup_dir: Path, n_tasks: int) -> dict[str, np.ndarray]:
    """Every removal row of the run as columns: removed (task, local), kept, exact."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("task", "local", "kt", "kl", "exact")}
    for t in range(n_tasks):
        rows = removals(dedup_dir, t)
        cols["task"].append(np.full(len(rows), t, np.int64))
        cols["local"].append(rows["local"].astype(np.int64))
        cols["kt"].append(rows["keep_task"].astype(np.int64))
        cols["kl"].append(rows["keep_local"].astype(np.int64))
        cols["exact"].append(rows["exact"].astype(bool))
    return {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in cols.items()}


def _picked(
    reader: TokenRunReader, kt: np.ndarray, kl: np.ndarray, settings: SampleSettings
) -> list[tuple[int, int, int]]:
    """Up to K kept documents per source, by seeded rank: (source index, task, local)."""
    keys = np.unique(kt * (1 << 32) + kl)
    tasks, locals_ = keys >> 32, keys & 0xFFFFFFFF
    source = np.empty(len(keys), np.int64)
    rank = np.empty(len(keys), np.uint64)
    for t in np.unique(tasks).tolist():
        m = tasks == t
        rec = reader.records(t)[locals_[m]]
        source[m] = rec["source"]
        rank[m] = seeded_order(rec["id_hash"], settings.seed)
    picked = []
    for s in np.unique(source).tolist():
        idx = np.flatnonzero(source == s)
        idx = idx[np.lexsort((locals_[idx], tasks[idx], rank[idx]))][: settings.per_reason]
        picked += [(int(s), int(tasks[i]), int(locals_[i])) for i in idx]
    return picked


def _member(reader: TokenRunReader, decode: Decode, task: int, local: int, cap: int) -> dict:
    return {"id": reader.doc_id(task, local), **capped(decode(reader.tokens(task, local)), cap)}


def duplicate_samples(
    tok_dir: Path,
    dedup_dir: Path,
    n_tasks: int,
    settings: SampleSettings,
    decode: Decode,
    sources: list[str],
    num_perm: int | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(near-duplicate cluster records, exact-duplicate records) of a deduplicated run."""
    table = _removal_table(dedup_dir, n_tasks)
    reader = TokenRunReader(tok_dir, num_perm)
    cap = settings.max_bytes
    # The removal rows grouped by the document kept in their place (a cluster: one range).
    codes = table["kt"] * (1 << 32) + table["kl"]
    by_kept = np.argsort(codes, kind="stable")
    codes = codes[by_kept]
    out: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for exact in (False, True):
        sel = table["exact"] == exact
        for s, kt, kl in _picked(reader, table["kt"][sel], table["kl"][sel], settings):
            code = kt * (1 << 32) + kl
            rows = by_kept[np.searchsorted(codes, code) : np.searchsorted(codes, code, "right")]
            kept = _member(reader, decode, kt, kl, cap)
            record: dict[str, Any] = {"source": sources[s], "kept": kept}
            if exact:
                record["copies"] = int(table["exact"][rows].sum()) + 1
                out[True].append(record)
                continue
            members = np.sort(rows[~table["exact"][rows]])
            hashes = [
                reader.records(int(table["task"][i]))[int(table["local"][i])]["id_hash"]
                for i in members
            ]
            order = seeded_order(np.array(hashes, np.uint64), settings.seed)
            removed = []
            for i in members[np.argsort(order, kind="stable")][:CLUSTER_MEMBERS].tolist():
                task, local = int(table["task"][i]), int(table["local"][i])
                member = _member(reader, decode, task, local, cap)
                removed.append({**member, "jaccard": reader.jaccard((kt, kl), (task, local))})
            size = len(rows) + 1
            out[False].append({"cluster": kept["id"], **record, "size": size, "removed": removed})
    return sorted(out[False], key=_by_kept), sorted(out[True], key=_by_kept)


def _by_kept(record: dict[str, Any]) -> tuple[str, str]:
    return record["source"], record["kept"]["id"]


@functools.lru_cache(maxsize=4)
def _ids(path: Path) -> list[str]:
    """A task's document ids (the few tasks a sample reads from, cached)."""
    return path.read_text("utf-8").split("\n")


@functools.lru_cache(maxsize=64)
def _table(path: Path) -> dict[str, Any]:
    """A task's table (languages, dtype)."""
    return json.loads(path.read_text())

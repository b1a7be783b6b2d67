"""The cluster task: verified pairs joined into clusters (union-find), one kept per cluster.

It holds only the documents that appear in some pair (each with its cluster parent), never
one entry per document of the corpus, and writes per tokenize task the documents removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.data.dedup.buckets import PAIR, Priorities
from lemur.data.runs.format import REMOVAL
from lemur.shards.format import atomic_write_bytes, atomic_write_json, open_array, release_pages

SUMMARY = "summary.json"


def connected_roots(
    n: int, a: np.ndarray, b: np.ndarray, parent: np.ndarray | None = None
) -> np.ndarray:
    """Root (smallest member) of each node's component for edges a-b (vectorized union-find).

    `parent` continues from an earlier call's result (edges given chunk by chunk).
    """
    parent = np.arange(n, dtype=np.int64) if parent is None else parent
    if len(a) == 0:
        return parent
    while True:
        ra, rb = parent[a], parent[b]
        diff = ra != rb
        if not diff.any():
            return parent
        lo, hi = np.minimum(ra[diff], rb[diff]), np.maximum(ra[diff], rb[diff])
        np.minimum.at(parent, hi, lo)
        while True:  # pointer jumping until every node points at its root
            nxt = parent[parent]
            if np.array_equal(nxt, parent):
                break
            parent = nxt


@dataclass
class DedupResult:
    """Which documents are duplicates and of what (indexes follow the pack stage's records)."""

    removed_exact: np.ndarray
    removed_near: np.ndarray
    cluster: np.ndarray  # representative record index of each document's cluster
    candidate_pairs: int
    verified_pairs: int

    @property
    def removed(self) -> np.ndarray:
        """Mask of every removed document."""
        return self.removed_exact | self.removed_near


def _codes(task: np.ndarray, local: np.ndarray) -> np.ndarray:
    """One uint64 per document: task in the high half, local index in the low half."""
    return (task.astype(np.uint64) << np.uint64(32)) | local.astype(np.uint64)


class _UniqueCodes:
    """A growing set of uint64 codes: chunks wait until they outweigh the merged set, so
    merging costs O(n log n) overall rather than O(n) per chunk."""

    def __init__(self) -> None:
        self.merged = np.zeros(0, np.uint64)
        self.pending: list[np.ndarray] = []
        self.size = 0

    def add(self, *parts: np.ndarray) -> None:
        """Add codes (duplicates allowed)."""
        for p in parts:
            self.pending.append(np.unique(p))
            self.size += len(self.pending[-1])
        if self.size > len(self.merged):
            self.merged = self.sorted()

    def sorted(self) -> np.ndarray:
        """Every distinct code added, sorted."""
        if self.pending:
            self.merged = np.unique(np.concatenate([self.merged, *self.pending]))
            self.pending, self.size = [], 0
        return self.merged


def _pair_chunks(files: list[Path], chunk: int):
    """(a codes, b codes) of every pair file, chunk by chunk."""
    for f in files:
        pairs = open_array(f, PAIR)
        for s in range(0, len(pairs), chunk):
            p = np.array(pairs[s : s + chunk])
            release_pages(pairs)
            yield _codes(p["a_task"], p["a_local"]), _codes(p["b_task"], p["b_local"])


def cluster_task(
    pair_dir: Path, tok_dir: Path, n_tasks: int, out_dir: Path, chunk: int = 1 << 20
) -> None:
    """Join every bucket task's verified pairs into clusters; write each task's removals.

    Two passes over the pair files: the documents that have a partner (sorted codes), then
    union-find over them in keep order, so each cluster's root is the document to keep.
    Every file appears atomically; the summary, written last, marks the task done.
    """
    if (out_dir / SUMMARY).is_file():
        return
    files = sorted(pair_dir.glob("*.pairs"))
    meta = [json.loads(f.with_suffix(".json").read_text()) for f in files]
    exact_files = [f for f, m in zip(files, meta, strict=True) if m["channel"] == "exact"]
    nodes, copies = _UniqueCodes(), _UniqueCodes()  # copies: exact copies (not the first)
    for f in files:
        for a, b in _pair_chunks([f], chunk):
            nodes.add(a, b)
            if f in exact_files:
                copies.add(b)
    nodes, copies = nodes.sorted(), copies.sorted()
    task = (nodes >> np.uint64(32)).astype(np.uint32)
    local = (nodes & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    order = Priorities(tok_dir, n_tasks).order(task, local)  # rank -> node
    rank = np.empty(len(nodes), np.int64)
    rank[order] = np.arange(len(nodes))
    parent = None
    for a, b in _pair_chunks(files, chunk):
        ra, rb = rank[np.searchsorted(nodes, a)], rank[np.searchsorted(nodes, b)]
        parent = connected_roots(len(nodes), ra, rb, parent)
    root = order[parent[rank]] if parent is not None else np.arange(len(nodes))
    removed = root != np.arange(len(nodes))
    exact = np.isin(nodes, copies, assume_unique=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in range(n_tasks):
        m = removed & (task == t)
        rows = np.empty(int(m.sum()), REMOVAL)
        rows["local"], rows["exact"] = local[m], exact[m]
        rows["keep_task"], rows["keep_local"] = task[root[m]], local[root[m]]
        atomic_write_bytes(out_dir / f"{t:05d}.removed", rows.tobytes())
    near = [m for m in meta if m["channel"] != "exact"]
    atomic_write_json(
        out_dir / SUMMARY,
        {
            "candidate_pairs": sum(m["pairs"] for m in near),
            "verified_pairs": sum(m["kept"] for m in near),
            "clustered_documents": len(nodes),
        },
    )


def load_result(out_dir: Path, sizes: np.ndarray) -> DedupResult:
    """The cluster task's output as a DedupResult over all records (task-major order)."""
    offset = np.concatenate(([0], np.cumsum(sizes)))
    n = int(offset[-1])
    removed_exact, removed_near = np.zeros(n, bool), np.zeros(n, bool)
    cluster = np.arange(n, dtype=np.int64)
    for t in range(len(sizes)):
        rows = open_array(out_dir / f"{t:05d}.removed", REMOVAL)
        idx = offset[t] + rows["local"].astype(np.int64)
        ex = rows["exact"].astype(bool)
        removed_exact[idx[ex]] = True
        removed_near[idx[~ex]] = True
        cluster[idx] = offset[rows["keep_task"].astype(np.int64)] + rows["keep_local"]
    summary = json.loads((out_dir / SUMMARY).read_text())
    return DedupResult(
        removed_exact,
        removed_near,
        cluster,
        summary["candidate_pairs"],
        summary["verified_pairs"],
    )

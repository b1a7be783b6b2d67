"""Dedup clusters: LSH buckets over MinHash bands, verified pairs joined into clusters."""

from __future__ import annotations

import json
import mmap as mmap_module
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.dedup.signer import GOLDEN64
from lemur.data.recipe import DedupConfig
from lemur.shards.format import atomic_write_bytes, open_array

_PAIR_CHUNK = 65536  # records or pairs per block in the cluster stage


def load_signatures(sig_dir: Path, rank: int, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped (content hashes, MinHash signatures) of one task."""
    chash = open_array(sig_dir / f"{rank:05d}.chash.bin", np.uint64)
    sig = open_array(sig_dir / f"{rank:05d}.minhash.bin", np.uint32, (num_perm,))
    return chash, sig


def release_pages(arr: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process's resident set.

    Reading a whole signature file through a memmap would otherwise leave all of it
    resident (file-backed, but counted in RSS), growing memory with corpus size.
    """
    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mmap_module, "MADV_DONTNEED"):
        mm.madvise(mmap_module.MADV_DONTNEED)


def connected_roots(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Root (smallest member) of each node's component for edges a-b (vectorized union-find)."""
    parent = np.arange(n, dtype=np.int64)
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


def find_duplicates(
    sig_dir: Path,
    n_tasks: int,
    task: np.ndarray,
    local: np.ndarray,
    domain: np.ndarray,
    priority: np.ndarray,
    config: DedupConfig,
) -> DedupResult:
    """Exact and near-duplicate clusters over all tasks' signatures, keeping one per cluster.

    `task`/`local` locate each record's row in the per-task files; `domain` is an int per
    record (documents of different domains never match); `priority` orders documents, the
    smallest is kept.
    """
    n = len(task)
    # Work in priority order so that the smallest index in a cluster is the one to keep.
    order = np.argsort(priority, kind="stable")
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    chash = np.zeros(n, np.uint64)
    sigs: list[np.ndarray] = []
    for t in range(n_tasks):
        rows = task == t
        task_hash, task_sig = load_signatures(sig_dir, t, config.num_perm)
        chash[rows] = task_hash[local[rows]]
        if config.near:
            sigs.append(task_sig)
    dom = domain.astype(np.uint64)
    edges_a: list[np.ndarray] = []
    edges_b: list[np.ndarray] = []
    removed_exact = np.zeros(n, bool)
    if config.exact and n:
        # every later member of an exact-hash bucket is a copy of the bucket's first
        a, b = _pairs_in_buckets(_mix(chash, dom), rank)
        edges_a.append(a)
        edges_b.append(b)
        removed_exact[order[b]] = True
    candidates = verified = 0
    if config.near and n:
        band_keys = _band_keys(sigs, task, local, dom, config)
        for band in range(config.bands):
            a, b = _pairs_in_buckets(band_keys[:, band], rank)
            for start in range(0, len(a), _PAIR_CHUNK):
                ca, cb = a[start : start + _PAIR_CHUNK], b[start : start + _PAIR_CHUNK]
                candidates += len(ca)
                keep = _similarity(ca, cb, order, task, local, sigs) >= config.min_similarity
                verified += int(keep.sum())
                edges_a.append(ca[keep])
                edges_b.append(cb[keep])
    a = np.concatenate(edges_a) if edges_a else np.zeros(0, np.int64)
    b = np.concatenate(edges_b) if edges_b else np.zeros(0, np.int64)
    roots_rank = connected_roots(n, a, b)
    cluster = np.empty(n, np.int64)
    cluster[order] = order[roots_rank]
    removed_all = np.zeros(n, bool)
    removed_all[order] = roots_rank != np.arange(n)
    return DedupResult(removed_exact, removed_all & ~removed_exact, cluster, candidates, verified)


def _band_keys(
    sigs: list[np.ndarray],
    task: np.ndarray,
    local: np.ndarray,
    dom: np.ndarray,
    config: DedupConfig,
) -> np.ndarray:
    """LSH bucket key of every record in every band (n x bands uint64), domain mixed in."""
    keys = np.zeros((len(task), config.bands), np.uint64)
    with np.errstate(over="ignore"):
        for t, mm in enumerate(sigs):
            rows = np.flatnonzero(task == t)
            for start in range(0, len(rows), _PAIR_CHUNK):
                r = rows[start : start + _PAIR_CHUNK]
                block = np.asarray(mm[local[r]], np.uint64).reshape(
                    len(r), config.bands, config.rows
                )
                h = (dom[r] * GOLDEN64)[:, None] + np.uint64(1)
                for c in range(config.rows):
                    h = (h ^ block[:, :, c]) * GOLDEN64 + np.uint64(c + 1)
                keys[r] = h
                release_pages(mm)
    return keys


def _mix(x: np.ndarray, dom: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x ^ (dom * GOLDEN64 + np.uint64(0x632BE59BD9B4E019))


def _pairs_in_buckets(keys: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (in rank space) joining each bucket's members to its first member."""
    by_rank = np.empty_like(keys)
    by_rank[rank] = keys
    order = np.lexsort((np.arange(len(by_rank)), by_rank))
    sk = by_rank[order]
    same = np.concatenate(([False], sk[1:] == sk[:-1]))
    if not same.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    run_start = np.maximum.accumulate(np.where(~same, np.arange(len(sk)), 0))
    members = np.flatnonzero(same)
    return order[run_start[members]], order[members]


def _similarity(a, b, order, task, local, sigs) -> np.ndarray:
    """Estimated Jaccard (share of equal MinHash values) of record pairs given in rank space."""
    ra, rb = order[a], order[b]
    sa = np.zeros((len(a), sigs[0].shape[1]), np.uint32)
    sb = np.zeros_like(sa)
    for t, mm in enumerate(sigs):
        m = task[ra] == t
        sa[m] = mm[local[ra[m]]]
        m = task[rb] == t
        sb[m] = mm[local[rb[m]]]
    for mm in sigs:
        release_pages(mm)
    return (sa == sb).mean(axis=1)


def cluster_sizes(cluster: np.ndarray, removed: np.ndarray) -> dict[str, int]:
    """Histogram of duplicate cluster sizes (clusters of 2 or more documents)."""
    if not removed.any():
        return {}
    _, counts = np.unique(cluster, return_counts=True)
    counts = counts[counts > 1]
    sizes, freq = np.unique(counts, return_counts=True)
    return {str(int(s)): int(f) for s, f in zip(sizes, freq, strict=True)}


def write_duplicates(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write removed documents with their cluster representative, as JSONL (atomically)."""
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    atomic_write_bytes(path, payload.encode())

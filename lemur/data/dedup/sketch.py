"""Bottom-k sketches: the `k` smallest hashed shingles of each document, to verify candidates.

A document with at most `k` distinct shingles keeps all of them, so the Jaccard of two such
documents is exact; a longer one keeps a uniform sample (the `k` smallest hash values), and
the Jaccard of two documents is estimated on the region both sketches cover completely
(values up to the smaller of their largest kept values), a sample of at least `k` values of
the union: standard error sqrt(J (1 - J) / k) or less (Broder 1997; Cohen & Kaplan 2007).
Unlike a MinHash signature, it costs one hash per shingle whatever `k`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lemur.data.dedup.rows import RowFile

NONE = np.uint32(0xFFFFFFFF)  # padding; kept hash values are clamped below it
_KEY = np.uint64(0xD6E8FEB86659FD93)  # sketch hash: ((x ^ key) * mult) >> 32
_MULT = np.uint64(0xA0761D6478BD642F)


def bottom_k(shingle_hashes: np.ndarray, k: int) -> np.ndarray:
    """The `k` smallest distinct 32-bit hashes of a document's shingles, sorted."""
    with np.errstate(over="ignore"):
        h = (((shingle_hashes ^ _KEY) * _MULT) >> np.uint64(32)).astype(np.uint32)
    if len(h) > k:
        h = np.partition(h, k - 1)[:k]
    h.sort()
    if len(h) and h[-1] == NONE:  # NONE pads sketches: no kept value may equal it
        h[-1] = NONE - np.uint32(1)
    if len(h) > 1 and (h[1:] == h[:-1]).any():  # a rare 32-bit collision
        h = np.unique(h)
    return h


def sketch_jaccard(a: np.ndarray, b: np.ndarray, len_a, len_b, k: int) -> np.ndarray:
    """Jaccard of each row pair of padded sketches (n x w, NONE-padded), exact when both
    documents have fewer than `k` distinct shingles."""
    # A full sketch covers the values up to its last one; a short one covers everything.
    rows = np.arange(len(a))
    limit_a = np.where(len_a >= k, a[rows, np.maximum(len_a - 1, 0)], NONE - np.uint32(1))
    limit_b = np.where(len_b >= k, b[rows, np.maximum(len_b - 1, 0)], NONE - np.uint32(1))
    limit = np.minimum(limit_a, limit_b)[:, None]
    both = np.sort(np.concatenate([a, b], axis=1), axis=1)
    covered = both <= limit
    shared = ((both[:, 1:] == both[:, :-1]) & covered[:, 1:]).sum(axis=1)
    union = covered.sum(axis=1) - shared
    return np.where(union > 0, shared / np.maximum(union, 1), 1.0)


class Sketches:
    """The bottom-k sketches of every task, memory-mapped (`{task}.sketch.bin` + `.end`)."""

    def __init__(self, sig_dir: Path, n_tasks: int, k: int) -> None:
        self.k = k
        names = [Path(sig_dir) / f"{t:05d}.sketch" for t in range(n_tasks)]
        self.values = [RowFile(f"{n}.bin", np.uint32) for n in names]
        self.ends = [RowFile(f"{n}.end", np.uint64) for n in names]

    def gather(self, task: np.ndarray, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(NONE-padded sketches, lengths) of (task, local) documents."""
        start = np.zeros(len(task), np.int64)
        end = np.zeros(len(task), np.int64)
        for t in np.unique(task).tolist():
            m = task == t
            ends = self.ends[t]
            end[m] = ends[local[m]]
            prev = local[m].astype(np.int64) - 1
            start[m] = np.where(prev >= 0, ends[np.maximum(prev, 0)], 0)
        length = end - start
        out = np.full((len(task), max(1, int(length.max(initial=0)))), NONE, np.uint32)
        for t in np.unique(task).tolist():
            rows = np.flatnonzero(task == t)
            flat = self.values[t].read_ranges(start[rows], length[rows])
            n = length[rows]
            row = np.repeat(rows, n)
            out[row, np.arange(len(row)) - np.repeat(np.cumsum(n) - n, n)] = flat
        return out, length

    def jaccard(self, at, al, bt, bl) -> np.ndarray:
        """Jaccard (exact for short documents, else estimated) of document pairs."""
        a, la = self.gather(at, al)
        b, lb = self.gather(bt, bl)
        w = max(a.shape[1], b.shape[1])
        a = np.pad(a, ((0, 0), (0, w - a.shape[1])), constant_values=NONE)
        b = np.pad(b, ((0, 0), (0, w - b.shape[1])), constant_values=NONE)
        return sketch_jaccard(a, b, la, lb, self.k)

"""A streaming k-way merge of sorted runs, in blocks of complete equal-key groups.

Hand-written because the merge must hand over whole groups of equal keys with a bounded
buffer: `heapq.merge` works one Python object per entry (far too slow for billions of keys)
and knows nothing of groups. Each round reads at most `chunk` entries of every run (with
`pread`, not through a memory map: see rows.py), so memory depends on the number of runs
and the chunk size, never on the size of the corpus.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from lemur.data.dedup.rows import RowFile


@dataclass
class Block:
    """Entries of whole equal-key groups, sorted by key, then run (task), then local index."""

    key: np.ndarray
    task: np.ndarray
    local: np.ndarray


@dataclass
class BigGroup:
    """One key whose entries fill a whole buffer: where they lie in each run, to be streamed.

    `spans` holds (task, start, end) positions in the runs, read back in chunks by the caller.
    """

    key: int
    spans: list[tuple[int, int, int]]


def chunk_entries(buffer_bytes: int, n_runs: int) -> int:
    """Entries read per run and round so one round stays within `buffer_bytes`.

    A round holds the runs' buffers (12 bytes an entry), their merge (keys, tasks, locals,
    sort order: ~50 bytes) and the star pairing of its groups (keep-order fields and their
    sort, the pairs: ~80 bytes per entry at worst): 128 bytes per entry.
    """
    return max(16, buffer_bytes // (128 * max(1, n_runs)))


def merge_runs(
    runs: list[RowFile], lo: list[int], hi: list[int], chunk: int
) -> Iterator[Block | BigGroup]:
    """Merge runs[t][lo[t]:hi[t]] (sorted by key) into blocks of complete groups.

    A run whose buffer stops short of its end bounds the round: only keys below its last key
    are complete in every buffer. Entries at that key wait for the next round; when one key
    fills a whole buffer, it comes out as a `BigGroup` instead.
    """
    pos = list(lo)
    while True:
        live = [t for t in range(len(runs)) if pos[t] < hi[t]]
        if not live:
            return
        bufs = {t: runs[t][pos[t] : min(pos[t] + chunk, hi[t])] for t in live}
        ends = [int(bufs[t]["key"][-1]) for t in live if pos[t] + len(bufs[t]) < hi[t]]
        bound = min(ends) if ends else None
        take = {
            t: len(b) if bound is None else int(np.searchsorted(b["key"], np.uint64(bound)))
            for t, b in bufs.items()
        }
        if bound is not None and not any(take.values()):
            spans = [(t, pos[t], _span_end(runs[t], pos[t], hi[t], bound, chunk)) for t in live]
            for t, _, end in spans:
                pos[t] = end
            yield BigGroup(bound, [s for s in spans if s[2] > s[1]])
            continue
        parts = [(t, bufs[t][: take[t]]) for t in live if take[t]]
        key = np.concatenate([p["key"] for _, p in parts])
        task = np.concatenate([np.full(len(p), t, np.uint32) for t, p in parts])
        local = np.concatenate([p["local"] for _, p in parts])
        order = np.argsort(key, kind="stable")  # parts are in task order: ties stay in it
        for t, p in parts:
            pos[t] += len(p)
        yield Block(key[order], task[order], local[order])


def _span_end(run: RowFile, start: int, hi: int, key: int, chunk: int) -> int:
    """End of the entries equal to `key` from `start` on (read chunk by chunk)."""
    s = start
    k = np.uint64(key)
    while s < hi:
        seg = run[s : min(s + chunk, hi)]["key"]
        i = int(np.searchsorted(seg, k, side="right"))
        if i < len(seg):
            return s + i
        s += len(seg)
    return hi


def read_span(run: RowFile, start: int, end: int, chunk: int) -> Iterator[np.ndarray]:
    """The local indexes of run[start:end], chunk by chunk."""
    for s in range(start, end, chunk):
        yield run[s : min(s + chunk, end)]["local"]


def key_range(run: RowFile, part: int, parts: int) -> tuple[int, int]:
    """Positions [lo, hi) of the keys of a run in key range `part` of `parts` equal ranges."""
    edges = [(part * 2**64) // parts, ((part + 1) * 2**64) // parts]
    lo = 0 if part == 0 else _lower_bound(run, edges[0])
    hi = len(run) if part == parts - 1 else _lower_bound(run, edges[1])
    return lo, hi


def _lower_bound(run: RowFile, key: int) -> int:
    """First position whose key is >= `key`: a binary search of single-row reads."""
    lo, hi = 0, len(run)
    while lo < hi:
        mid = (lo + hi) // 2
        if int(run[mid : mid + 1]["key"][0]) < key:
            lo = mid + 1
        else:
            hi = mid
    return lo

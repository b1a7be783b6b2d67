"""Bucket tasks: merge one channel's sorted runs, pair equal keys, verify, write the pairs.

Within a group of equal keys, every member is paired with the group's first member in
keep order (source listed first, then longest, then smallest id hash, then task and local
index): a star of n - 1 pairs, not all n^2 / 2. Near pairs are verified by estimated
Jaccard (the share of equal MinHash values); exact pairs need no check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.dedup.merge import (
    BigGroup,
    Block,
    chunk_entries,
    key_range,
    merge_runs,
    read_span,
)
from lemur.data.dedup.rows import RowFile, raise_open_files_limit
from lemur.data.dedup.runs import EXACT, channel_name, open_run
from lemur.data.dedup.sketch import Sketches
from lemur.data.recipe.recipe import DedupConfig
from lemur.shards.format import atomic_write_bytes

# One verified pair: (kept-side task, local) -> (other task, local); kept side first in order.
PAIR = np.dtype([("a_task", "<u4"), ("a_local", "<u4"), ("b_task", "<u4"), ("b_local", "<u4")])


class Priorities:
    """Keep-order fields of every document, read from the tokenize tasks' records by memmap."""

    def __init__(self, tok_dir: Path, n_tasks: int) -> None:
        self.records = [RowFile.npy(Path(tok_dir) / f"{t:05d}.docs.npy") for t in range(n_tasks)]

    def sizes(self) -> np.ndarray:
        """Documents per task."""
        return np.array([len(r) for r in self.records], np.int64)

    def order(self, task: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Indexes sorting (task, local) documents by keep order (first = the one kept)."""
        src = np.zeros(len(task), np.int64)
        neg_tokens = np.zeros(len(task), np.int64)
        id_hash = np.zeros(len(task), np.uint64)
        for t in np.unique(task).tolist():
            m = task == t
            rec = self.records[t][local[m]]
            src[m] = rec["source"]
            neg_tokens[m] = -rec["tokens"].astype(np.int64)
            id_hash[m] = rec["id_hash"]
        return np.lexsort((local, task, id_hash, neg_tokens, src))


def star_pairs(block: Block, prio: Priorities) -> tuple[np.ndarray, ...]:
    """(first task, first local, member task, member local) of every group of a block."""
    key = block.key
    dup = np.zeros(len(key), bool)
    same = key[1:] == key[:-1]
    dup[1:] |= same
    dup[:-1] |= same
    key, task, local = key[dup], block.task[dup], block.local[dup]
    if not len(key):
        empty = np.zeros(0, np.uint32)
        return empty, empty, empty, empty
    by_prio = prio.order(task, local)
    order = by_prio[np.argsort(key[by_prio], kind="stable")]  # by key, then keep order
    key, task, local = key[order], task[order], local[order]
    start = np.concatenate(([True], key[1:] != key[:-1]))
    first = np.maximum.accumulate(np.where(start, np.arange(len(key)), 0))
    m = ~start
    return task[first[m]], local[first[m]], task[m], local[m]


def big_group_pairs(
    group: BigGroup, runs: list[RowFile], prio: Priorities, chunk: int
) -> Iterator[tuple[np.ndarray, ...]]:
    """Star pairs of a group too big for the buffers, in two streaming passes over its spans.

    The first pass finds the group's first member in keep order, the second pairs every
    other member with it; only one chunk of the group is in memory at a time.
    """
    best: tuple[int, int] | None = None
    for t, s, e in group.spans:
        for local in read_span(runs[t], s, e, chunk):
            task = np.full(len(local), t, np.uint32)
            if best is not None:  # the best so far competes with this chunk
                task = np.append(task, np.uint32(best[0]))
                local = np.append(local, np.uint32(best[1]))
            i = prio.order(task, local)[0]
            best = (int(task[i]), int(local[i]))
    assert best is not None
    for t, s, e in group.spans:
        for local in read_span(runs[t], s, e, chunk):
            local = local[~((t == best[0]) & (local == best[1]))]
            n = len(local)
            first_t, first_l = np.full(n, best[0], np.uint32), np.full(n, best[1], np.uint32)
            yield first_t, first_l, np.full(n, t, np.uint32), local


class Verifier:
    """Decides candidate pairs: MinHash estimate first, the bottom-k sketch when it is close.

    A pair whose MinHash estimate is more than 4 standard errors (at the threshold) from
    `min_similarity` is decided by it: it errs with probability ~3e-5. The rest, the pairs
    the estimate cannot tell apart, are decided by the Jaccard of their sketches, exact for
    documents with fewer than `sketch_size` distinct shingles.
    """

    def __init__(
        self, sig_dir: Path, n_tasks: int, config: DedupConfig, buffer_bytes: int = 64 << 20
    ) -> None:
        self.num_perm = config.num_perm
        row = np.dtype((np.uint32, (self.num_perm,)))
        self.sigs = [RowFile(Path(sig_dir) / f"{t:05d}.minhash.bin", row) for t in range(n_tasks)]
        self.threshold = t = config.min_similarity
        self.margin = 4 * math.sqrt(t * (1 - t) / self.num_perm)
        k = config.sketch_size
        self.sketches = Sketches(sig_dir, n_tasks, k) if k else None
        # Pairs per sketch batch: two sketches read, padded, joined and sorted (~64 x k bytes).
        self.batch = max(16, buffer_bytes // (64 * max(1, k)))

    def gather(self, task: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Signatures of (task, local) documents (n x num_perm)."""
        out = np.zeros((len(task), self.num_perm), np.uint32)
        for t in np.unique(task).tolist():
            m = task == t
            out[m] = self.sigs[t][local[m]]
        return out

    def keep(self, at, al, bt, bl) -> np.ndarray:
        """Mask of the pairs whose Jaccard reaches the threshold."""
        sim = (self.gather(at, al) == self.gather(bt, bl)).mean(axis=1)
        if self.sketches is None:
            return sim >= self.threshold
        ok = sim >= self.threshold + self.margin
        close = np.flatnonzero(~ok & (sim >= self.threshold - self.margin))
        for s in range(0, len(close), self.batch):
            i = close[s : s + self.batch]
            ok[i] = self.sketches.jaccard(at[i], al[i], bt[i], bl[i]) >= self.threshold
        return ok


def pairs_path(out_dir: Path, rank: int) -> Path:
    """The verified pairs of bucket task `rank` (its counts sit beside it as `.json`)."""
    return Path(out_dir) / f"{rank:05d}.pairs"


def bucket_task(
    tok_dir: Path,
    n_tasks: int,
    channel: int,
    part: tuple[int, int],
    config: DedupConfig,
    out_dir: Path,
    rank: int,
) -> None:
    """Merge one channel's runs over key range `part` = (index, count); write verified pairs.

    Files appear atomically (counts first, the pairs file last, which marks the task done);
    a task whose pairs file exists is finished and is not redone.
    """
    final = pairs_path(out_dir, rank)
    if final.is_file():
        return
    # a run, a record file, and for bands a signature and a sketch file per tokenize task
    raise_open_files_limit((2 if channel == EXACT else 5) * n_tasks + 64)
    runs = [open_run(tok_dir, t, channel) for t in range(n_tasks)]
    lo, hi = zip(*(key_range(r, *part) for r in runs), strict=True) if runs else ((), ())
    buffer = int(config.merge_buffer_mb * 2**20)
    chunk = chunk_entries(buffer, n_tasks)
    prio = Priorities(tok_dir, n_tasks)
    verify = None if channel == EXACT else Verifier(tok_dir, n_tasks, config, buffer)
    # Pairs verified at once: two signatures read, placed and compared (~20 x num_perm bytes).
    step = max(256, buffer // (20 * config.num_perm))
    found = kept = 0
    with atomic_open(final) as fh:  # renamed last: the pairs file marks the task done
        for item in merge_runs(runs, list(lo), list(hi), chunk):
            pieces = (
                [star_pairs(item, prio)]
                if isinstance(item, Block)
                else big_group_pairs(item, runs, prio, chunk)
            )
            for piece in pieces:
                for s in range(0, len(piece[0]), step):
                    at, al, bt, bl = (x[s : s + step] for x in piece)
                    found += len(at)
                    ok = verify.keep(at, al, bt, bl) if verify else np.ones(len(at), bool)
                    kept += int(ok.sum())
                    pairs = np.empty(int(ok.sum()), PAIR)
                    pairs["a_task"], pairs["a_local"] = at[ok], al[ok]
                    pairs["b_task"], pairs["b_local"] = bt[ok], bl[ok]
                    fh.write(pairs.tobytes())
        counts = {
            "channel": channel_name(channel),
            "part": list(part),
            "pairs": found,
            "kept": kept,
        }
        atomic_write_bytes(final.with_suffix(".json"), json.dumps(counts).encode())

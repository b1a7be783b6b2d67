"""External global shuffle: documents -> bucket files on disk -> one shuffled shard per bucket.

Every train document copy has a seeded shuffle key. Sorted by key, the copies are cut into
buckets of about `shard_tokens` tokens, so bucket b holds the b-th slice of the global
order. Phase 1 (scatter) reads the tokenized runs sequentially, task by task, appending each
copy's tokens to its bucket file; phase 2 (gather) loads one bucket at a time, orders it by
key and writes it as shard b. Memory holds one bucket plus ~40 bytes per document copy;
disk reads are sequential. Both phases resume after a kill: the scatter restarts as a unit
(its files are only trusted after its marker is written), and every finished shard is
skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lemur.shards.format import (
    INDEX_DTYPE,
    ShardInfo,
    atomic_write_json,
    write_shard,
)

__all__ = ["ShuffleError", "bucket_of", "external_shuffle"]

WRITE_BUFFER = 1 << 16  # per open bucket file; bounds memory with many buckets


def bucket_of(
    keys: np.ndarray, lengths: np.ndarray, shard_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """(key order, bucket of each entry): contiguous runs of the key order of ~shard_tokens."""
    order = np.lexsort((np.arange(len(keys)), keys))
    before = (
        np.concatenate(([0], np.cumsum(lengths[order])[:-1]))
        if len(keys)
        else np.zeros(0, np.int64)
    )
    # A document longer than a bucket skips bucket numbers; renumber so none is empty.
    _, bucket_sorted = np.unique(before // max(1, shard_tokens), return_inverse=True)
    bucket = np.empty(len(keys), np.int64)
    bucket[order] = bucket_sorted
    return order, bucket


def external_shuffle(
    task: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    keys: np.ndarray,
    open_run: Callable[[int], np.ndarray],
    work: Path,
    out: Path,
    dtype: np.dtype,
    shard_tokens: int,
    report: Callable[[str, int, int], None] | None = None,
    prefix: str = "",
) -> list[ShardInfo]:
    """Write entries (token slices [start, end) of task runs) as globally shuffled train shards.

    Shard b is `out/{prefix}/train/{b:05d}.bin`; the manifest paths include the prefix.
    """
    report = report or (lambda *_: None)
    lengths = (end - start).astype(np.int64)
    order, bucket = bucket_of(keys, lengths, shard_tokens)
    n_buckets = int(bucket.max()) + 1 if len(bucket) else 0
    plan = hashlib.sha256()
    for arr in (task, start, end, keys):
        plan.update(np.ascontiguousarray(arr).tobytes())
    plan.update(f"{shard_tokens}/{np.dtype(dtype).str}/{prefix}".encode())
    work = work / f"shuffle-{plan.hexdigest()[:16]}"
    # Read order: tasks in turn, each run front to back (sequential disk reads).
    read_order = np.lexsort((np.arange(len(task)), start, task))
    offset = _bucket_offsets(read_order, bucket, lengths)
    done_dir = work / "done"
    done = {b for b in range(n_buckets) if (done_dir / f"{b:05d}.json").is_file()}
    if len(done) < n_buckets and not (work / "scatter.done").is_file():
        _scatter(work, read_order, task, start, end, bucket, open_run, dtype, done, report)
    sorted_bucket = bucket[order]
    shards = []
    for b in range(n_buckets):
        info_path = done_dir / f"{b:05d}.json"
        if not info_path.is_file():
            lo = np.searchsorted(sorted_bucket, b, side="left")
            hi = np.searchsorted(sorted_bucket, b, side="right")
            rel = f"{prefix}/train/{b:05d}" if prefix else f"train/{b:05d}"
            _gather(work, b, order[lo:hi], offset, lengths, out, rel, dtype, info_path)
        shards.append(ShardInfo(**json.loads(info_path.read_text())))
        report("shuffle: write", b + 1, n_buckets)
    return shards


def _bucket_offsets(read_order: np.ndarray, bucket: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Token offset of each entry inside its bucket file, which is filled in read order."""
    read_pos = np.empty(len(read_order), np.int64)
    read_pos[read_order] = np.arange(len(read_order))
    grouped = np.lexsort((read_pos, bucket))  # by bucket, then in read order
    before = np.cumsum(lengths[grouped]) - lengths[grouped]
    first = np.searchsorted(bucket[grouped], bucket[grouped], side="left")
    offset = np.empty(len(read_order), np.int64)
    offset[grouped] = before - before[first]
    return offset


def _scatter(work, read_order, task, start, end, bucket, open_run, dtype, skip, report) -> None:
    """Append every entry's tokens to its bucket file, reading runs sequentially."""
    for stale in work.glob("bucket-*.bin"):
        stale.unlink()  # a scatter killed half way is redone from the start
    work.mkdir(parents=True, exist_ok=True)
    handles: dict[int, object] = {}
    try:
        n = len(read_order)
        for j, i in enumerate(read_order.tolist()):
            b = int(bucket[i])
            if b in skip:
                continue
            fh = handles.get(b)
            if fh is None:
                fh = handles[b] = open(work / f"bucket-{b:05d}.bin", "wb", buffering=WRITE_BUFFER)
            fh.write(np.asarray(open_run(int(task[i]))[start[i] : end[i]], dtype).tobytes())
            if j % 4096 == 0:
                report("shuffle: scatter", j, n)
        report("shuffle: scatter", n, n)
    finally:
        for fh in handles.values():
            fh.close()
    (work / "scatter.done").write_text("ok\n")


class ShuffleError(RuntimeError):
    """The shuffle's work files are missing or inconsistent (the message names the file)."""


def _gather(work, b, members, offset, lengths, out, rel, dtype, info_path) -> None:
    """Order bucket b's entries by key and write them as shard `rel` (atomically)."""
    path = work / f"bucket-{b:05d}.bin"
    need = int(lengths[members].sum()) * np.dtype(dtype).itemsize
    # A missing or short bucket is never read as empty: that would write a shard of fewer
    # tokens than its index claims (seen when another process deleted the work files).
    size = path.stat().st_size if path.is_file() else -1
    if size != need:
        state = "missing" if size < 0 else f"{size} bytes, expected {need}"
        raise ShuffleError(
            f"{path}: shuffle bucket {state}; its work files were changed by another process "
            f"or a damaged disk: rerun the build"
        )
    data = np.fromfile(path, dtype=dtype)
    parts = [data[offset[i] : offset[i] + lengths[i]] for i in members.tolist()]
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    ends = np.cumsum(lengths[members]).astype(INDEX_DTYPE)
    info = write_shard(out, rel, tokens, ends, dtype, "train", "mixed")
    atomic_write_json(info_path, info.to_json())
    if path.is_file():
        os.remove(path)  # its shard is final; free the disk space now

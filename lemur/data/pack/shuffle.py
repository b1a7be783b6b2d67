"""External global shuffle: documents -> bucket files on disk -> one shuffled shard per bucket.

Every train document copy has a seeded shuffle key. Sorted by key, the copies are cut into
buckets of about `shard_tokens` tokens, so bucket b holds the b-th slice of the global
order. Phase 1 (scatter) reads the tokenized runs sequentially, task by task, appending each
copy's tokens to its bucket file; phase 2 (gather) loads one bucket at a time, orders it by
key and writes it as shard b. Memory holds one bucket plus ~40 bytes per document copy;
disk reads are sequential. Both phases resume after a kill: the scatter restarts as a unit
(its files are only trusted after its marker is written), and every finished shard is
skipped. In chat builds every copy's loss mask travels beside its tokens, byte for byte, in
a `.mask` bucket file of the same layout (one uint8 per token).
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
    MASK_DTYPE,
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
    open_mask: Callable[[int], np.ndarray] | None = None,
) -> list[ShardInfo]:
    """Write entries (token slices [start, end) of task runs) as globally shuffled train shards.

    Shard b is `out/{prefix}/train/{b:05d}.bin`; the manifest paths include the prefix.
    With `open_mask` (a task's loss mask, aligned with its run), shards get `.mask` files.
    """
    report = report or (lambda *_: None)
    lengths = (end - start).astype(np.int64)
    order, bucket = bucket_of(keys, lengths, shard_tokens)
    n_buckets = int(bucket.max()) + 1 if len(bucket) else 0
    plan = hashlib.sha256()
    for arr in (task, start, end, keys):
        plan.update(np.ascontiguousarray(arr).tobytes())
    plan.update(f"{shard_tokens}/{np.dtype(dtype).str}/{prefix}".encode())
    if open_mask is not None:
        plan.update(b"/mask")
    work = work / f"shuffle-{plan.hexdigest()[:16]}"
    # Read order: tasks in turn, each run front to back (sequential disk reads).
    read_order = np.lexsort((np.arange(len(task)), start, task))
    offset = _bucket_offsets(read_order, bucket, lengths)
    done_dir = work / "done"
    done = {b for b in range(n_buckets) if (done_dir / f"{b:05d}.json").is_file()}
    if len(done) < n_buckets and not (work / "scatter.done").is_file():
        runs = (open_run, open_mask)
        _scatter(work, read_order, task, start, end, bucket, runs, dtype, done, report)
    sorted_bucket = bucket[order]
    shards = []
    for b in range(n_buckets):
        info_path = done_dir / f"{b:05d}.json"
        if not info_path.is_file():
            lo = np.searchsorted(sorted_bucket, b, side="left")
            hi = np.searchsorted(sorted_bucket, b, side="right")
            rel = f"{prefix}/train/{b:05d}" if prefix else f"train/{b:05d}"
            members = order[lo:hi]
            _gather(work, b, members, offset, lengths, out, rel, dtype, info_path, open_mask)
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


def _scatter(work, read_order, task, start, end, bucket, runs, dtype, skip, report) -> None:
    """Append every entry's tokens (and mask) to its bucket files, reading runs sequentially."""
    open_run, open_mask = runs
    for stale in [*work.glob("bucket-*.bin"), *work.glob("bucket-*.mask")]:
        stale.unlink()  # a scatter killed half way is redone from the start
    work.mkdir(parents=True, exist_ok=True)
    handles: dict[int, object] = {}
    masks: dict[int, object] = {}
    try:
        n = len(read_order)
        for j, i in enumerate(read_order.tolist()):
            b, t = int(bucket[i]), int(task[i])
            if b in skip:
                continue
            if b not in handles:
                handles[b] = open(work / f"bucket-{b:05d}.bin", "wb", buffering=WRITE_BUFFER)
                if open_mask is not None:
                    masks[b] = open(work / f"bucket-{b:05d}.mask", "wb", buffering=WRITE_BUFFER)
            handles[b].write(np.asarray(open_run(t)[start[i] : end[i]], dtype).tobytes())
            if open_mask is not None:
                masks[b].write(np.asarray(open_mask(t)[start[i] : end[i]], MASK_DTYPE).tobytes())
            if j % 4096 == 0:
                report("shuffle: scatter", j, n)
        report("shuffle: scatter", n, n)
    finally:
        for fh in [*handles.values(), *masks.values()]:
            fh.close()
    (work / "scatter.done").write_text("ok\n")


class ShuffleError(RuntimeError):
    """The shuffle's work files are missing or inconsistent (the message names the file)."""


def _read_bucket(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    """A bucket file's array, checked to hold exactly `tokens` values."""
    need = tokens * np.dtype(dtype).itemsize
    # A missing or short bucket is never read as empty: that would write a shard of fewer
    # tokens than its index claims (seen when another process deleted the work files).
    size = path.stat().st_size if path.is_file() else -1
    if size != need:
        state = "missing" if size < 0 else f"{size} bytes, expected {need}"
        raise ShuffleError(
            f"{path}: shuffle bucket {state}; its work files were changed by another process "
            f"or a damaged disk: rerun the build"
        )
    return np.fromfile(path, dtype=dtype)


def _gather(work, b, members, offset, lengths, out, rel, dtype, info_path, open_mask) -> None:
    """Order bucket b's entries by key and write them as shard `rel` (atomically)."""
    total = int(lengths[members].sum())
    paths = [work / f"bucket-{b:05d}.bin"]
    arrays = [_read_bucket(paths[0], dtype, total)]
    if open_mask is not None:
        paths.append(work / f"bucket-{b:05d}.mask")
        arrays.append(_read_bucket(paths[1], MASK_DTYPE, total))
    ordered = []
    for data in arrays:
        parts = [data[offset[i] : offset[i] + lengths[i]] for i in members.tolist()]
        ordered.append(np.concatenate(parts) if parts else np.zeros(0, data.dtype))
    ends = np.cumsum(lengths[members]).astype(INDEX_DTYPE)
    mask = ordered[1] if open_mask is not None else None
    info = write_shard(out, rel, ordered[0], ends, dtype, "train", "mixed", mask)
    atomic_write_json(info_path, info.to_json())
    for path in paths:
        if path.is_file():
            os.remove(path)  # its shard is final; free the disk space now

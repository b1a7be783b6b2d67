"""External shuffle as two sets of tasks: scatter (one per tokenize task), gather (one per shard).

Scatter task t applies the plan to tokenize task t's documents (val, mix copies), gives
every copy a seeded shuffle key whose top bits pick its output shard (bucket), and writes
the copies' tokens ordered by (bucket, key) into `scatter-{t}.bin` (and, in chat builds,
their loss masks byte for byte into `scatter-{t}.mask`), with each copy's key and length
(`.keys`) and where each bucket starts (`.offsets`). Gather task b reads bucket b's range
from every scatter task's files, orders the copies by key (one shard in memory) and writes
shard b. Every file appears atomically; a finished scatter task's summary and a finished
shard's `done/{b}.json` are never rewritten, so a killed task reruns alone.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.mix import seeded_hash
from lemur.data.pack.select import bucket_of, keys_of, shuffle_keys, task_fates
from lemur.data.pack.settings import PackSettings
from lemur.data.runs import provenance
from lemur.data.runs.format import task_records
from lemur.shards.format import (
    INDEX_DTYPE,
    MASK_DTYPE,
    ShardInfo,
    atomic_write_bytes,
    atomic_write_json,
    open_array,
    release_pages,
    write_shard,
)

__all__ = [
    "ScatterTotals",
    "ShuffleError",
    "check_scatter",
    "gather_task",
    "read_summaries",
    "scatter_task",
    "summary_path",
]

KEYREC = np.dtype([("key", "<u8"), ("length", "<u8")])
CHUNK = 1 << 13  # copies written per write call


class ShuffleError(RuntimeError):
    """The shuffle's work files are missing or inconsistent (the message names the file)."""


BUCKETS, DONE = "buckets", "done"  # scatter files, finished shards' entries (under work)


def _name(rank: int, ext: str) -> str:
    return f"{BUCKETS}/scatter-{rank:05d}.{ext}"


def summary_path(work: Path, rank: int) -> Path:
    """Scatter task `rank`'s summary, written last: its presence marks the task's files done."""
    return work / _name(rank, "json")


def _slices(run: np.ndarray, start: np.ndarray, end: np.ndarray, dtype: np.dtype):
    """The bytes of run[start[i]:end[i]] for every i, a chunk of copies at a time."""
    for c in range(0, len(start), CHUNK):
        parts = [run[s:e] for s, e in zip(start[c : c + CHUNK], end[c : c + CHUNK], strict=True)]
        yield np.asarray(np.concatenate(parts), dtype).tobytes()
        release_pages(run)  # the run's pages read so far leave this process's resident set


def scatter_task(
    rank: int, tok_dir: Path, dedup_dir: Path | None, work: Path, settings: PackSettings
) -> dict:
    """Scatter tokenize task `rank` into bucket order; return (and write) its summary."""
    done = summary_path(work, rank)
    if done.is_file():
        return json.loads(done.read_text())
    g = settings.groups
    rec = task_records(tok_dir, rank, dedup_dir)
    fates = task_fates(rec, g, settings.val_cut, settings.unit_bins())
    entry, key = shuffle_keys(rec, fates.copies, g.seed)
    bucket = bucket_of(key, settings.train_shards).astype(np.int64)
    vidx = np.flatnonzero(fates.val)
    vkey = seeded_hash(rec.id_hash[vidx], g.seed, "val-order")
    vbucket = np.zeros(len(vidx), np.int64)
    vdomain = np.array(g.domains, dtype=object)[rec.source[vidx]]
    first = settings.train_shards
    for d, n in settings.val_shards.items():
        m = vdomain == d
        vbucket[m] = first + bucket_of(vkey[m], max(1, n)).astype(np.int64)
        first += n
    entry, key = np.concatenate([entry, vidx]), np.concatenate([key, vkey])
    bucket = np.concatenate([bucket, vbucket])
    order = np.lexsort((key, bucket))
    entry, key, bucket = entry[order], key[order], bucket[order]
    start, end = rec.start[entry], rec.end[entry]
    dtype = settings.dtype
    (work / BUCKETS).mkdir(parents=True, exist_ok=True)
    run = open_array(tok_dir / f"{rank:05d}.bin", dtype)
    with atomic_open(work / _name(rank, "bin")) as fh:
        fh.writelines(_slices(run, start, end, dtype))
    if settings.masks:
        mask = open_array(tok_dir / f"{rank:05d}.mask", MASK_DTYPE)
        with atomic_open(work / _name(rank, "mask")) as fh:
            fh.writelines(_slices(mask, start, end, MASK_DTYPE))
    keys = np.zeros(len(entry), KEYREC)
    keys["key"], keys["length"] = key, end - start
    atomic_write_bytes(work / _name(rank, "keys"), keys.tobytes())
    if provenance.run_has_rows(tok_dir):  # a build with `output.provenance`
        rows = provenance.read_task(tok_dir, rank, len(rec))
        sizes = provenance.cluster_sizes(dedup_dir, rank, len(rec))
        provenance.write_scatter(work / _name(rank, provenance.SCATTER_SUFFIX), rows, entry, sizes)
    edges = np.searchsorted(bucket, np.arange(first + 1), side="left")
    tok_edges = np.concatenate(([0], np.cumsum(end - start)))[edges]
    atomic_write_bytes(work / _name(rank, "offsets"), np.stack([edges, tok_edges], 1).tobytes())
    summary = summarize(rec, fates)
    atomic_write_json(done, summary)  # last: marks the task's files complete
    return summary


def summarize(rec, fates) -> dict:
    """Per (source, language): pool, selected and val documents and tokens; dedup removals."""
    keys, key = keys_of(rec)
    weight = fates.copies
    columns = (
        fates.pool,
        rec.tokens * fates.pool,
        weight > 0,
        weight,
        rec.tokens * weight,
        fates.val,
        rec.tokens * fates.val,
    )
    sums = np.zeros((len(keys), len(columns)), np.int64)
    for j, col in enumerate(columns):
        np.add.at(sums[:, j], key, col.astype(np.int64))
    exact = np.bincount(rec.source[rec.removed_exact])
    near = np.bincount(rec.source[rec.removed & ~rec.removed_exact])
    return {
        "documents": len(rec),
        "groups": {_json_key(k): row for k, row in zip(keys, sums.tolist(), strict=True)},
        "removed_exact": {str(s): int(n) for s, n in enumerate(exact.tolist()) if n},
        "removed_near": {str(s): int(n) for s, n in enumerate(near.tolist()) if n},
    }


GROUP_FIELDS = (
    "pool_docs",
    "pool_tokens",
    "selected_docs",
    "copies",
    "selected_tokens",
    "val_docs",
    "val_tokens",
)


def _json_key(key: tuple[int, str]) -> str:
    """A (source, language) key as a JSON object key (the summary file's only encoding)."""
    return f"{key[0]}\t{key[1]}"


def _from_json_key(text: str) -> tuple[int, str]:
    source, language = text.split("\t", 1)
    return int(source), language


@dataclass
class ScatterTotals:
    """The scatter tasks' summaries summed: GROUP_FIELDS per (source, language), removals."""

    groups: dict[tuple[int, str], np.ndarray]
    removed_exact: np.ndarray  # documents per source
    removed_near: np.ndarray

    def total(self, field: str, pick: Callable[[int, str], bool] = lambda *_: True) -> int:
        """Sum of one GROUP_FIELDS column over the (source, language) keys that `pick` takes."""
        i = GROUP_FIELDS.index(field)
        return int(sum(v[i] for (s, lang), v in self.groups.items() if pick(s, lang)))


def read_summaries(work: Path, n_tasks: int, n_sources: int) -> ScatterTotals:
    """Sum every finished scatter task's summary."""
    totals = ScatterTotals({}, np.zeros(n_sources, np.int64), np.zeros(n_sources, np.int64))
    for t in range(n_tasks):
        s = json.loads(summary_path(work, t).read_text())
        for k, v in s["groups"].items():
            key = _from_json_key(k)
            totals.groups[key] = totals.groups.get(key, np.zeros(len(GROUP_FIELDS), np.int64)) + v
        for src, n in s["removed_exact"].items():
            totals.removed_exact[int(src)] += n
        for src, n in s["removed_near"].items():
            totals.removed_near[int(src)] += n
    return totals


def _check_size(path: Path, dtype: np.dtype, expected: int) -> None:
    """Raise unless a scatter file holds exactly `expected` values of `dtype`."""
    need = expected * np.dtype(dtype).itemsize
    # A missing or short file is never read as empty: that would write a shard of fewer
    # tokens than its index claims (seen when another process deleted the work files).
    size = path.stat().st_size if path.is_file() else -1
    if size != need:
        state = "missing" if size < 0 else f"{size} bytes, expected {need}"
        raise ShuffleError(f"{path}: shuffle bucket {state}")


def _read(path: Path, dtype: np.dtype, lo: int, hi: int, expected: int) -> np.ndarray:
    """Values [lo, hi) of a scatter file that must hold exactly `expected` values."""
    _check_size(path, dtype, expected)
    return np.fromfile(path, dtype=dtype, count=hi - lo, offset=lo * np.dtype(dtype).itemsize)


def _read_into(path: Path, lo: int, expected: int, into: np.ndarray) -> None:
    """Fill `into` with values [lo, lo + len(into)) of a scatter file of `expected` values."""
    _check_size(path, into.dtype, expected)
    with open(path, "rb") as fh:
        fh.seek(lo * into.dtype.itemsize)
        if fh.readinto(memoryview(into).cast("B")) != into.nbytes:
            raise ShuffleError(f"{path}: shuffle bucket shorter than its offsets")


def check_scatter(work: Path, n_tasks: int, dtype: np.dtype, masks: bool) -> list[tuple[int, str]]:
    """(task, problem) of every scatter task whose files are missing or of the wrong size."""
    bad = []
    for t in range(n_tasks):
        try:
            off = open_array(work / _name(t, "offsets"), "<i8", (2,))
            n, tokens = int(off[-1, 0]), int(off[-1, 1])
            _read(work / _name(t, "keys"), KEYREC, 0, 0, n)
            _read(work / _name(t, "bin"), dtype, 0, 0, tokens)
            if masks:
                _read(work / _name(t, "mask"), MASK_DTYPE, 0, 0, tokens)
        except (OSError, ShuffleError, IndexError) as e:
            problem = str(e) if isinstance(e, ShuffleError) else f"{_name(t, 'offsets')}: {e}"
            bad.append((t, problem))
    return bad


@dataclass(frozen=True)
class BucketPart:
    """One scatter task's part of a bucket: copies [first_copy, end_copy) and tokens
    [first_token, end_token) of its files, which hold `copies` copies and `tokens` tokens."""

    task: int
    first_copy: int
    end_copy: int
    first_token: int
    end_token: int
    copies: int
    tokens: int


def _shuffled(
    work: Path,
    parts: list[BucketPart],
    ext: str,
    dtype: np.dtype,
    total: int,
    src: list,
    size: list,
) -> np.ndarray:
    """One layer (tokens or mask) of a shard: every task's part read into one buffer, then
    copied document by document into shuffled order (`src`, `size`: each copy's place)."""
    read = np.empty(total, dtype)
    pos = 0
    for p in parts:
        n = p.end_token - p.first_token
        _read_into(work / _name(p.task, ext), p.first_token, p.tokens, read[pos : pos + n])
        pos += n
    shuffled = np.empty(total, dtype)
    dst = 0
    for s, n in zip(src, size, strict=True):
        shuffled[dst : dst + n] = read[s : s + n]
        dst += n
    return shuffled


# The final writer, a seam: (root, rel, tokens, document ends, dtype, split, domain, mask or
# None) -> the shard's manifest entry. lemur's shards are one writer (`write_shard`); an
# export format is another, handed the same shuffled documents.
ShardWriter = Callable[..., ShardInfo]


def gather_task(
    b: int,
    work: Path,
    n_tasks: int,
    out: Path,
    shard: tuple[str, str, str],
    settings: PackSettings,
    writer: ShardWriter = write_shard,
) -> None:
    """Write shard `b` (`shard`: path without extension, split, domain) from every scatter task
    with `writer` (default: lemur's shards).

    Holds the shard twice (as read, then in shuffled order) plus ~100 bytes per document:
    every task's part is read straight into one buffer, and the shuffled copy is filled
    document by document, never through a list of per-document arrays.
    """
    info_path = work / DONE / f"{b:05d}.json"
    if info_path.is_file():
        return  # finished shards are never rewritten
    dtype, masks = settings.dtype, settings.masks
    parts = []
    for t in range(n_tasks):
        off = open_array(work / _name(t, "offsets"), "<i8", (2,))
        (e0, t0), (e1, t1) = off[b].tolist(), off[b + 1].tolist()
        if e1 > e0:
            parts.append(BucketPart(t, e0, e1, t0, t1, int(off[-1, 0]), int(off[-1, 1])))
    if not parts:
        atomic_write_json(info_path, {"empty": True})
        return
    keys = np.concatenate(
        [
            _read(work / _name(p.task, "keys"), KEYREC, p.first_copy, p.end_copy, p.copies)
            for p in parts
        ]
    )
    order = np.lexsort((np.arange(len(keys)), keys["key"]))  # ties: task, then scatter order
    lengths = keys["length"].astype(np.int64)
    del keys
    starts = np.cumsum(lengths) - lengths
    ends = np.cumsum(lengths[order])
    total = int(ends[-1]) if len(ends) else 0
    if total != sum(p.end_token - p.first_token for p in parts):
        raise ShuffleError(f"{work / BUCKETS}: bucket {b}: copy lengths disagree with the offsets")
    src, size = starts[order].tolist(), lengths[order].tolist()  # once for every layer
    layers = [("bin", dtype)] + ([("mask", np.dtype(MASK_DTYPE))] if masks else [])
    ordered = [_shuffled(work, parts, ext, dt, total, src, size) for ext, dt in layers]
    rel, split, domain = shard
    info = writer(
        out,
        rel,
        ordered[0],
        ends.astype(INDEX_DTYPE),
        dtype,
        split,
        domain,
        ordered[1] if masks else None,
    )
    atomic_write_json(info_path, _documents(info, work, parts, order, out, rel).to_json())


def _documents(
    info: ShardInfo, work: Path, parts: list[BucketPart], order: np.ndarray, out: Path, rel: str
) -> ShardInfo:
    """With `output.provenance` (the scatter tasks wrote rows), write the shard's
    documents.parquet, its rows in the shard's document order, and name it in `info`."""
    paths = [work / _name(p.task, provenance.SCATTER_SUFFIX) for p in parts]
    if not any(p.is_file() for p in paths):
        return info
    try:
        rows = [
            provenance.read_scatter(path, p.first_copy, p.end_copy, p.copies)
            for path, p in zip(paths, parts, strict=True)
        ]
    except ValueError as e:
        raise ShuffleError(f"{e}; rerun the build to redo the shuffle") from None
    table = provenance.concat(rows).take(order)
    name, sha = provenance.write_shard_rows(out, rel, table)
    return dataclasses.replace(info, provenance=name, provenance_sha256=sha)

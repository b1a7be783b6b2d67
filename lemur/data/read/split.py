"""Big inputs in parts, so that one large file keeps many tasks busy instead of one.

At listing time an input larger than `executor.split_bytes` is cut into parts, each read by
whichever task it falls to: a parquet file with more than one row group into runs of whole
row groups (planned from the footer alone), a plain jsonl file into byte ranges. A gzip or
zstd stream cannot be entered in the middle, so a compressed file stays one unit of work;
users with big compressed files should shard them. An `oasst1` chat file is never split:
its message trees span rows and are grouped per file.

A byte-range part [start, end) owns the lines that *start* inside it: a part with
start > 0 skips the rest of the line holding byte start - 1 (when that byte is a newline,
nothing is skipped, so a line starting exactly at `start` is kept), and it reads lines
while a line's first byte is before `end`. Every line is so read exactly once, whatever
the boundaries; a newline byte never occurs inside a multi-byte UTF-8 character.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from lemur.data.read.compressed import (
    Opener,
    UnsupportedInput,
    check_encoding,
    compression_of,
    is_parquet,
    open_local,
)
from lemur.data.recipe.sources import SourceConfig

BYTES = "bytes"  # a jsonl part: bytes [start, end) of the file
ROW_GROUPS = "row_groups"  # a parquet part: row groups [start, end)
HEAD_BYTES = 1 << 16  # the head of a jsonl file checked for its encoding before splitting
Bounds = list[tuple[int, int]]


def split_kind(source: SourceConfig, path: str, opener: Opener = open_local) -> str | None:
    """`jsonl` or `parquet` when a file of `source` may be split, else None."""
    if source.format in ("jsonl", "parquet"):
        return source.format
    if source.format == "stack-v2":  # metadata parquet: its rows split like any parquet's
        return "parquet"
    if source.format == "chat" and source.schema != "oasst1":
        return "parquet" if is_parquet(path, opener) else "jsonl"
    return None  # `files`: one document per file; oasst1: trees span the file's rows


def byte_ranges(size: int, split_bytes: int) -> Bounds:
    """[start, end) of ceil(size / split_bytes) byte ranges of (nearly) equal size."""
    n = max(1, -(-size // split_bytes))
    return [(i * size // n, (i + 1) * size // n) for i in range(n)]


def row_group_runs(sizes: list[int], split_bytes: int) -> Bounds:
    """[start, end) runs of whole row groups, about `split_bytes` of `sizes` each.

    The file's total is cut into ceil(total / split_bytes) even shares and a run ends at
    the first row group reaching its share, so the runs stay even when groups are uneven.
    """
    total = sum(sizes)
    n = min(len(sizes), -(-total // split_bytes)) if total > 0 else 1
    cuts, done, k = [0], 0, 1
    for i, size in enumerate(sizes[:-1]):
        done += size
        if k < n and done * n >= k * total:
            cuts.append(i + 1)
            while k < n and done * n >= k * total:
                k += 1
    cuts.append(len(sizes))
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _parquet_runs(path: str, split_bytes: int, opener: Opener) -> Bounds | None:
    """Row-group runs of a parquet file from its footer; None if it cannot be read."""
    import pyarrow.parquet as pq

    try:
        with opener(path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except Exception:  # noqa: BLE001 - the reader reports an unreadable file, once
        return None
    if meta.num_row_groups < 2:
        return None
    sizes = []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        sizes.append(sum(group.column(c).total_compressed_size for c in range(group.num_columns)))
    return row_group_runs(sizes, split_bytes)


def _plain_utf8(path: str, opener: Opener) -> bool:
    """Whether a jsonl file is uncompressed and its first line not UTF-16/32 (seekable lines)."""
    if compression_of(path, opener) is not None:
        return False
    with opener(path) as fh:
        head = fh.read(HEAD_BYTES)
    try:
        check_encoding(head.split(b"\n", 1)[0])
    except UnsupportedInput:  # left whole: its reader reports the encoding once
        return False
    return True


def plan_parts(
    path: str,
    source: SourceConfig,
    split_bytes: int,
    size: int = -1,
    opener: Opener = open_local,
) -> tuple[str, Bounds] | None:
    """(unit, bounds) of the parts of a file bigger than `split_bytes`; None: keep it whole.

    `size`, when known (a remote listing), saves asking for it; `opener` opens the file.
    """
    try:
        # The size first: only big files are opened (for a footer or a head) while listing.
        size = size if size >= 0 else os.path.getsize(path)
        if split_bytes <= 0 or size <= split_bytes:
            return None
        kind = split_kind(source, path, opener)
        if kind == "parquet":
            runs = _parquet_runs(path, split_bytes, opener)
            return (ROW_GROUPS, runs) if runs and len(runs) > 1 else None
        if kind == "jsonl" and _plain_utf8(path, opener):
            return BYTES, byte_ranges(size, split_bytes)
    except OSError:  # the reader reports the unreadable file
        return None
    return None


def part_lines(
    path: str, start: int, end: int, opener: Opener = open_local
) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) of every line of `path` that starts in [start, end)."""
    with opener(path) as fh:
        pos = start
        if start > 0:
            fh.seek(start - 1)
            pos = start - 1 + len(fh.readline())  # past the line that holds byte start - 1
        while pos < end:
            raw = fh.readline()
            if not raw:
                return
            yield pos, raw
            pos += len(raw)

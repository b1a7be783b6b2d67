"""What the re-chunked formats (litdata, MDS, parquet) share: a shard's arrays, the dataset
folder a shard goes to, and whole documents grouped under a byte cap.

These formats cannot reuse our `.bin`: they frame documents in files of their own. Each
streams one lemur shard at a time from memory maps and writes bounded groups of whole
documents, so memory stays flat however large the corpus; the grouping is a pure function
of the `.idx`, so a format's `finish` recomputes what `write_part` wrote without having
to carry state between the two.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

import numpy as np

from lemur.export.files import document_ends
from lemur.export.formats import ExportError, ShardPart
from lemur.shards.format import MASK_DTYPE, open_array

# The offsets of litdata chunks and MDS shards are uint32 byte positions.
UINT32_LIMIT = 1 << 32


def part_arrays(part: ShardPart) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Memory maps of a shard's tokens and mask (None without), its document ends (int64)."""
    tokens = open_array(part.tokens, np.dtype(part.token_dtype).newbyteorder("<"))
    ends = document_ends(part)
    mask = open_array(part.mask, MASK_DTYPE) if part.mask is not None else None
    total = int(ends[-1]) if len(ends) else 0
    if total != len(tokens):
        raise ExportError(f"{part.index}: documents end at {total}, the shard has {len(tokens)}")
    if mask is not None and len(mask) != len(tokens):
        raise ExportError(f"{part.mask}: {len(mask)} mask values for {len(tokens)} tokens")
    return tokens, ends, mask


def dataset_folder(part: ShardPart) -> str:
    """The folder under OUT a part's files go to: "train" or "val/<domain>"."""
    return str(PurePosixPath(part.stem).parent)


def by_folder(parts: Iterable[ShardPart]) -> dict[str, list[ShardPart]]:
    """The parts of each dataset folder, in the order given (the driver's: shuffled train
    order, then each val domain's shards)."""
    folders: dict[str, list[ShardPart]] = {}
    for part in parts:
        folders.setdefault(dataset_folder(part), []).append(part)
    return folders


def capped_groups(sizes: np.ndarray, fixed: int, cap: int) -> list[tuple[int, int]]:
    """Consecutive documents `[a, b)` whose `sizes` plus `fixed` bytes fit in `cap` bytes.

    Greedy, as MDSWriter's `size_limit` is (a group closes before the document that would
    pass the cap); a document larger than the cap alone gets a group of its own.
    """
    cum = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, dtype=np.int64, out=cum[1:])
    groups, a = [], 0
    while a < len(sizes):
        b = int(np.searchsorted(cum, cum[a] + cap - fixed, side="right")) - 1
        b = min(max(b, a + 1), len(sizes))
        groups.append((a, b))
        a = b
    return groups

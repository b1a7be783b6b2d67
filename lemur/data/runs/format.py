"""One tokenize task's per-document records (source, language, length, hashes, removals).

The pack stage never loads every task's records at once: each of its tasks reads the
records of one tokenize task (~30 bytes per document on disk) with `task_records`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.data.dedup.cluster import REMOVAL
from lemur.data.dedup.stage import CLUSTER
from lemur.data.tokenize.step import DOC_RECORD
from lemur.shards.format import open_array


@dataclass
class TaskRecords:
    """The documents of one tokenize task as columns (one row per document)."""

    rank: int
    start: np.ndarray  # token offset of the document in the task's run
    end: np.ndarray
    source: np.ndarray  # index into the recipe's sources
    language: np.ndarray  # index into `languages`
    tokens: np.ndarray
    id_hash: np.ndarray
    languages: list[str]  # the task's language table (mix families)
    removed: np.ndarray  # bool: removed by dedup
    removed_exact: np.ndarray  # bool: removed as an exact copy

    def __len__(self) -> int:
        return len(self.tokens)


def removals(dedup_dir: Path | None, rank: int) -> np.ndarray:
    """The dedup cluster task's removal rows of tokenize task `rank` (none without dedup)."""
    if dedup_dir is None:
        return np.zeros(0, REMOVAL)
    return np.array(open_array(dedup_dir / CLUSTER / "out" / f"{rank:05d}.removed", REMOVAL))


def task_records(tok_dir: Path, rank: int, dedup_dir: Path | None = None) -> TaskRecords:
    """Load tokenize task `rank`'s records and its dedup removals."""
    rec = np.load(tok_dir / f"{rank:05d}.docs.npy")
    if rec.dtype != DOC_RECORD:
        raise ValueError(f"{tok_dir / f'{rank:05d}.docs.npy'}: unexpected record layout")
    languages = json.loads((tok_dir / f"{rank:05d}.json").read_text())["languages"]
    end = rec["end"].astype(np.int64)
    tokens = rec["tokens"].astype(np.int64)
    removed = np.zeros(len(rec), bool)
    exact = np.zeros(len(rec), bool)
    rows = removals(dedup_dir, rank)
    local = rows["local"].astype(np.int64)
    removed[local] = True
    exact[local[rows["exact"].astype(bool)]] = True
    return TaskRecords(
        rank=rank,
        start=end - tokens,
        end=end,
        source=rec["source"].astype(np.int32),
        language=rec["language"].astype(np.int32),
        tokens=tokens,
        id_hash=rec["id_hash"].astype(np.uint64),
        languages=list(languages),
        removed=removed,
        removed_exact=exact,
    )

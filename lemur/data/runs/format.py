"""The run between stages: its one definition of bytes (docs/format.md#token-runs).

A token run is what the read stage writes and every later stage reads and rewrites (FIM,
repository groups) until the pack stage mixes it into shards. Per task `rank` of a run's
token folder: `{rank}.bin` (flat tokens), `{rank}.docs.npy` (one `DOC_RECORD` per
document), `{rank}.json` (its language table, dtype, framing), `{rank}.ids.txt`, and in
chat builds `{rank}.mask`. The dedup cluster task writes beside it, per task, the documents
removed (`REMOVAL` rows under `removals_dir`). `TokenRun` names a run; `task_records`
reads one task's records with its removals (~30 bytes per document on disk), so that no
stage loads every task's records at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.data import work as work_folders
from lemur.shards.format import open_array

# The task-local record of every tokenized document: its source (index into the recipe's
# sources), language (index into the task's table), tokens and the run offset it ends at.
DOC_RECORD = np.dtype(
    [("source", "<u2"), ("language", "<u2"), ("tokens", "<u4"), ("id_hash", "<u8"), ("end", "<u8")]
)
# A removed document of a task: its local index, whether it is an exact copy, and the
# document kept in its place.
REMOVAL = np.dtype([("local", "<u4"), ("exact", "u1"), ("keep_task", "<u4"), ("keep_local", "<u4")])
# The dedup cluster stage's folder under the dedup directory (its `out/` holds the removals).
CLUSTER = "cluster"


@dataclass(frozen=True)
class TokenRun:
    """A run between stages: the tokenize run's folder it belongs to (work of later stages
    lies beside it), its tasks, the dedup stages' folder (None: no dedup, or its removals
    already applied), and where its token files lie (default: the run's own `tokens/`; the
    FIM stage's rewrite of it elsewhere)."""

    folder: Path
    tasks: int
    dedup: Path | None = None
    tokens: Path | None = None

    @property
    def token_dir(self) -> Path:
        """Where this run's token files lie."""
        return self.tokens or work_folders.tokens_dir(self.folder)


def removals_dir(dedup_dir: Path) -> Path:
    """Where the dedup cluster task writes each tokenize task's removals."""
    return Path(dedup_dir) / CLUSTER / "out"


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
    return np.array(open_array(removals_dir(dedup_dir) / f"{rank:05d}.removed", REMOVAL))


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

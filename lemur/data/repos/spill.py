"""The read stage's side of repository documents: each task sets aside the files of
repositories that reached the end of its pipeline (filtered, decontaminated, redacted and
signed for dedup, one by one), keyed by the repository's bucket.

A datatrove task reads whole input files, so one repository's files may be read by several
tasks (a table's rows of one repository lie in many files; a tree's files are spread over
the tasks). They meet after dedup: a repository's bucket is a hash of its source and name,
and group task `b` (group.py) reads bucket `b`'s rows of every read task. Each read task
writes `{rank}.jsonl` (one row per file: `local`, its index in the task's token run, which is
what dedup's removals name, and the file's repository, path, language, id and text) and
`{rank}.index.npy` (`SPILL_INDEX` rows sorted by bucket, then local index), so that a group
task reads only its own rows.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.atomic_files import atomic_open, atomic_write_bytes
from lemur.data.read.checkouts import REPO_DIR, REPO_NAME, REPO_PATH

SPILL_INDEX = np.dtype([("bucket", "<u4"), ("local", "<u8"), ("offset", "<u8"), ("length", "<u8")])
# Task stats (the task logs): files set aside, and files of a grouped source with no repository.
SPILLED, NO_REPOSITORY = "repo_files", "repo_files_without_repository"


def bucket_of(source: int, name: str, buckets: int) -> int:
    """The group task of a repository: a stable hash of its source and name."""
    digest = hashlib.blake2b(f"{source}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


def repository_of(doc: Document, key: str) -> tuple[str, str, str] | None:
    """(grouping key, name, path inside) of a file's repository; None when it has none.

    A `files` source's documents carry their checkout (layout.py); a row carries its
    repository's name under `key` (its path: the source's `path_key`, else its id)."""
    meta = doc.metadata
    if REPO_DIR in meta:
        return str(meta[REPO_DIR]), str(meta[REPO_NAME]), str(meta[REPO_PATH])
    name = meta.get(key)
    if not isinstance(name, str) or not name.strip():
        return None
    path = doc.id if meta.get("path_is_container") else str(meta.get("path") or doc.id)
    return name, name, path


def spill_files(run_dir: Path, rank: int) -> tuple[Path, Path]:
    """(rows, index) of read task `rank` under a spill folder."""
    return run_dir / f"{rank:05d}.jsonl", run_dir / f"{rank:05d}.index.npy"


class RepoSpill(PipelineStep):
    """Forwards every document; sets aside those of the grouped sources that have a
    repository (placed right before the token writer, so its count of documents is the
    token run's index). `sources`: the grouped sources' indexes; `buckets`: group tasks."""

    name = "📦 lemur repository files"
    type = "📦 - REPOS"

    def __init__(self, out_dir: str, sources: tuple[int, ...], key: str, buckets: int) -> None:
        super().__init__()
        self.out_dir = out_dir
        self.sources = frozenset(sources)
        self.key = key
        self.buckets = buckets

    def _row(self, local: int, doc: Document) -> tuple[int, bytes] | None:
        """(bucket, JSON line) of a document to set aside, None for one that stays alone."""
        source = doc.metadata.get("source_index")
        if source not in self.sources:
            return None
        found = repository_of(doc, self.key)
        if found is None:
            self.stat_update(NO_REPOSITORY)
            return None
        group, name, path = found
        row: dict[str, Any] = {
            "local": local,
            "source": source,
            "group": group,
            "name": name,
            "path": path,
            "language": str(doc.metadata.get("language")),
            "id": doc.id,
            "text": doc.text,
        }
        self.stat_update(SPILLED)
        return bucket_of(source, name, self.buckets), json.dumps(row).encode() + b"\n"

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        """Yield every document; write this task's rows and index when the last has passed."""
        rows_path, index_path = spill_files(Path(self.out_dir), rank)
        index: list[tuple[int, int, int, int]] = []
        offset = 0
        # The rows file is renamed last: its presence marks the task's set-aside complete.
        with atomic_open(rows_path) as fh:
            for local, doc in enumerate(data or []):
                found = self._row(local, doc)
                if found is not None:
                    bucket, line = found
                    fh.write(line)
                    index.append((bucket, local, offset, len(line)))
                    offset += len(line)
                yield doc
            table = np.array(index, dtype=SPILL_INDEX)
            table = table[np.lexsort((table["local"], table["bucket"]))]
            buf = io.BytesIO()
            np.save(buf, table)
            atomic_write_bytes(index_path, buf.getvalue())


def bucket_rows(run_dir: Path, rank: int, bucket: int) -> list[dict[str, Any]]:
    """The rows read task `rank` set aside for `bucket`, in local order."""
    rows_path, index_path = spill_files(run_dir, rank)
    table = np.load(index_path)
    lo, hi = np.searchsorted(table["bucket"], [bucket, bucket + 1])
    out = []
    with open(rows_path, "rb") as fh:
        for row in table[lo:hi]:
            fh.seek(int(row["offset"]))
            out.append(json.loads(fh.read(int(row["length"]))))
    return out


def spilled_locals(run_dir: Path, rank: int) -> np.ndarray:
    """Local indexes (in the token run of read task `rank`) of every file set aside."""
    return np.sort(np.load(spill_files(run_dir, rank)[1])["local"].astype(np.int64))

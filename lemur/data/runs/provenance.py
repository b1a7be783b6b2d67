"""Provenance per document (recipe `output.provenance`; docs/format.md#documents-parquet).

The readers put where a document came from into its metadata (`INPUT_FILE`, `INPUT_LINE`
or `INPUT_BYTE`, beside its path, repository and a Stack v2 `blob_id`). With provenance on:
- the tokenize step writes one row per document of its run, `{rank}.prov.parquet`, aligned
  with `{rank}.docs.npy`: a side record, so the run's token bytes are the same without it;
- the FIM stage copies it with the `fim` column set for the documents it rewrote, and the
  group stage writes its own run's rows (a repository document lists its files' ids);
- scatter task t takes the rows of its copies in bucket order, each with its dedup cluster
  size, into `scatter-{t}.prov.arrow` (Arrow IPC, memory-mapped: a gather task reads only
  its bucket's rows), and gather task b writes the rows of shard b in the shard's document
  order, `{shard}.documents.parquet`, listed in the manifest with its sha256.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.runs.format import REMOVAL, removals_dir
from lemur.shards.format import PROVENANCE_SUFFIX, atomic_write_bytes, open_array

if TYPE_CHECKING:  # annotations only: pyarrow loads when provenance is on
    import pyarrow as pa
    from datatrove.data import Document

    from lemur.data.recipe.recipe import Recipe

# Metadata keys the readers set: the input file (local path or URL), the line (jsonl) or
# row (parquet) from 1, or in a byte-range part of a jsonl file the line's byte offset.
INPUT_FILE, INPUT_LINE, INPUT_BYTE = "input_file", "input_line", "input_byte"
BLOB_ID = "blob_id"  # a Stack v2 row's content blob (read/stack_v2.py keeps it)
TASK_SUFFIX = ".prov.parquet"  # a run task's rows, beside its `.docs.npy`
SCATTER_SUFFIX = "prov.arrow"  # a scatter task's rows, beside its `.keys`
# The columns, in order (docs/format.md#documents-parquet says what each holds).
COLUMNS = (
    "id",
    "source",
    "file",
    "path",
    "blob_id",
    "line",
    "byte",
    "domain",
    "language",
    "repository",
    "files",
    "quality",
    "fim",
    "cluster_size",
)


def schema() -> pa.Schema:
    """The rows' Arrow schema (one for the run, scatter and shard files)."""
    import pyarrow as pa

    text, number = pa.string(), pa.int64()
    return pa.schema(
        [
            ("id", text),
            ("source", text),
            ("file", text),
            ("path", text),
            ("blob_id", text),
            ("line", number),
            ("byte", number),
            ("domain", text),
            ("language", text),
            ("repository", text),
            ("files", pa.list_(text)),
            ("quality", pa.map_(text, pa.float64())),
            ("fim", pa.bool_()),
            ("cluster_size", number),
        ]
    )


# Metadata keys naming a repository besides the recipe's `repos.key`: a `files` source's
# checkout and The Stack v2's rows (read/checkouts.py REPO_NAME), The Stack v1's rows.
REPOSITORY_KEYS = ("repo_name", "max_stars_repo_name")


def repository_of(meta: dict[str, Any], key: str = "repo_name") -> str | None:
    """The repository a document's metadata names (None when none): the row's `key`,
    else its checkout's name or a well-known column's."""
    for k in (key, *REPOSITORY_KEYS):
        value = meta.get(k)
        if isinstance(value, str) and value.strip():
            return value
    return None


def provenance_key(recipe: Recipe) -> str | None:
    """With `output.provenance`, the metadata key naming a row's repository (`repos.key`,
    else `repo_name`); None without provenance."""
    if not recipe.provenance:
        return None
    return recipe.repos.key if recipe.repos is not None else "repo_name"


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def document_row(doc: Document, repo_key: str = "repo_name") -> dict[str, Any]:
    """The row of one document as the tokenize step sees it (`fim` False, cluster size 1:
    later stages set them). `repo_key`: the metadata key naming a row's repository."""
    meta = doc.metadata
    quality = meta.get("quality")
    return {
        "id": doc.id,
        "source": _text(meta.get("source")),
        "file": _text(meta.get(INPUT_FILE)),
        "path": _text(None if meta.get("path_is_container") else meta.get("path")),
        "blob_id": _text(meta.get(BLOB_ID)),
        "line": meta.get(INPUT_LINE),
        "byte": meta.get(INPUT_BYTE),
        "domain": _text(meta.get("domain")),
        "language": _text(meta.get("language")),
        "repository": repository_of(meta, repo_key),
        "files": None,
        "quality": sorted(quality.items()) if isinstance(quality, dict) else None,
        "fim": False,
        "cluster_size": 1,
    }


def table_of(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts of COLUMNS) as a table of the schema."""
    import pyarrow as pa

    return pa.Table.from_pylist(rows, schema=schema())


class Rows:
    """A task's rows as they come, held as Arrow batches (compact: a task of millions of
    documents keeps no dict per document)."""

    BATCH = 1 << 14

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.tables: list[pa.Table] = []

    def add(self, row: dict[str, Any]) -> None:
        """Append one document's row."""
        self.pending.append(row)
        if len(self.pending) >= self.BATCH:
            self.tables.append(table_of(self.pending))
            self.pending = []

    def table(self) -> pa.Table:
        """Every row added, in order."""
        import pyarrow as pa

        return pa.concat_tables([*self.tables, table_of(self.pending)])


def _parquet_bytes(table: pa.Table) -> bytes:
    """A table as parquet bytes: the same rows give the same bytes (a rerun's file equals)."""
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def task_file(tok_dir: Path, rank: int) -> Path:
    """A run task's provenance rows."""
    return Path(tok_dir) / f"{rank:05d}{TASK_SUFFIX}"


def write_task(tok_dir: Path, rank: int, table: pa.Table) -> None:
    """Write a run task's rows (atomically, before the task's token file)."""
    atomic_write_bytes(task_file(tok_dir, rank), _parquet_bytes(table))


def read_task(tok_dir: Path, rank: int, documents: int) -> pa.Table:
    """A run task's rows; ValueError naming the file when they are missing or misaligned."""
    import pyarrow.parquet as pq

    path = task_file(tok_dir, rank)
    if not path.is_file():
        raise ValueError(f"{path}: missing: the run was made without output.provenance")
    table = pq.read_table(path, schema=schema())
    if table.num_rows != documents:
        raise ValueError(f"{path}: {table.num_rows} rows for the run's {documents} documents")
    return table


def with_fim(table: pa.Table, rewritten: np.ndarray) -> pa.Table:
    """The rows with `fim` True at the documents rewritten (a bool per row)."""
    import pyarrow as pa

    column = pa.array(np.asarray(rewritten, bool), pa.bool_())
    return table.set_column(COLUMNS.index("fim"), "fim", column)


def run_has_rows(tok_dir: Path) -> bool:
    """Whether a run carries provenance rows (its tasks were made with `output.provenance`:
    part of the read stage's work key, so a run has them for every task or for none)."""
    return task_file(tok_dir, 0).is_file()


def cluster_sizes(dedup_dir: Path | None, rank: int, documents: int) -> np.ndarray | None:
    """Per document of run task `rank`: 1 + the documents dedup removed in its favour (the
    cluster it is the kept copy of); None without dedup (the rows keep their sizes).

    Reads every task's removal rows (13 bytes per removed document, memory-mapped, one file
    at a time): a scatter task's cost grows with the corpus's removals, about a second per
    10^8 of them; cheap beside the task's own token bytes below that scale.
    """
    if dedup_dir is None:
        return None
    sizes = np.ones(documents, np.int64)
    for path in sorted(removals_dir(dedup_dir).glob("*.removed")):
        rows = open_array(path, REMOVAL)
        mine = rows["keep_local"][rows["keep_task"] == rank].astype(np.int64)
        np.add.at(sizes, mine, 1)
    return sizes


def with_cluster_sizes(table: pa.Table, sizes: np.ndarray) -> pa.Table:
    """The rows with their `cluster_size` column replaced (one size per row)."""
    import pyarrow as pa

    column = pa.array(np.asarray(sizes, np.int64), pa.int64())
    return table.set_column(COLUMNS.index("cluster_size"), "cluster_size", column)


def write_scatter(path: Path, table: pa.Table, entry: np.ndarray, sizes: np.ndarray | None) -> None:
    """A scatter task's rows: the task's row of every copy (`entry`, in bucket order)."""
    import pyarrow as pa

    if sizes is not None:
        table = with_cluster_sizes(table, sizes)
    rows = table.take(pa.array(np.asarray(entry, np.int64)))
    with atomic_open(path) as fh, pa.ipc.new_file(fh, rows.schema) as writer:
        writer.write_table(rows)


def read_scatter(path: Path, lo: int, hi: int, expected: int) -> pa.Table:
    """Rows [lo, hi) of a scatter task's file, which must hold `expected` rows (ValueError
    naming the file when it is missing or holds another count)."""
    import pyarrow as pa

    if not path.is_file():
        raise ValueError(f"{path}: shuffle provenance rows missing")
    # Not closed here: the table's buffers are views of the map (freed with the table).
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    if table.num_rows != expected:
        raise ValueError(f"{path}: {table.num_rows} rows, expected {expected}")
    return table.slice(lo, hi - lo)


def concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of rows, one after another."""
    import pyarrow as pa

    return pa.concat_tables(tables) if tables else table_of([])


def write_shard_rows(root: Path, rel: str, table: pa.Table) -> tuple[str, str]:
    """Write shard `rel`'s rows (in its document order); (its path, its sha256)."""
    payload = _parquet_bytes(table)
    name = f"{rel}{PROVENANCE_SUFFIX}"
    atomic_write_bytes(Path(root) / name, payload)
    return name, hashlib.sha256(payload).hexdigest()


def read_shard_row(path: Path, n: int) -> dict[str, Any]:
    """Row `n` of a shard's documents.parquet as a dict (IndexError past its end)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if not 0 <= n < pf.metadata.num_rows:
        raise IndexError(n)
    first = 0
    for g in range(pf.num_row_groups):
        rows = pf.metadata.row_group(g).num_rows
        if n < first + rows:
            return pf.read_row_group(g).slice(n - first, 1).to_pylist()[0]
        first += rows
    raise IndexError(n)

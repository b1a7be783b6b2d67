"""Source readers: jsonl (plain/.gz/.zst), parquet and file trees, as one datatrove step.

One `SourcesReader` step reads every source of a recipe so that a datatrove executor can
spread all input files over its tasks (`files[rank::world_size]`). We read the files
ourselves rather than through datatrove's `JsonlReader`: that reader only logs a warning on
a bad line or a truncated stream, and we must count every skipped document and name the
file (and line) in the manifest.
"""

from __future__ import annotations

import codecs
import json
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import zstandard
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data.counts import error_labels, read_label
from lemur.data.read.listing import InputFile
from lemur.data.read.notebooks import NotebookError, looks_like_notebook, notebook_to_script
from lemur.data.read.streams import UnsupportedInput, check_encoding, open_maybe_compressed
from lemur.data.recipe import SourceConfig
from lemur.data.run import logs as _logs  # noqa: F401  (quiets datatrove in worker processes)
from lemur.shards.format import atomic_write_bytes

MAX_ERRORS_PER_TASK = 1000


class SourcesReader(PipelineStep):
    """Reads the recipe's input files assigned to this task and yields Documents.

    Bad input never stops the task: a bad line or file is skipped, counted as a stat
    (`error_<kind>`) and written to `errors_dir/{rank:05d}.jsonl` with file and line (the
    first MAX_ERRORS_PER_TASK of them); `{rank:05d}.files.json` has every file's total.
    """

    name = "📖 lemur sources"
    type = "📖 - READER"

    def __init__(self, inputs: list[InputFile], sources: list[SourceConfig], errors_dir: str):
        super().__init__()
        self.inputs = inputs
        self.sources = sources
        self.errors_dir = errors_dir
        self._errors: list[dict[str, Any]] = []
        self._by_file: Counter[str] = Counter()

    def _error(self, kind: str, f: InputFile, message: str, line: int | None = None) -> None:
        for label in error_labels(kind, self.sources[f.source].name):
            self.stat_update(label)
        self._by_file[f.path] += 1
        if len(self._errors) < MAX_ERRORS_PER_TASK:
            entry: dict[str, Any] = {
                "file": f.path,
                "source": self.sources[f.source].name,
                "kind": kind,
                "error": message,
            }
            if line is not None:
                entry["line"] = line
            self._errors.append(entry)

    def _doc(
        self, f: InputFile, text: str, doc_id: str, extra: dict[str, Any], line: int | None = None
    ) -> Document | None:
        source = self.sources[f.source]
        meta: dict[str, Any] = {
            "source": source.name,
            "source_index": f.source,
            "domain": source.domain,
            "path": f.rel,
        }
        meta.update(extra)
        if source.language and "language" not in meta:
            meta["language"] = source.language
        path = str(meta["path"])
        if source.domain == "code" and (path.endswith(".ipynb") or looks_like_notebook(text)):
            try:
                text, kernel = notebook_to_script(text)
            except NotebookError as e:
                self._error("invalid_notebook", f, str(e), line)
                return None
            meta["language"] = "Jupyter Notebook"
            meta["notebook_kernel"] = kernel
        self.stat_update(read_label(source.name))
        return Document(text=text, id=f"{source.name}/{doc_id}", metadata=meta)

    def _row_metadata(self, row: dict[str, Any], source: SourceConfig) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        for key in source.metadata_keys or ():
            if key in row and row[key] is not None:
                extra[key] = row[key]
        if source.path_key and isinstance(row.get(source.path_key), str):
            extra["path"] = row[source.path_key]
        keys = (source.language_key,) if source.language_key else ("language", "lang")
        for key in keys:
            if isinstance(row.get(key), str) and row[key]:
                extra["language"] = row[key]
                break
        return extra

    def _row_doc(self, f: InputFile, row: dict[str, Any], line: int) -> Document | None:
        """The document of one JSON line or parquet row (None, counted, if it has no text)."""
        source = self.sources[f.source]
        text = row.get(source.text_key)
        if not isinstance(text, str):
            self._error("missing_text", f, f"no string field '{source.text_key}'", line)
            return None
        rid = row.get(source.id_key)
        doc_id = str(rid) if rid is not None else f"{f.rel}:{line}"
        return self._doc(f, text, doc_id, self._row_metadata(row, source), line)

    def _jsonl_line(self, f: InputFile, raw: bytes, line_no: int) -> Document | None:
        """The document of one JSON line, or None (counted) for a bad line."""
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as u:
                self._error("invalid_utf8", f, f"invalid UTF-8 at byte {u.start}", line_no)
                return None
            self._error("invalid_json", f, str(e).split(":")[0], line_no)
            return None
        if not isinstance(row, dict):
            self._error("invalid_json", f, "line is not a JSON object", line_no)
            return None
        return self._row_doc(f, row, line_no)

    def _read_jsonl(self, f: InputFile) -> Iterator[Document]:
        line_no = 0

        def damaged(message: str) -> None:
            self._error("corrupt_file", f, f"{message}; after line {line_no}", line_no)

        try:
            with open_maybe_compressed(f.open_path, on_damage=damaged) as fh:
                for line_no, raw in enumerate(fh, start=1):
                    if line_no == 1:
                        check_encoding(raw)
                        raw = raw.removeprefix(codecs.BOM_UTF8)  # written by some editors
                    if not raw.strip():
                        continue
                    doc = self._jsonl_line(f, raw, line_no)
                    if doc is not None:
                        yield doc
        except UnsupportedInput as e:
            self._error("unsupported_format", f, str(e))
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            self._error("unreadable", f, e.strerror or str(e))
        except (EOFError, OSError, zlib.error, zstandard.ZstdError) as e:
            self._error("corrupt_file", f, f"truncated or corrupt stream after line {line_no}: {e}")

    def _row_group(self, f: InputFile, pf: Any, group: int, columns: list[str], first: int):
        """Rows of one parquet row group, numbered from `first`; a damaged group is counted."""
        rows = pf.metadata.row_group(group).num_rows
        batches = pf.iter_batches(columns=columns, batch_size=1024, row_groups=[group])
        row = first
        while True:
            try:
                records = next(batches).to_pylist()
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - pyarrow raises many types for bad data
                self._error(
                    "corrupt_file",
                    f,
                    f"row group {group} (rows {row + 1}-{first + rows}) unreadable: {e}",
                    row + 1,
                )
                return
            for record in records:
                row += 1
                doc = self._row_doc(f, record, row)
                if doc is not None:
                    yield doc

    def _read_parquet(self, f: InputFile) -> Iterator[Document]:
        import pyarrow.parquet as pq

        source = self.sources[f.source]
        try:
            pf = pq.ParquetFile(f.open_path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for bad files
            self._error("corrupt_file", f, f"not a readable parquet file: {e}")
            return
        names = set(pf.schema_arrow.names)
        if source.text_key not in names:
            self._error("missing_text", f, f"no column '{source.text_key}'")
            return
        wanted = [source.id_key, source.path_key, source.language_key, "lang", "language"]
        wanted += list(source.metadata_keys or ())
        columns = [source.text_key] + sorted({c for c in wanted if c and c in names})
        first = 0
        # One row group at a time, in batches: a large file never sits in memory whole, and
        # a damaged row group loses only its own rows.
        for group in range(pf.num_row_groups):
            yield from self._row_group(f, pf, group, columns, first)
            first += pf.metadata.row_group(group).num_rows

    def _read_file(self, f: InputFile) -> Iterator[Document]:
        source = self.sources[f.source]
        try:
            size = os.path.getsize(f.open_path)
            if size > source.max_file_bytes:
                self._error("too_large", f, f"{size} bytes > max_file_bytes")
                return
            with open(f.open_path, "rb") as fh:
                data = fh.read()
        except OSError as e:
            self._error("unreadable", f, e.strerror or str(e))
            return
        if b"\0" in data[:8192]:
            self._error("binary", f, "binary file (NUL byte)")
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            self._error("invalid_utf8", f, f"invalid UTF-8 at byte {e.start}")
            return
        doc = self._doc(f, text, f.rel, {})
        if doc is not None:
            yield doc

    def read(self, f: InputFile) -> Iterator[Document]:
        """Documents of one input file."""
        if f.error:  # found while listing, e.g. an unreadable directory
            self._error("unreadable", f, f.error)
            return iter(())
        fmt = self.sources[f.source].format
        if fmt == "jsonl":
            return self._read_jsonl(f)
        if fmt == "parquet":
            return self._read_parquet(f)
        return self._read_file(f)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        """Yield this task's documents, then write its error log."""
        self._errors, self._by_file = [], Counter()
        for f in self.inputs[rank::world_size]:
            yield from self.read(f)
        payload = "".join(json.dumps(e, sort_keys=True) + "\n" for e in self._errors)
        atomic_write_bytes(Path(self.errors_dir) / f"{rank:05d}.jsonl", payload.encode())
        totals = json.dumps(dict(sorted(self._by_file.items())), sort_keys=True)
        atomic_write_bytes(Path(self.errors_dir) / f"{rank:05d}.files.json", totals.encode())

"""One reader per input format over a shared base: jsonl (plain/.gz/.zst), parquet, files.

Laid out as datatrove's readers are (a base with the document, metadata and error logic,
then one class per format), but we read the files ourselves: datatrove's `JsonlReader` only
logs a warning on a bad line or a truncated stream, and we must count every skipped
document and name the file (and line) in the manifest. The readers are plain objects; the
`SourcesReader` step owns them and their `ReadLog`, so one task's counts land in its stats.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import orjson
import zstandard
from datatrove.data import Document

from lemur.data.labels import dropped_label, error_labels, read_label, repaired_label
from lemur.data.read.checkouts import checkout_fields
from lemur.data.read.compressed import (
    Opener,
    UnsupportedInput,
    check_encoding,
    open_maybe_compressed,
)
from lemur.data.read.exclude import EXCLUDED, Exclusions
from lemur.data.read.listing import InputFile
from lemur.data.read.notebooks import NotebookError, looks_like_notebook, notebook_to_script
from lemur.data.read.remote import RemoteError
from lemur.data.read.remote_inputs import RemoteInputs
from lemur.data.read.split import BYTES, part_lines
from lemur.data.recipe.sources import SourceConfig
from lemur.data.runs.provenance import INPUT_BYTE, INPUT_FILE, INPUT_LINE, repository_of
from lemur.shards.format import atomic_write_bytes

MAX_ERRORS_PER_TASK = 1000
Row = dict[str, Any]
REMOTE_FAILED = "remote_failed"  # an error kind: a remote read failed (retries exhausted)
LONE_SURROGATE = "lone_surrogate"  # the repair of a JSON string escaping half a UTF-16 pair
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class RepairedRow(dict):
    """A row read after a repair of `kind`, counted once it makes a document (not if none)."""

    kind: str = ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads accepts NaN and Infinity; orjson not


def replace_surrogates(value: Any) -> Any:
    """`value` (parsed JSON) with every lone surrogate in its strings, keys too, replaced
    by U+FFFD (a pair escaped as two halves is one character already)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


class ReadLog:
    """One task's bad input: stats (`error_<kind>`), the first errors with file and line,
    and every file's error total."""

    def __init__(
        self,
        sources: list[SourceConfig],
        stat_update: Callable[..., None],
        exclusions: Exclusions | None = None,
    ) -> None:
        self.sources = sources
        self.stat_update = stat_update
        self.exclusions = exclusions or Exclusions()  # the recipe's `exclude:` lists
        self.errors: list[dict[str, Any]] = []
        self.by_file: Counter[str] = Counter()
        self.remote = RemoteInputs(sources, stat_update)  # this task's remote clients

    def clear(self) -> None:
        """Forget what was logged (a task starts afresh)."""
        self.errors.clear()
        self.by_file.clear()

    def error(self, kind: str, f: InputFile, message: str, line: int | None = None) -> None:
        """Count one bad line, row or file of `kind`; keep the first MAX_ERRORS_PER_TASK.

        `line` is a line or row number from 1, except in a byte-range part of a jsonl file,
        which cannot know its line numbers: there it is the byte offset where the line
        starts, recorded as `byte` and named in the message.
        """
        for label in error_labels(kind, self.sources[f.source].name):
            self.stat_update(label)
        self.by_file[f.path] += 1
        if len(self.errors) < MAX_ERRORS_PER_TASK:
            entry: dict[str, Any] = {
                "file": f.path,
                "source": self.sources[f.source].name,
                "kind": kind,
                "error": message,
            }
            if line is not None and f.unit == BYTES:
                entry["byte"] = line
                entry["error"] = f"{message} (line starting at byte {line})"
            elif line is not None:
                entry["line"] = line
            self.errors.append(entry)

    def write(self, errors_dir: str, rank: int) -> None:
        """Write `{rank:05d}.jsonl` (the errors) and `{rank:05d}.files.json` (per-file totals)."""
        payload = "".join(json.dumps(e, sort_keys=True) + "\n" for e in self.errors)
        atomic_write_bytes(Path(errors_dir) / f"{rank:05d}.jsonl", payload.encode())
        totals = json.dumps(dict(sorted(self.by_file.items())), sort_keys=True)
        atomic_write_bytes(Path(errors_dir) / f"{rank:05d}.files.json", totals.encode())


class BaseReader(ABC):
    """What every format shares: documents with the source's metadata, bad input logged."""

    def __init__(self, sources: list[SourceConfig], log: ReadLog) -> None:
        self.sources = sources
        self.log = log

    @abstractmethod
    def read(self, f: InputFile) -> Iterator[Document]:
        """Documents of one input file of this reader's format."""

    def error(self, kind: str, f: InputFile, message: str, line: int | None = None) -> None:
        """Log one bad input (see `ReadLog.error`)."""
        self.log.error(kind, f, message, line)

    def opener(self, f: InputFile) -> Opener:
        """Opens `f` for binary reading: a local file, or a remote one (remote.py)."""
        # A byte-range part reads ahead only to its end (the last line's tail on demand); a
        # remote object is read as the version listed, or not at all (remote.py).
        ahead = f.end if f.unit == BYTES else -1
        return self.log.remote.opener(f.source, f.size, ahead, f.version)

    def metadata(
        self, f: InputFile, extra: dict[str, Any], line: int | None = None
    ) -> dict[str, Any]:
        """A document's metadata: source, domain, path, then `extra`, then the language and
        where it was read (the input file; its line or row, or in a byte-range part of a
        jsonl file the line's byte offset: what provenance records)."""
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
        meta[INPUT_FILE] = f.path
        if line is not None:
            meta[INPUT_BYTE if f.unit == BYTES else INPUT_LINE] = line
        return meta

    def excluded(self, f: InputFile, doc_id: str, meta: dict[str, Any]) -> bool:
        """Whether the recipe's `exclude:` lists name a document about to be made: then it
        is counted read and dropped (`excluded`), before any later step sees it."""
        ex = self.log.exclusions
        if not ex:
            return False
        name = self.sources[f.source].name
        path = None if meta.get("path_is_container") else meta.get("path")
        paths = (str(path) if path is not None else None, f.rel, f.path)
        repository = repository_of(meta, ex.repo_key)
        if not ex.excluded(f"{name}/{doc_id}", doc_id, paths, repository):
            return False
        self.log.stat_update(read_label(name))
        self.log.stat_update(dropped_label(name, EXCLUDED))
        return True

    def emit(self, f: InputFile, text: str, doc_id: str, meta: dict[str, Any]) -> Document:
        """A document read (counted `read:<source>`)."""
        name = self.sources[f.source].name
        self.log.stat_update(read_label(name))
        return Document(text=text, id=f"{name}/{doc_id}", metadata=meta)

    def document(
        self, f: InputFile, text: str, doc_id: str, extra: dict[str, Any], line: int | None = None
    ) -> Document | None:
        """A document of text or code; a code notebook becomes a script (None if invalid)."""
        meta = self.metadata(f, extra, line)
        if self.excluded(f, doc_id, meta):
            return None
        path = str(meta["path"])
        if meta["domain"] == "code" and (path.endswith(".ipynb") or looks_like_notebook(text)):
            try:
                text, kernel = notebook_to_script(text)
            except NotebookError as e:
                self.error("invalid_notebook", f, str(e), line)
                return None
            meta["language"] = "Jupyter Notebook"
            meta["notebook_kernel"] = kernel
        return self.emit(f, text, doc_id, meta)

    def row_metadata(self, row: Row, source: SourceConfig) -> dict[str, Any]:
        """Metadata a row carries: `metadata_keys`, its path and its language. A row without
        a path of its own (`path_key`) keeps its file's as `path`, marked
        `path_is_container`: the tagger must not take `code.jsonl` for the row's name."""
        extra: dict[str, Any] = {}
        for key in source.metadata_keys or ():
            if key in row and row[key] is not None:
                extra[key] = row[key]
        if source.path_key and isinstance(row.get(source.path_key), str) and row[source.path_key]:
            extra["path"] = row[source.path_key]
        else:
            extra["path_is_container"] = True
        keys = (source.language_key,) if source.language_key else ("language", "lang")
        for key in keys:
            if isinstance(row.get(key), str) and row[key]:
                extra["language"] = row[key]
                break
        return extra

    def row_id(self, f: InputFile, row: Row, line: int) -> str:
        """A row's id: its `id_key` value, else `file:line` (`file@byte` in a byte-range part)."""
        rid = row.get(self.sources[f.source].id_key)
        if rid is not None:
            return str(rid)
        # A split jsonl file names lines by byte offset: counting the lines before a part
        # would mean reading all of them. Unsplit files keep `file:line`, as always.
        return f"{f.rel}@{line}" if f.unit == BYTES else f"{f.rel}:{line}"

    def row_doc(self, f: InputFile, row: Row, line: int) -> Document | None:
        """The document of one JSON line or parquet row (None, counted, if it has no text)."""
        source = self.sources[f.source]
        text = row.get(source.text_key)
        if not isinstance(text, str):
            self.error("missing_text", f, f"no string field '{source.text_key}'", line)
            return None
        return self.document(
            f, text, self.row_id(f, row, line), self.row_metadata(row, source), line
        )


class RowReader(BaseReader):
    """A reader of rows (jsonl lines, parquet rows): a document per good row."""

    @abstractmethod
    def rows(self, f: InputFile) -> Iterator[tuple[int, Row]]:
        """(line or row number, row) of every readable row of a file (or part of one)."""

    def read(self, f: InputFile) -> Iterator[Document]:
        """A document per good row."""
        for number, row in self.rows(f):
            doc = self.row_doc(f, row, number)
            if doc is not None:
                if isinstance(row, RepairedRow):
                    self.log.stat_update(repaired_label(self.sources[f.source].name, row.kind))
                yield doc


class JsonlReader(RowReader):
    """JSON lines, plain, gzip or zstd; a bad line is logged and its neighbours kept."""

    def parse(self, f: InputFile, raw: bytes, line_no: int) -> Row | None:
        """The object of one JSON line, or None (logged) for a bad line.

        A string escaping a lone UTF-16 surrogate (`"\\ud800"`: valid JSON, not valid
        Unicode; orjson refuses it) is read with each lone surrogate as U+FFFD, and its
        document, if it makes one, counted `repaired:<source>:lone_surrogate`.
        """
        try:
            row = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as u:
                self.error("invalid_utf8", f, f"invalid UTF-8 at byte {u.start}", line_no)
                return None
            row = self._with_lone_surrogates(raw)
            if row is None:
                self.error("invalid_json", f, str(e).split(":")[0], line_no)
                return None
        if not isinstance(row, dict):
            self.error("invalid_json", f, "line is not a JSON object", line_no)
            return None
        return row

    def _with_lone_surrogates(self, raw: bytes) -> Any:
        """The line parsed with its lone surrogates replaced (counted), or None if it holds
        none (orjson refused it for another reason) or is not JSON anyway."""
        if not _SURROGATE_ESCAPE.search(raw):
            return None
        try:
            value = json.loads(raw, parse_constant=_no_constant)
            repaired = replace_surrogates(value)
        except (ValueError, RecursionError):
            return None
        if repaired == value:  # no lone surrogate: refused for another reason
            return None
        if isinstance(repaired, dict):  # else the caller logs a line that is not an object
            repaired = RepairedRow(repaired)
            repaired.kind = LONE_SURROGATE  # counted by `read` if the row makes a document
        return repaired

    def rows(self, f: InputFile) -> Iterator[tuple[int, Row]]:
        """(line number, object) of each good line; bad lines and damaged streams are logged.

        In a byte-range part of a file, (byte offset of the line, object) instead.
        """
        if f.unit == BYTES:
            yield from self.part_rows(f)
            return
        line_no = 0

        def damaged(message: str) -> None:
            self.error("corrupt_file", f, f"{message}; after line {line_no}", line_no)

        try:
            with open_maybe_compressed(f.open_path, damaged, self.opener(f)) as fh:
                for line_no, raw in enumerate(fh, start=1):
                    if line_no == 1:
                        check_encoding(raw)
                        raw = raw.removeprefix(codecs.BOM_UTF8)  # written by some editors
                    if not raw.strip():
                        continue
                    row = self.parse(f, raw, line_no)
                    if row is not None:
                        yield line_no, row
        except UnsupportedInput as e:
            self.error("unsupported_format", f, str(e))
        except RemoteError as e:
            self.error(REMOTE_FAILED, f, f"{e} (after line {line_no})", line_no or None)
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            self.error("unreadable", f, e.strerror or str(e))
        except (EOFError, OSError, zlib.error, zstandard.ZstdError) as e:
            self.error("corrupt_file", f, f"truncated or corrupt stream after line {line_no}: {e}")

    def part_rows(self, f: InputFile) -> Iterator[tuple[int, Row]]:
        """(byte offset, object) of each good line starting in the part's byte range."""
        try:
            for at, raw in part_lines(f.open_path, f.start, f.end, self.opener(f)):
                if at == 0:  # the file's first line, as in `rows`
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                if raw.strip() and (row := self.parse(f, raw, at)) is not None:
                    yield at, row
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            if f.first:  # one error for the file, not one per part
                self.error("unreadable", f, e.strerror or str(e))
        except RemoteError as e:
            self.error(REMOTE_FAILED, f, str(e))
        except OSError as e:
            self.error("corrupt_file", f, f"bytes {f.start}-{f.end} unreadable: {e}")


class ParquetReader(RowReader):
    """Parquet, one row group at a time in batches; a damaged row group is logged."""

    def meta_columns(self, source: SourceConfig, names: set[str]) -> list[str]:
        """The id, path, language and metadata columns present in the file."""
        wanted = [source.id_key, source.path_key, source.language_key, "lang", "language"]
        wanted += list(source.metadata_keys or ())
        return sorted({c for c in wanted if c and c in names})

    def columns(self, f: InputFile, names: set[str]) -> list[str] | None:
        """The columns to read; None (logged) when the file lacks the text column."""
        source = self.sources[f.source]
        if source.text_key not in names:
            if f.first:  # one error for the file, not one per part
                self.error("missing_text", f, f"no column '{source.text_key}'")
            return None
        return [source.text_key] + self.meta_columns(source, names)

    def _row_group(self, f: InputFile, pf: Any, group: int, columns: list[str], first: int):
        """Rows of one parquet row group, numbered from `first`; a damaged group is logged."""
        rows = pf.metadata.row_group(group).num_rows
        batches = pf.iter_batches(columns=columns, batch_size=1024, row_groups=[group])
        row = first
        while True:
            try:
                records = next(batches).to_pylist()
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001 - pyarrow raises many types for bad data
                self.error(
                    REMOTE_FAILED if isinstance(e, RemoteError) else "corrupt_file",
                    f,
                    f"row group {group} (rows {row + 1}-{first + rows}) unreadable: {e}",
                    row + 1,
                )
                return
            for record in records:
                row += 1
                yield row, record

    def rows(self, f: InputFile) -> Iterator[tuple[int, Row]]:
        """(row number from 1, row) of every readable row."""
        import pyarrow.parquet as pq

        try:  # a local file by its path: pyarrow reads it natively, faster than through Python
            fh = self.opener(f)(f.open_path) if f.size >= 0 else nullcontext(f.open_path)
        except RemoteError as e:
            self.error(REMOTE_FAILED, f, str(e))
            return
        except OSError as e:
            if f.first:  # one error for the file, not one per part
                self.error("corrupt_file", f, f"not a readable parquet file: {e}")
            return
        with fh as source:
            try:
                pf = pq.ParquetFile(source)
            except Exception as e:  # noqa: BLE001 - pyarrow raises many types for bad files
                if f.first:  # one error for the file, not one per part
                    kind = REMOTE_FAILED if isinstance(e, RemoteError) else "corrupt_file"
                    self.error(kind, f, f"not a readable parquet file: {e}")
                return
            yield from self.parquet_rows(f, pf)

    def parquet_rows(self, f: InputFile, pf: Any) -> Iterator[tuple[int, Row]]:
        """(row number from 1, row) of every readable row of an open parquet file."""
        columns = self.columns(f, set(pf.schema_arrow.names))
        if columns is None:
            return
        groups = range(pf.num_row_groups)
        if f.unit:  # a part of the file: its run of row groups
            groups = range(f.start, min(f.end, pf.num_row_groups))
        # Rows are numbered over the whole file, so a part's row ids are the unsplit ones.
        first = sum(pf.metadata.row_group(g).num_rows for g in range(groups.start))
        # One row group at a time, in batches: a large file never sits in memory whole, and
        # a damaged row group loses only its own rows.
        for group in groups:
            yield from self._row_group(f, pf, group, columns, first)
            first += pf.metadata.row_group(group).num_rows


class FilesReader(BaseReader):
    """One document per file of a tree; binary, oversized and non-UTF-8 files are logged."""

    def read(self, f: InputFile) -> Iterator[Document]:
        """The file's text as one document."""
        source = self.sources[f.source]
        try:
            size = f.size if f.size >= 0 else os.path.getsize(f.open_path)
            if size > source.max_file_bytes:
                self.error("too_large", f, f"{size} bytes > max_file_bytes")
                return
            with self.opener(f)(f.open_path) as fh:
                data = fh.read()
        except RemoteError as e:
            self.error(REMOTE_FAILED, f, str(e))
            return
        except OSError as e:
            self.error("unreadable", f, e.strerror or str(e))
            return
        if b"\0" in data[:8192]:
            self.error("binary", f, "binary file (NUL byte)")
            return
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            self.error("invalid_utf8", f, f"invalid UTF-8 at byte {e.start}")
            return
        # The file's checkout (repository documents group by it; read/checkouts.py).
        doc = self.document(f, text, f.rel, checkout_fields(f.open_path, f.path, f.rel))
        if doc is not None:
            yield doc

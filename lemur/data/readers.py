"""Source readers: jsonl (plain/.gz/.zst), parquet and file trees, as one datatrove step.

One `SourcesReader` step reads every source of a recipe so that a datatrove executor can
spread all input files over its tasks (`files[rank::world_size]`). We read the files
ourselves rather than through datatrove's `JsonlReader`: that reader only logs a warning on
a bad line or a truncated stream, and we must count every skipped document and name the
file (and line) in the manifest.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data import logs as _logs  # noqa: F401  (quiets datatrove in worker processes)
from lemur.data.notebooks import NotebookError, looks_like_notebook, notebook_to_script
from lemur.data.recipe import Recipe, RecipeError, SourceConfig, expand_paths
from lemur.data.shards import atomic_write_bytes

# Directories that hold vendored, generated or tool data rather than authored source.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".tox",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        "site-packages",
        "dist-packages",
        ".idea",
        ".vscode",
    }
)
MAX_ERRORS_PER_TASK = 1000


@dataclass(frozen=True)
class InputFile:
    """One input file of one source; `rel` is its path relative to the source root."""

    source: int
    path: str
    rel: str


class Listing:
    """Input files of a recipe plus the files skipped while listing, by source and reason."""

    def __init__(self) -> None:
        self.files: list[InputFile] = []
        self.skipped: dict[str, dict[str, int]] = {}

    def skip(self, source: str, reason: str) -> None:
        """Count one file left out of the listing."""
        per = self.skipped.setdefault(source, {})
        per[reason] = per.get(reason, 0) + 1


def _gitignore(directory: str) -> Any | None:
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path):
        return None
    import pathspec

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return pathspec.GitIgnoreSpec.from_lines(fh)
    except OSError:
        return None


def _walk(root: Path, source: SourceConfig, listing: Listing) -> Iterator[tuple[str, str]]:
    """Files under root, honouring .gitignore files and skipping vendored directories."""
    import enry

    specs: list[tuple[str, Any]] = []  # (directory, spec) for .gitignore files above us
    for dirpath, dirnames, filenames in os.walk(root):
        specs = [(d, sp) for d, sp in specs if dirpath == d or dirpath.startswith(d + os.sep)]
        if source.gitignore and (spec := _gitignore(dirpath)) is not None:
            specs.append((dirpath, spec))

        def ignored(full: str, is_dir: bool, specs: list[tuple[str, Any]] = specs) -> bool:
            for d, spec in specs:
                rel_to = os.path.relpath(full, d).replace(os.sep, "/")
                if spec.match_file(rel_to + ("/" if is_dir else "")):
                    return True
            return False

        keep_dirs = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if d in SKIP_DIRS:
                listing.skip(source.name, "tool_directory")
            elif source.skip_vendored and enry.is_vendor(rel + "/"):
                listing.skip(source.name, "vendored")
            elif source.gitignore and ignored(full, True):
                listing.skip(source.name, "gitignored")
            else:
                keep_dirs.append(d)
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if source.include and not any(fnmatch.fnmatch(rel, g) for g in source.include):
                continue
            if source.exclude and any(fnmatch.fnmatch(rel, g) for g in source.exclude):
                listing.skip(source.name, "excluded")
                continue
            if name == ".gitignore" or os.path.islink(full) or not os.path.isfile(full):
                continue
            if source.gitignore and ignored(full, False):
                listing.skip(source.name, "gitignored")
                continue
            if source.skip_vendored and enry.is_vendor(rel.replace(os.sep, "/")):
                listing.skip(source.name, "vendored")
                continue
            yield full, rel


def list_inputs(recipe: Recipe) -> Listing:
    """Every input file of every source, in a deterministic order."""
    listing = Listing()
    for i, source in enumerate(recipe.sources):
        found = 0
        for match in expand_paths(source):
            p = Path(match)
            if p.is_dir():
                if source.format != "files":
                    candidates = sorted(
                        x for x in p.rglob("*") if x.is_file() and not x.name.startswith(".")
                    )
                    for x in candidates:
                        listing.files.append(InputFile(i, str(x), str(x.relative_to(p))))
                        found += 1
                    continue
                for full, rel in _walk(p, source, listing):
                    listing.files.append(InputFile(i, full, rel))
                    found += 1
            else:
                listing.files.append(InputFile(i, str(p), p.name))
                found += 1
        if found == 0:
            raise RecipeError(f"recipe: source '{source.name}': no input files under its paths")
    return listing


class ZstdFrames(io.RawIOBase):
    """A streaming zstd reader that raises at a truncated frame.

    zstandard's `stream_reader` ends silently when a file is cut mid-frame, which would
    lose the rest of the file without a trace; `decompressobj` tells us (`eof`).
    Concatenated frames (as written by parallel compressors) are read one after another.
    """

    def __init__(self, path: str, chunk: int = 1 << 20) -> None:
        super().__init__()
        self._fh = open(path, "rb")
        self._chunk = chunk
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._buf = b""
        self._started = False

    def readable(self) -> bool:
        """Always readable."""
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        """Fill `b` with decompressed bytes; 0 at the end of the last complete frame."""
        while not self._buf:
            data = self._fh.read(self._chunk)
            if not data:
                if self._started and not self._d.eof:
                    raise EOFError("zstd stream ends in the middle of a frame (truncated file)")
                return 0
            self._started = True
            out = self._d.decompress(data)
            while self._d.eof and self._d.unused_data:
                rest = self._d.unused_data
                self._d = zstandard.ZstdDecompressor().decompressobj()
                out += self._d.decompress(rest)
            self._buf = out
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        """Close the underlying file."""
        self._fh.close()
        super().close()


def open_maybe_compressed(path: str) -> io.BufferedIOBase:
    """Open a file for binary streaming, decompressing .gz and .zst on the fly."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst") or path.endswith(".zstd"):
        return io.BufferedReader(ZstdFrames(path), buffer_size=1 << 20)
    return open(path, "rb")


class SourcesReader(PipelineStep):
    """Reads the recipe's input files assigned to this task and yields Documents.

    Bad input never stops the task: a bad line or file is skipped, counted as a stat
    (`error_<kind>`) and written to `errors_dir/{rank:05d}.jsonl` with file and line.
    """

    name = "📖 lemur sources"
    type = "📖 - READER"

    def __init__(self, inputs: list[InputFile], sources: list[SourceConfig], errors_dir: str):
        super().__init__()
        self.inputs = inputs
        self.sources = sources
        self.errors_dir = errors_dir
        self._errors: list[dict[str, Any]] = []

    def _error(self, kind: str, f: InputFile, message: str, line: int | None = None) -> None:
        self.stat_update(f"error_{kind}")
        self.stat_update(f"error_{kind}:{self.sources[f.source].name}")
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
        self.stat_update(f"read:{source.name}")
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

    def _read_jsonl(self, f: InputFile) -> Iterator[Document]:
        line_no = 0
        try:
            with open_maybe_compressed(f.path) as fh:
                for line_no, raw in enumerate(fh, start=1):
                    if not raw.strip():
                        continue
                    try:
                        row = orjson.loads(raw)
                    except orjson.JSONDecodeError as e:
                        try:
                            raw.decode("utf-8")
                        except UnicodeDecodeError as u:
                            self._error(
                                "invalid_utf8", f, f"invalid UTF-8 at byte {u.start}", line_no
                            )
                            continue
                        self._error("invalid_json", f, str(e).split(":")[0], line_no)
                        continue
                    if not isinstance(row, dict):
                        self._error("invalid_json", f, "line is not a JSON object", line_no)
                        continue
                    doc = self._row_doc(f, row, line_no)
                    if doc is not None:
                        yield doc
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            self._error("unreadable", f, e.strerror or str(e))
        except (EOFError, OSError, zstandard.ZstdError) as e:
            self._error("corrupt_file", f, f"truncated or corrupt stream after line {line_no}: {e}")

    def _read_parquet(self, f: InputFile) -> Iterator[Document]:
        import pyarrow.parquet as pq

        source = self.sources[f.source]
        try:
            pf = pq.ParquetFile(f.path)
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
        row = 0
        try:
            # Row groups are read in batches, so a large file never sits in memory whole.
            for batch in pf.iter_batches(columns=columns, batch_size=1024):
                for record in batch.to_pylist():
                    row += 1
                    doc = self._row_doc(f, record, row)
                    if doc is not None:
                        yield doc
        except Exception as e:  # noqa: BLE001
            self._error("corrupt_file", f, f"corrupt after row {row}: {e}")

    def _read_file(self, f: InputFile) -> Iterator[Document]:
        source = self.sources[f.source]
        try:
            size = os.path.getsize(f.path)
            if size > source.max_file_bytes:
                self._error("too_large", f, f"{size} bytes > max_file_bytes")
                return
            with open(f.path, "rb") as fh:
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
        fmt = self.sources[f.source].format
        if fmt == "jsonl":
            return self._read_jsonl(f)
        if fmt == "parquet":
            return self._read_parquet(f)
        return self._read_file(f)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        """Yield this task's documents, then write its error log."""
        self._errors = []
        for f in self.inputs[rank::world_size]:
            yield from self.read(f)
        payload = "".join(json.dumps(e, sort_keys=True) + "\n" for e in self._errors)
        atomic_write_bytes(Path(self.errors_dir) / f"{rank:05d}.jsonl", payload.encode())

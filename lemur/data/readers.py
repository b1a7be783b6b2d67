"""Source readers: jsonl (plain/.gz/.zst), parquet and file trees, as one datatrove step.

One `SourcesReader` step reads every source of a recipe so that a datatrove executor can
spread all input files over its tasks (`files[rank::world_size]`). We read the files
ourselves rather than through datatrove's `JsonlReader`: that reader only logs a warning on
a bad line or a truncated stream, and we must count every skipped document and name the
file (and line) in the manifest.
"""

from __future__ import annotations

import codecs
import fnmatch
import gzip
import io
import json
import os
import re
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import zstandard
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data.notebooks import NotebookError, looks_like_notebook, notebook_to_script
from lemur.data.recipe import Recipe, RecipeError, SourceConfig, expand_paths
from lemur.data.run import logs as _logs  # noqa: F401  (quiets datatrove in worker processes)
from lemur.shards.format import atomic_write_bytes

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
    """One input file of one source; `rel` is its path relative to the source root.

    `path` and `rel` name the file in document ids, metadata and error lists, so they are
    always valid UTF-8 (see `display_name`); `fs_path` holds the real name when it differs.
    `error`, when set, is a problem found while listing (an unreadable directory) that the
    reader reports in place of reading.
    """

    source: int
    path: str
    rel: str
    fs_path: str = ""
    error: str = ""

    @property
    def open_path(self) -> str:
        """The name to open the file by."""
        return self.fs_path or self.path


def display_name(name: str) -> str:
    """A file name as valid UTF-8 text: unchanged when it is, else escaped losslessly.

    POSIX names are bytes; Python decodes the bytes that are not UTF-8 to lone surrogates
    (`surrogateescape`), which cannot be encoded, hashed or written as JSON. We show each
    such byte as `\\xNN` and double the name's backslashes, so the bytes can be recovered.
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that did not come from undecodable bytes
        raw = name.encode("utf-8", "surrogatepass")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def _input(source: int, full: str, rel: str, error: str = "") -> InputFile:
    shown = display_name(full)
    return InputFile(source, shown, display_name(rel), full if shown != full else "", error)


class Listing:
    """Input files of a recipe plus the files skipped while listing, by source and reason."""

    def __init__(self) -> None:
        self.files: list[InputFile] = []
        self.skipped: dict[str, dict[str, int]] = {}

    def skip(self, source: str, reason: str) -> None:
        """Count one file left out of the listing."""
        per = self.skipped.setdefault(source, {})
        per[reason] = per.get(reason, 0) + 1


_WARNED: set[tuple[str, int]] = set()


def _warn_pattern(path: str, line: int, pattern: str, error: Exception) -> None:
    """Say once per process that a .gitignore line was skipped (not an error: git skips it too)."""
    if (path, line) in _WARNED:
        return
    _WARNED.add((path, line))
    print(
        f"lemur-data: warning: {display_name(path)}:{line}: invalid .gitignore pattern "
        f"{pattern!r} skipped ({error})",
        file=sys.stderr,
    )


def _gitignore(directory: str) -> Any | None:
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path):
        return None
    import pathspec

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):
        pass
    # One bad pattern (a lone `!`, a reversed range `[z-a]`) must not lose the whole file.
    good = []
    for number, line in enumerate(lines, start=1):
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except (ValueError, re.error) as e:
            _warn_pattern(path, number, line, e)
            continue
        good.append(line)
    return pathspec.GitIgnoreSpec.from_lines(good)


def _unreadable(index: int, root: Path, found: list[InputFile]) -> Callable[[OSError], None]:
    """An `os.walk` error handler that lists an unreadable directory as an input error."""

    def on_error(e: OSError) -> None:
        where = str(e.filename or root)
        rel = os.path.relpath(where, root) if where != str(root) else "."
        found.append(_input(index, where, rel, f"unreadable directory: {e.strerror or e}"))

    return on_error


def _walk(root: Path, index: int, source: SourceConfig, listing: Listing) -> Iterator[InputFile]:
    """Files under root, honouring .gitignore files and skipping vendored directories."""
    import enry

    specs: list[tuple[str, Any]] = []  # (directory, spec) for .gitignore files above us
    errors: list[InputFile] = []  # unreadable directories, in walk order
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable(index, root, errors)):
        yield from errors
        errors.clear()
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
            # enry (Go) and fnmatch get the UTF-8 display name; see `display_name`.
            rel = display_name(os.path.relpath(full, root).replace(os.sep, "/"))
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
            shown = display_name(rel)
            if source.include and not any(fnmatch.fnmatch(shown, g) for g in source.include):
                continue
            if source.exclude and any(fnmatch.fnmatch(shown, g) for g in source.exclude):
                listing.skip(source.name, "excluded")
                continue
            if name == ".gitignore" or os.path.islink(full) or not os.path.isfile(full):
                continue
            if source.gitignore and ignored(full, False):
                listing.skip(source.name, "gitignored")
                continue
            if source.skip_vendored and enry.is_vendor(shown.replace(os.sep, "/")):
                listing.skip(source.name, "vendored")
                continue
            yield _input(index, full, rel)
    yield from errors  # an unreadable root is reported after the walk ends


def _plain_files(root: Path, index: int) -> list[InputFile]:
    """Every file under a jsonl/parquet directory (dotfiles left out), sorted by path."""
    errors: list[InputFile] = []
    found = []
    for dirpath, _, filenames in os.walk(root, onerror=_unreadable(index, root, errors)):
        found += [Path(dirpath, n) for n in filenames if not n.startswith(".")]
    files = [_input(index, str(x), str(x.relative_to(root))) for x in sorted(found) if x.is_file()]
    return files + errors


def list_inputs(recipe: Recipe) -> Listing:
    """Every input file of every source, in a deterministic order.

    An unreadable directory is listed as an input with an `error`, so the build counts it
    under the source's errors and names it, instead of silently leaving out its files.
    """
    listing = Listing()
    for i, source in enumerate(recipe.sources):
        found = 0
        for match in expand_paths(source):
            p = Path(match)
            if p.is_dir():
                if source.format == "files":
                    files = list(_walk(p, i, source, listing))
                else:
                    files = _plain_files(p, i)
            else:
                files = [_input(i, str(p), p.name)]
            listing.files += files
            found += len(files)
        if found == 0:
            raise RecipeError(f"recipe: source '{source.name}': no input files under its paths")
    return listing


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Compressed bytes fed to zstd per call: an error loses at most the output of one feed.
ZSTD_FEED = 1 << 14


class ZstdFrames(io.RawIOBase):
    """A streaming zstd reader that reports damaged frames and truncated files.

    zstandard's `stream_reader` ends silently when a file is cut mid-frame, which would
    lose the rest of the file without a trace; `decompressobj` tells us (`eof`).
    Concatenated frames (as written by parallel compressors) are read one after another.
    A damaged frame is reported to `on_damage` (or raised without one) and reading resumes
    at the next frame's magic number, with a newline so no line spans the gap.
    """

    def __init__(
        self, path: str, chunk: int = 1 << 20, on_damage: Callable[[str], None] | None = None
    ) -> None:
        super().__init__()
        self._fh = open(path, "rb")
        self._chunk = chunk
        self._on_damage = on_damage
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._pending = b""  # compressed bytes read; `_pending[0]` is at byte `_offset`
        self._pos = 0  # the next byte of `_pending` to feed
        self._offset = 0
        self._frame_start = 0
        self._started = False
        self._done = False
        self._buf = b""

    def readable(self) -> bool:
        """Always readable."""
        return True

    def _new_frame(self, start: int) -> None:
        self._d = zstandard.ZstdDecompressor().decompressobj()
        self._frame_start = start

    def _feed(self) -> bytes:
        """Decompressed bytes of the next piece of input (b"" may just mean 'none yet')."""
        if self._pos >= len(self._pending):
            self._offset += len(self._pending)
            self._pending, self._pos = self._fh.read(self._chunk), 0
            if not self._pending:
                self._done = True
                if self._started and not self._d.eof:
                    raise EOFError("zstd stream ends in the middle of a frame (truncated file)")
                return b""
        start = self._pos
        piece = self._pending[start : start + ZSTD_FEED]
        self._pos += len(piece)
        if self._d.eof:  # the previous frame ended exactly at the previous piece's end
            self._new_frame(self._offset + start)
        self._started = True
        out: list[bytes] = []
        try:
            out.append(self._d.decompress(piece))
            while self._d.eof and self._d.unused_data:
                rest = self._d.unused_data
                self._new_frame(self._offset + self._pos - len(rest))
                out.append(self._d.decompress(rest))
        except zstandard.ZstdError as e:
            if self._on_damage is None:
                raise
            out.append(self._resync(self._offset + start, e))
        return b"".join(out)

    def _resync(self, start: int, error: Exception) -> bytes:
        """Skip to the frame after a damaged one; b"\\n" when there is one, b"" at the end."""
        damaged = self._frame_start
        at = max(start, damaged + 1) - self._offset  # where to search in `_pending`
        while (found := self._pending.find(ZSTD_MAGIC, at)) < 0:
            # Keep a tail that may hold the start of a magic number cut by the read.
            keep = self._pending[max(at, len(self._pending) - len(ZSTD_MAGIC) + 1) :]
            self._offset += len(self._pending) - len(keep)
            more = self._fh.read(self._chunk)
            if not more:
                self._pending, self._pos, self._done = b"", 0, True
                self._report(f"zstd frame at byte {damaged} is damaged ({error}); no frame follows")
                return b""
            self._pending, at = keep + more, 0
        self._pos = found
        self._new_frame(self._offset + found)
        self._report(
            f"zstd frame at byte {damaged} is damaged ({error}); "
            f"resumed at byte {self._frame_start}"
        )
        return b"\n"

    def _report(self, message: str) -> None:
        assert self._on_damage is not None
        self._on_damage(message)

    def readinto(self, b) -> int:  # type: ignore[override]
        """Fill `b` with decompressed bytes; 0 at the end of the last complete frame."""
        while not self._buf:
            if self._done:
                return 0
            self._buf = self._feed()
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        """Close the underlying file."""
        self._fh.close()
        super().close()


# Leading bytes of compressed formats; gzip and zstd are read, the others refused by name.
MAGIC = {
    b"\x1f\x8b": "gzip",
    ZSTD_MAGIC: "zstd",
    b"\xfd7zXZ\x00": "xz",
    b"BZh": "bzip2",
    b"\x04\x22\x4d\x18": "lz4",
    b"PK\x03\x04": "zip",
    b"7z\xbc\xaf\x27\x1c": "7z",
    b"\x5d\x00\x00": "lzma",
}
SUFFIXES = {
    ".gz": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".xz": "xz",
    ".bz2": "bzip2",
    ".lz4": "lz4",
    ".zip": "zip",
    ".7z": "7z",
    ".lzma": "lzma",
}


def compression_of(path: str) -> str | None:
    """`gzip`, `zstd`, another format's name, or None (plain), by magic number then suffix."""
    with open(path, "rb") as fh:
        head = fh.read(8)
    for magic, name in MAGIC.items():
        if head.startswith(magic):
            return name
    return SUFFIXES.get(os.path.splitext(path)[1].lower())


class UnsupportedInput(ValueError):
    """A whole file in a format or encoding we do not read (one error for the file)."""


def open_maybe_compressed(
    path: str, on_damage: Callable[[str], None] | None = None
) -> io.BufferedIOBase:
    """Open a file for binary streaming, decompressing gzip and zstd on the fly.

    The format is recognized by its magic number (a gzip file named `.jsonl` is read too);
    any other compression raises `UnsupportedInput` naming it.
    """
    kind = compression_of(path)
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "zstd":
        return io.BufferedReader(ZstdFrames(path, on_damage=on_damage), buffer_size=1 << 20)
    if kind is not None:
        raise UnsupportedInput(f"{kind} compression is not supported (use plain, .gz or .zst)")
    return open(path, "rb")


BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),  # before UTF-16 LE, whose BOM is its prefix
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def check_encoding(first_line: bytes) -> None:
    """Raise `UnsupportedInput` when a file's first line is UTF-16 or UTF-32, not UTF-8."""
    name = next((name for bom, name in BOMS if first_line.startswith(bom)), None)
    # Without a BOM: JSON never holds a raw NUL, but UTF-16/32 has one in every ASCII char.
    if name is None and first_line.count(0) * 4 >= len(first_line) > 0:
        name = "UTF-16 or UTF-32"
    if name is not None:
        raise UnsupportedInput(f"{name} text is not supported (re-encode the file as UTF-8)")


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
        self.stat_update(f"error_{kind}")
        self.stat_update(f"error_{kind}:{self.sources[f.source].name}")
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

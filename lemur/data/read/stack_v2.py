"""The Stack v2 (`format: stack-v2`): metadata rows, each file's content fetched by blob id.

The Stack v2's dataset holds no file content, only metadata (`blob_id`, `src_encoding`,
`language`, `repo_name`, `path`, `license_type`, `is_vendor`, `is_generated`,
`length_bytes`, ...); each file is a gzip object in Software Heritage's bucket,
`s3://softwareheritage/content/{blob_id}`, read with the user's own credentials. This
reader reads the metadata parquet (local or remote, split by row groups like any parquet),
drops rows by license, vendored and generated flags and size BEFORE any request, fetches
the kept blobs `concurrency` at a time (in order: documents come in metadata order),
gunzips each as a stream, stopping past `max_file_bytes` (a blob's metadata may understate
it: a gzip bomb never sits in memory whole), and decodes it with its `src_encoding`. A blob
that is missing, not gzip, too large once gunzipped, or not text in its encoding is counted
under its own error kind with its URL named; it never stops the task. `repo_name` and
`path` stay in the document's metadata, so repository documents can be grouped; the
language is the metadata's (the tagger detects it only where it is missing).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from datatrove.data import Document

from lemur.data.labels import dropped_label, read_label
from lemur.data.read.listing import InputFile
from lemur.data.read.readers import REMOTE_FAILED, ParquetReader, Row
from lemur.data.read.remote import ClientError, Remote, RemoteError, display_url
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.sources import DEFAULT_CONTENT_URL, SourceConfig, content_url

# Metadata columns read besides the id: what the filters, the decoding and the document need.
COLUMNS = (
    "blob_id",
    "src_encoding",
    "language",
    "repo_name",
    "path",
    "license_type",
    "detected_licenses",
    "is_vendor",
    "is_generated",
    "length_bytes",
    "extension",
)
# Kept in each document's metadata (repository grouping reads `repo_name` and `path`).
KEPT = ("blob_id", "repo_name", "license_type", "src_encoding")
# Error kinds of a blob (counted `error_<kind>`, the blob's URL in the message).
MISSING, CORRUPT, UNDECODABLE = "blob_missing", "blob_corrupt", "blob_undecodable"


def skip_reason(row: Row, source: SourceConfig) -> str | None:
    """Why a metadata row is dropped before its blob is fetched, or None to fetch it."""
    if source.licenses is not None and row.get("license_type") not in source.licenses:
        return "license"
    if source.skip_vendored and row.get("is_vendor"):
        return "vendored"
    if (source.skip_generated is None or source.skip_generated) and row.get("is_generated"):
        return "generated"
    return None


def content_options(source: SourceConfig) -> str:
    """Which of a source's storage options its blobs are read with: the content ones when
    given, else the source's own."""
    if source.content_storage_options is not None:
        return "content_storage_options"
    return "storage_options"


def check_content_clients(sources: list[SourceConfig]) -> None:
    """RecipeError, one line naming `sources[i].content_url`, for a stack-v2 source whose
    content filesystem's client cannot be made here (its library missing, a misspelt
    protocol, options its constructor refuses): the build's driver checks before any task,
    so that no task meets it (and no traceback shows its options)."""
    for i, source in enumerate(sources):
        if source.format != "stack-v2":
            continue
        options = getattr(source, content_options(source))
        try:
            Remote(options, source.remote_settings()).client(content_url(source.content_url, "0"))
        except ClientError as e:
            shown = source.content_url or DEFAULT_CONTENT_URL
            raise RecipeError(f"recipe: sources[{i}].content_url '{shown}': {e}") from None


class BlobTooLarge(ValueError):
    """A blob over `max_file_bytes` once gunzipped (counted `too_large`, as a row whose
    `length_bytes` says so)."""


def gunzip(data: bytes, cap: int) -> bytes:
    """The gunzipped bytes of `data` (every gzip member, trailing zero padding skipped, as
    `gzip.decompress` reads them), decompressed as a stream that stops past `cap` bytes.

    Raises `BlobTooLarge` past `cap`, `zlib.error` for bytes that are not gzip (or a bad
    checksum) and `EOFError` for a stream cut short.
    """
    out = bytearray()
    rest = data
    while rest:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer checked
        # At most cap + 1 bytes out: one byte past the cap is enough to know (max_length
        # >= 1 here, since len(out) <= cap; 0 would mean "no limit").
        out += member.decompress(rest, cap + 1 - len(out))
        if len(out) > cap:
            raise BlobTooLarge(f"more than {cap} bytes once gunzipped")
        if not member.eof:
            raise EOFError("compressed stream ended before its end-of-stream marker")
        rest = member.unused_data.lstrip(b"\0")  # gzip.decompress skips zero padding too
    return bytes(out)


def decode_blob(data: bytes, encoding: str | None, cap: int) -> str:
    """A blob's text: gunzipped (at most `cap` bytes, see `gunzip`), decoded with its
    `src_encoding` (UTF-8 when none).

    Raises `BlobTooLarge` past `cap`, `zlib.error`/`EOFError` for a damaged blob and
    `LookupError`/`UnicodeDecodeError` for one that is not text in its encoding.
    """
    return gunzip(data, cap).decode(encoding or "utf-8")


class StackV2Reader(ParquetReader):
    """Stack v2 metadata parquet in, one document per kept file, content fetched by blob id."""

    def columns(self, f: InputFile, names: set[str]) -> list[str] | None:
        """The metadata columns present; None (logged) without `blob_id`."""
        if "blob_id" not in names:
            if f.first:
                self.error("missing_text", f, "no column 'blob_id' (not Stack v2 metadata)")
            return None
        source = self.sources[f.source]
        wanted = set(COLUMNS) | set(self.meta_columns(source, names))
        return sorted(wanted & names)

    def drop(self, f: InputFile, reason: str) -> None:
        """Count a row read from the metadata and dropped for `reason` (never fetched)."""
        name = self.sources[f.source].name
        self.log.stat_update(read_label(name))
        self.log.stat_update(dropped_label(name, reason))

    def blob_fields(self, f: InputFile, row: Row) -> tuple[str, dict[str, Any]]:
        """(document id, metadata fields) of a metadata row: the blob id by default."""
        source = self.sources[f.source]
        extra: dict[str, Any] = self.row_metadata(row, source)
        extra.update({k: row[k] for k in KEPT if row.get(k) is not None})
        path = row.get(source.path_key or "path")
        if isinstance(path, str) and path:  # the file's path in its repository
            extra["path"] = path
            extra.pop("path_is_container", None)
        return str(row.get(source.id_key) or row["blob_id"]), extra

    def content_url(self, f: InputFile, row: Row) -> str:
        """The URL of a row's blob."""
        return content_url(self.sources[f.source].content_url, row["blob_id"])

    def read(self, f: InputFile) -> Iterator[Document]:
        """The documents of a metadata file (or row-group run), blobs fetched ahead."""
        source = self.sources[f.source]
        remote = self.log.remote.remote(f.source, content_options(source))
        window = 2 * source.remote_settings().concurrency
        pending: deque[tuple[int, Row, str, Future[bytes]]] = deque()
        for number, row in self.rows(f):
            if not isinstance(row.get("blob_id"), str) or not row["blob_id"]:
                self.error("missing_text", f, "no blob_id", number)
                continue
            reason = skip_reason(row, source)
            if reason is None and (row.get("length_bytes") or 0) > source.max_file_bytes:
                self.error("too_large", f, f"{row['length_bytes']} bytes > max_file_bytes", number)
                continue
            if reason is not None:
                self.drop(f, reason)
                continue
            doc_id, extra = self.blob_fields(f, row)
            if self.excluded(f, doc_id, self.metadata(f, extra, number)):
                continue  # an opt-out: never fetched (counted `excluded`)
            url = self.content_url(f, row)
            pending.append((number, row, url, remote.pool.submit(remote.cat, url)))
            if len(pending) >= window:
                yield from self.finish(f, *pending.popleft())
        while pending:
            yield from self.finish(f, *pending.popleft())

    def finish(
        self, f: InputFile, number: int, row: Row, url: str, fetched: Future[bytes]
    ) -> Iterator[Document]:
        """The document of a fetched blob, or its error counted by kind, URL named."""
        shown = display_url(url)
        source = self.sources[f.source]
        try:
            text = decode_blob(fetched.result(), row.get("src_encoding"), source.max_file_bytes)
        except BlobTooLarge as e:
            said = f"; its metadata says {row['length_bytes']}" if "length_bytes" in row else ""
            self.error("too_large", f, f"{shown}: {e} (> max_file_bytes{said})", number)
            return
        except FileNotFoundError:
            self.error(MISSING, f, f"{shown}: no such object", number)
            return
        except RemoteError as e:
            self.error(REMOTE_FAILED, f, str(e), number)
            return
        except (zlib.error, EOFError) as e:
            self.error(CORRUPT, f, f"{shown}: not a whole gzip blob ({e})", number)
            return
        except (LookupError, UnicodeDecodeError) as e:
            encoding = row.get("src_encoding")
            self.error(UNDECODABLE, f, f"{shown}: not {encoding} text ({e})", number)
            return
        doc_id, extra = self.blob_fields(f, row)
        doc = self.document(f, text, doc_id, extra, number)
        if doc is not None:
            yield doc

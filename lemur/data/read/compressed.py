"""Opening inputs: gzip and zstd streams that survive bad frames; compression, encoding checks."""

from __future__ import annotations

import codecs
import gzip
import io
import os
from collections.abc import Callable
from typing import BinaryIO

import zstandard

# Opens an input by name for binary reading: a local file, or a remote one (remote.py).
Opener = Callable[[str], BinaryIO]


def open_local(path: str) -> BinaryIO:
    """A local file, buffered for streaming (the default `Opener`)."""
    return open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - the caller closes


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
        self,
        path: str | BinaryIO,
        chunk: int = 1 << 20,
        on_damage: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self._fh = open(path, "rb") if isinstance(path, str) else path  # noqa: SIM115
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


PARQUET_MAGIC = b"PAR1"


def is_parquet(path: str, opener: Opener = open_local) -> bool:
    """Whether a file is parquet (by its name or its `PAR1` magic number), e.g. a chat input."""
    if path.endswith(".parquet"):
        return True
    try:
        with opener(path) as fh:
            return fh.read(4) == PARQUET_MAGIC
    except OSError:  # the jsonl reader reports the unreadable file
        return False


def compression_of(path: str, opener: Opener = open_local) -> str | None:
    """`gzip`, `zstd`, another format's name, or None (plain), by magic number then suffix."""
    with opener(path) as fh:
        return compression_by_head(fh.read(8), path)


def compression_by_head(head: bytes, path: str) -> str | None:
    """`compression_of` a file whose first bytes are `head`."""
    for magic, name in MAGIC.items():
        if head.startswith(magic):
            return name
    return SUFFIXES.get(os.path.splitext(path)[1].lower())


class UnsupportedInput(ValueError):
    """A whole file in a format or encoding we do not read (one error for the file)."""


def open_maybe_compressed(
    path: str, on_damage: Callable[[str], None] | None = None, opener: Opener = open_local
) -> io.BufferedIOBase:
    """Open a file for binary streaming, decompressing gzip and zstd on the fly.

    The format is recognized by its magic number (a gzip file named `.jsonl` is read too);
    any other compression raises `UnsupportedInput` naming it. The file is opened once by
    `opener` (a remote input is not fetched twice for its first bytes).
    """
    fh = opener(path)
    try:
        kind = compression_by_head(fh.read(8), path)
        fh.seek(0)
        if kind is not None and kind not in ("gzip", "zstd"):
            raise UnsupportedInput(f"{kind} compression is not supported (use plain, .gz or .zst)")
    except BaseException:
        fh.close()
        raise
    if kind == "gzip":
        stream = gzip.GzipFile(filename=path, mode="rb", fileobj=fh)
        stream.myfileobj = fh  # closed with the stream, as gzip.open(path) does with its own
        return stream
    if kind == "zstd":
        return io.BufferedReader(ZstdFrames(fh, on_damage=on_damage), buffer_size=1 << 20)
    return fh  # type: ignore[return-value]


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

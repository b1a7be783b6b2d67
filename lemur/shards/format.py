"""The shard directory format (`lemur-shards/1`): writing, reading and checksumming shards.

See docs/format.md for the contract. A shard is a flat little-endian token array (`.bin`)
plus a flat uint64 array of exclusive document end offsets (`.idx`), and in chat builds a
loss mask (`.mask`, one uint8 0/1 per token); `manifest.json` lists every shard with its
token/document counts and sha256s.
"""

from __future__ import annotations

import hashlib
import json
import mmap as mmap_module
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The one atomic write (every layer uses it; shard writers and many callers import it here).
from lemur.atomic_files import atomic_write_bytes

FORMAT = "lemur-shards/1"
MANIFEST = "manifest.json"
INDEX_DTYPE = np.dtype("<u8")
MASK_DTYPE = np.dtype("u1")
# A shard's provenance file beside its `.bin` (`{rel}.documents.parquet`): optional.
PROVENANCE_SUFFIX = ".documents.parquet"


class ShardFormatError(ValueError):
    """A shard directory that is missing, malformed or inconsistent."""


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest little-endian unsigned dtype that holds every id of a vocabulary."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
    """The manifest spelling of a token dtype ("uint16" or "uint32")."""
    return np.dtype(dtype).newbyteorder("=").name


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks so large shards never sit in memory."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically with sorted keys, so equal content gives equal bytes."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


@dataclass(frozen=True)
class ShardInfo:
    """One entry of `manifest.json` `shards`."""

    file: str
    index: str
    split: str
    domain: str
    tokens: int
    documents: int
    sha256: str
    mask: str | None = None  # chat builds: the loss mask file and its sha256
    mask_sha256: str | None = None
    # Builds with `output.provenance`: the shard's documents.parquet (one row per document,
    # in the order of the index) and its sha256.
    provenance: str | None = None
    provenance_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The manifest dict of this shard (`mask` keys only when it has a mask)."""
        out: dict[str, Any] = {
            "file": self.file,
            "index": self.index,
            "split": self.split,
            "domain": self.domain,
            "tokens": self.tokens,
            "documents": self.documents,
            "sha256": self.sha256,
        }
        if self.mask is not None:
            out["mask"], out["mask_sha256"] = self.mask, self.mask_sha256
        if self.provenance is not None:
            out["provenance"] = self.provenance
            out["provenance_sha256"] = self.provenance_sha256
        return out


def write_shard(
    root: Path,
    rel: str,
    tokens: np.ndarray,
    ends: Sequence[int] | np.ndarray,
    dtype: np.dtype,
    split: str,
    domain: str,
    mask: np.ndarray | None = None,
) -> ShardInfo:
    """Write one shard, `{rel}.idx` (then `{rel}.mask`) then `{rel}.bin`, each atomically.

    Every writer of shards comes here, so the bytes on disk have one definition: tokens as
    little-endian `dtype`, document ends as little-endian uint64, the loss mask (chat
    builds) as one uint8 per token. Returns the shard's manifest entry.
    """
    rel_bin, rel_idx = f"{rel}.bin", f"{rel}.idx"
    # the array's own buffer when it already is little-endian and contiguous: no copy
    payload = np.ascontiguousarray(tokens, np.dtype(dtype).newbyteorder("<")).data
    atomic_write_bytes(root / rel_idx, np.asarray(ends, INDEX_DTYPE).tobytes())
    masked: dict[str, str] = {}
    if mask is not None:
        if len(mask) != tokens.size:
            raise ValueError(f"{rel}: mask of {len(mask)} values for {tokens.size} tokens")
        mask_bytes = np.asarray(mask, MASK_DTYPE).tobytes()
        atomic_write_bytes(root / f"{rel}.mask", mask_bytes)
        masked = {"mask": f"{rel}.mask", "mask_sha256": hashlib.sha256(mask_bytes).hexdigest()}
    atomic_write_bytes(root / rel_bin, payload)
    return ShardInfo(
        file=rel_bin,
        index=rel_idx,
        split=split,
        domain=domain,
        tokens=int(tokens.size),
        documents=len(ends),
        sha256=hashlib.sha256(payload).hexdigest(),
        **masked,
    )


class ShardWriter:
    """Appends documents to numbered shards of about `shard_tokens` tokens under one prefix.

    Documents are never split across shards. Each shard is written under a temporary
    name and renamed when complete, so a killed build never leaves a shard that looks
    finished. Files are named `{prefix}/{n:05d}.bin|.idx` relative to `root`.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        prefix: str,
        split: str,
        domain: str,
        dtype: np.dtype,
        shard_tokens: int,
    ) -> None:
        self.root = Path(root)
        self.prefix = prefix
        self.split = split
        self.domain = domain
        self.dtype = np.dtype(dtype)
        self.shard_tokens = int(shard_tokens)
        self.shards: list[ShardInfo] = []
        self._parts: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._ends: list[int] = []
        self._size = 0

    def add(self, tokens: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Append one document (already framed as `<s> ... </s>`), with its loss mask if any.

        Either every document of a writer has a mask or none has.
        """
        if self._size and self._size + len(tokens) > self.shard_tokens:
            self._flush()
        if (mask is not None) != bool(self._masks) and self._parts:
            raise ValueError("ShardWriter: documents with and without a loss mask in one shard")
        self._parts.append(np.asarray(tokens, dtype=self.dtype))
        if mask is not None:
            self._masks.append(np.asarray(mask, MASK_DTYPE))
        self._size += len(tokens)
        self._ends.append(self._size)

    def _flush(self) -> None:
        if not self._ends:
            return
        n = len(self.shards)
        rel = f"{self.prefix}/{n:05d}"
        tokens = np.concatenate(self._parts)
        mask = np.concatenate(self._masks) if self._masks else None
        info = write_shard(
            self.root, rel, tokens, self._ends, self.dtype, self.split, self.domain, mask
        )
        self.shards.append(info)
        self._parts, self._masks, self._ends, self._size = [], [], [], 0

    def close(self) -> list[ShardInfo]:
        """Write the last partial shard and return every shard written."""
        self._flush()
        return self.shards


def tokenizer_entry(
    directory: str | os.PathLike, file: str, vocab_size: int, bos_id: int | None, eos_id: int
) -> dict[str, Any]:
    """The manifest's tokenizer entry for `file` (relative to `directory`, already there):
    its name, sha256, vocab size and BOS/EOS ids."""
    return {
        "file": file,
        "sha256": sha256_file(Path(directory) / file),
        "vocab_size": int(vocab_size),
        "bos_id": bos_id,
        "eos_id": int(eos_id),
    }


def make_manifest(
    dtype: np.dtype,
    seq_len: int,
    tokenizer: dict[str, Any],
    shards: Sequence[ShardInfo],
    **sections: Any,
) -> dict[str, Any]:
    """A manifest of `shards`: the format's own keys, then the writer's `sections` (a build's
    mix, counts, recipe; docs/format.md lists them)."""
    return {
        "format": FORMAT,
        "dtype": dtype_name(dtype),
        "seq_len": int(seq_len),
        "tokenizer": tokenizer,
        "shards": [s.to_json() for s in shards],
        **sections,
    }


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write `manifest` as the directory's manifest.json (atomically, sorted keys); its path."""
    path = Path(directory) / MANIFEST
    atomic_write_json(path, manifest)
    return path


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """Load and structurally check `manifest.json` of a shard directory."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ShardFormatError(f"{path}: no manifest (is this a lemur shard directory?)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ShardFormatError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ShardFormatError(f"{path}: format is not {FORMAT!r}")
    for key in ("dtype", "seq_len", "tokenizer", "shards"):
        if key not in manifest:
            raise ShardFormatError(f"{path}: missing key {key!r}")
    if manifest["dtype"] not in ("uint16", "uint32"):
        raise ShardFormatError(f"{path}: dtype {manifest['dtype']!r} is not uint16 or uint32")
    return manifest


def open_array(
    path: str | os.PathLike, dtype: np.dtype | type, shape_tail: tuple[int, ...] = ()
) -> np.ndarray:
    """A read-only memory map of a flat array file, or an empty array for an empty file.

    (`np.memmap` refuses a file of zero bytes, which an empty shard or task writes.)
    """
    if Path(path).stat().st_size == 0:
        return np.zeros((0, *shape_tail), dtype)
    return np.memmap(path, dtype=dtype, mode="r").reshape(-1, *shape_tail)


def release_pages(arr: np.ndarray) -> None:
    """Drop a memory-mapped array's pages from this process's resident set.

    Reading a whole file through a memmap would otherwise leave all of it resident
    (file-backed, but counted in RSS), growing memory with corpus size.
    """
    mm = getattr(arr, "_mmap", None)
    if mm is None and isinstance(getattr(arr, "base", None), np.memmap):
        mm = getattr(arr.base, "_mmap", None)
    if mm is not None and hasattr(mmap_module, "MADV_DONTNEED"):
        mm.madvise(mmap_module.MADV_DONTNEED)


def open_tokens(directory: str | os.PathLike, shard: dict[str, Any], dtype: str) -> np.ndarray:
    """Memory-map a shard's token array (no copy)."""
    return open_array(Path(directory) / shard["file"], np.dtype(dtype).newbyteorder("<"))


def open_index(directory: str | os.PathLike, shard: dict[str, Any]) -> np.ndarray:
    """Memory-map a shard's document end offsets (uint64, exclusive)."""
    return open_array(Path(directory) / shard["index"], INDEX_DTYPE)


def open_mask(directory: str | os.PathLike, shard: dict[str, Any]) -> np.ndarray | None:
    """Memory-map a shard's loss mask (uint8 per token), or None for a shard without one."""
    if "mask" not in shard:
        return None
    return open_array(Path(directory) / shard["mask"], MASK_DTYPE)

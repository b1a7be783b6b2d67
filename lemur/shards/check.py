"""Structure and compatibility checks of a shard directory, cheap enough for start-up.

`ShardDir` is a directory opened once: its manifest read once, the tokenizer hashed at
most once, each check run once. `structure_problem` states the structural rules of one
shard (file sizes, index ends; no hashing); `check_structure` raises it, `lemur-data
stats` reports it. `check_compatible` adds the tokenizer hash, vocabulary and dtype, and
the shards' contents (every document index, a sample of token ids). `lemur-data verify`
reads all.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lemur.shards.format import (
    INDEX_DTYPE,
    ShardFormatError,
    dtype_name,
    read_manifest,
    sha256_file,
    token_dtype,
)


class ShardCompatibilityError(ShardFormatError):
    """A shard directory that does not match what the model or the other sources expect."""


# Index entries checked per vectorized pass: bounded memory (32 MiB) on any shard size.
_INDEX_CHUNK = 1 << 22
# Token ids sampled per shard at start-up: this many evenly spaced blocks of this length.
SAMPLE_BLOCKS, SAMPLE_LEN = 16, 4096
_VERIFY_HINT = "(`lemur-data verify DIR` checks every shard)"


def shards_of(manifest: dict[str, Any], split: str, domain: str | None) -> list[dict[str, Any]]:
    """The manifest's shards of one split, and of one domain unless `domain` is None."""
    return [
        s
        for s in manifest["shards"]
        if s.get("split") == split and (domain is None or s.get("domain") == domain)
    ]


def structure_problem(
    directory: str | os.PathLike, shard: dict[str, Any], itemsize: int, *, whole_index: bool = True
) -> str | None:
    """The first structural problem of one shard (no hashing), as one line naming the file.

    Both files (and the `.mask` a chat shard lists, the documents.parquet a provenance
    build's lists) exist, the `.bin` holds `tokens *
    itemsize` bytes, the `.idx` `documents * 8` bytes, the `.mask` `tokens` bytes, and the
    last end offset is `tokens`; with `whole_index`, every
    end offset also increases strictly (`index_problem`). The one statement of these
    rules: start-up checks (`check_structure`) raise it, `lemur-data stats` reports it.
    """
    directory = Path(directory)
    bin_path, idx_path = directory / shard["file"], directory / shard["index"]
    tokens, documents = int(shard["tokens"]), int(shard["documents"])
    mask_path = directory / shard["mask"] if "mask" in shard else None  # chat builds
    # `output.provenance`: its documents.parquet (its rows are verify's to count).
    docs_path = directory / shard["provenance"] if "provenance" in shard else None
    for path in (bin_path, idx_path, mask_path, docs_path):
        if path is not None and not path.is_file():
            return f"{path}: shard file listed in the manifest is missing"
    if (size := bin_path.stat().st_size) != tokens * itemsize:
        return (
            f"{bin_path}: {size} bytes, manifest says {tokens} tokens x {itemsize} bytes "
            "(truncated or extended)"
        )
    if (size := idx_path.stat().st_size) != documents * INDEX_DTYPE.itemsize:
        return f"{idx_path}: {size} bytes, manifest says {documents} documents x 8 bytes"
    if mask_path is not None and (size := mask_path.stat().st_size) != tokens:
        return f"{mask_path}: {size} bytes, manifest says {tokens} tokens x 1 mask byte"
    if not documents:
        return None
    if whole_index and (problem := index_problem(idx_path, tokens)):
        return problem
    # The last end offset must be the token count: a cheap test that the index belongs
    # to this shard (8 bytes read, no full scan).
    with open(idx_path, "rb") as f:
        f.seek(-INDEX_DTYPE.itemsize, os.SEEK_END)
        last = int(np.frombuffer(f.read(INDEX_DTYPE.itemsize), INDEX_DTYPE)[0])
    if last != tokens:
        return f"{idx_path}: last document ends at {last}, manifest says {tokens} tokens"
    return None


def check_structure(
    directory: str | os.PathLike,
    shards: Sequence[dict[str, Any]] | None = None,
    manifest: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Quick structural check of a shard directory (`ShardDir.check_structure`).

    Raises `ShardFormatError` with one line naming the offending file; returns the
    manifest (read unless given).
    """
    shard_dir = ShardDir(directory, manifest)
    shard_dir.check_structure(shards)
    return shard_dir.manifest


def index_problem(path: str | os.PathLike, tokens: int) -> str | None:
    """An index whose end offsets do not increase strictly or pass `tokens` (vectorized).

    Reads the whole `.idx` (8 bytes per document) in 32 MiB chunks and names the first
    bad entry. Together with the last entry being `tokens`, every document then lies
    inside the shard and holds at least one token.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        return None
    ends = np.memmap(path, dtype=INDEX_DTYPE, mode="r")
    prev = np.uint64(0)
    for lo in range(0, len(ends), _INDEX_CHUNK):
        chunk = np.asarray(ends[lo : lo + _INDEX_CHUNK])
        before = np.empty_like(chunk)
        before[0], before[1:] = prev, chunk[:-1]
        bad = (chunk <= before) | (chunk > tokens)
        if bad.any():
            i = int(np.argmax(bad))
            return (
                f"{path}: document index entry {lo + i} is {int(chunk[i])} (previous "
                f"{int(before[i])}, shard of {tokens} tokens): corrupt index"
            )
        prev = chunk[-1]
    del ends
    return None


def check_index(path: str | os.PathLike, tokens: int) -> None:
    """Refuse (`ShardFormatError`, one line) an index with an `index_problem`."""
    if problem := index_problem(path, tokens):
        raise ShardFormatError(f"{problem} {_VERIFY_HINT}")


def check_token_sample(path: str | os.PathLike, dtype: np.dtype, vocab_size: int) -> None:
    """Refuse a shard whose sampled token ids reach `vocab_size` (evenly spaced blocks).

    A sample, not a scan: start-up stays fast on any corpus; `ShardSource` checks every
    window it reads when given `vocab_size`, so an id the sample missed still stops the run
    with the shard's name instead of a NaN loss.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        return
    tokens = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r")
    n = len(tokens)
    starts = np.unique(np.linspace(0, max(n - SAMPLE_LEN, 0), SAMPLE_BLOCKS).astype(np.int64))
    for start in starts.tolist():
        block = np.asarray(tokens[start : start + SAMPLE_LEN])
        if block.size and int(block.max()) >= vocab_size:
            i = int(np.argmax(block >= vocab_size))
            raise ShardFormatError(token_error(path, start + i, int(block[i]), vocab_size))
    del tokens


def token_error(path: str | os.PathLike, offset: int, token: int, vocab_size: int) -> str:
    """The one-line error for a token id outside the vocabulary."""
    return (
        f"{path}: token id {token} at offset {offset} >= vocab_size {vocab_size} "
        f"(corrupt shard, or built with another tokenizer) {_VERIFY_HINT}"
    )


def check_contents(directory: str | os.PathLike, manifest: dict[str, Any], vocab_size: int) -> None:
    """Every shard's document index (whole) and a sample of its token ids."""
    directory = Path(directory)
    dtype = np.dtype(manifest["dtype"])
    for shard in manifest["shards"]:
        check_index(directory / shard["index"], int(shard["tokens"]))
        check_token_sample(directory / shard["file"], dtype, vocab_size)


def check_compatible(
    directory: str | os.PathLike | ShardDir,
    *,
    vocab_size: int,
    tokenizer_sha256: str | None = None,
    seq_len: int | None = None,
) -> dict[str, Any]:
    """Refuse a shard directory the model cannot train on (`ShardDir.check_compatible`);
    return its manifest."""
    shard_dir = ShardDir.of(directory)
    shard_dir.check_compatible(
        vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256, seq_len=seq_len
    )
    return shard_dir.manifest


class ShardDir:
    """One shard directory opened for reading: its manifest read once, each check run once.

    The trainer and the evals open a directory once and hand this object to every reader
    (`ShardSource`, the streams, the bpb tables), so start-up reads each `manifest.json`
    once, hashes the tokenizer copy at most once (lazily), and checks each shard's
    structure and contents once however many streams read it.
    """

    # How a window source reads a shard's document ends: None for our `.idx` (mapped as it
    # is); for another trainer's index (lemur.export.foreign: Megatron's lengths), a
    # module-level function of the index path returning int64 ends (sources are pickled).
    index_reader: Callable[[Path], np.ndarray] | None = None

    def __init__(
        self, directory: str | os.PathLike, manifest: dict[str, Any] | None = None
    ) -> None:
        self.path = Path(directory)
        self._name = os.fspath(directory)
        self.manifest = read_manifest(self.path) if manifest is None else manifest
        self._structure_ok: set[str] = set()  # files of the shards whose structure passed
        self._contents_ok: set[int] = set()  # vocab sizes check_contents passed for

    @classmethod
    def of(cls, directory: str | os.PathLike | ShardDir) -> ShardDir:
        """`directory` itself when already open, else a new `ShardDir` of it."""
        return directory if isinstance(directory, ShardDir) else cls(directory)

    def __str__(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"ShardDir({self._name!r})"

    @property
    def tokenizer(self) -> dict[str, Any]:
        """The manifest's `tokenizer` entry (file, sha256, vocab_size, bos_id, eos_id)."""
        return self.manifest["tokenizer"]

    @property
    def tokenizer_path(self) -> Path:
        """The directory's copy of the SentencePiece model."""
        return self.path / str(self.tokenizer.get("file", "tokenizer.model"))

    @functools.cached_property
    def tokenizer_file_sha256(self) -> str:
        """sha256 of the tokenizer copy on disk, computed on first use only."""
        return sha256_file(self.tokenizer_path)

    def shards(self, split: str, domain: str | None = None) -> list[dict[str, Any]]:
        """The manifest's shards of one split (and one domain unless None)."""
        return shards_of(self.manifest, split, domain)

    def domains(self, split: str) -> list[str]:
        """The sorted domains that have shards in `split`."""
        return sorted({s["domain"] for s in self.shards(split)})

    def check_structure(self, shards: Sequence[dict[str, Any]] | None = None) -> None:
        """The tokenizer copy exists and each of `shards` (default all) has no
        `structure_problem` (last index entry only); `ShardFormatError` names the file."""
        if not self.tokenizer_path.is_file():
            raise ShardFormatError(
                f"{self.tokenizer_path}: tokenizer file listed in the manifest is missing"
            )
        itemsize = np.dtype(self.manifest["dtype"]).itemsize
        for shard in self.manifest["shards"] if shards is None else shards:
            if shard["file"] in self._structure_ok:
                continue
            if problem := structure_problem(self.path, shard, itemsize, whole_index=False):
                raise ShardFormatError(problem)
            self._structure_ok.add(shard["file"])

    def check_compatible(
        self, *, vocab_size: int, tokenizer_sha256: str | None = None, seq_len: int | None = None
    ) -> None:
        """Refuse a directory the model cannot train on (`ShardFormatError`, one line).

        Checks the structure, that the tokenizer copy hashes to the manifest's sha256,
        that the manifest's vocab size equals `vocab_size`, that the token dtype is the
        one `vocab_size` needs, that the tokenizer is `tokenizer_sha256` if given, that at
        least one `seq_len + 1` window fits in a train shard if `seq_len` is given, and
        the shards' contents (`check_contents`: every document index, sampled token ids).
        """
        self.check_structure()
        where, tok = self.path / "manifest.json", self.tokenizer
        if self.tokenizer_file_sha256 != tok.get("sha256"):
            raise ShardCompatibilityError(
                f"{self.tokenizer_path}: sha256 differs from the manifest's tokenizer.sha256 "
                "(stale copy?)"
            )
        if tokenizer_sha256 is not None and tok.get("sha256") != tokenizer_sha256:
            raise ShardCompatibilityError(
                f"{where}: tokenizer sha256 {str(tok.get('sha256'))[:12]}... differs from the "
                f"model's {tokenizer_sha256[:12]}... (shards built with another tokenizer)"
            )
        if tok.get("vocab_size") != vocab_size:
            raise ShardCompatibilityError(
                f"{where}: tokenizer vocab_size {tok.get('vocab_size')} != model vocab_size "
                f"{vocab_size}"
            )
        want = dtype_name(token_dtype(vocab_size))
        if self.manifest["dtype"] != want:
            raise ShardCompatibilityError(
                f"{where}: token dtype {self.manifest['dtype']} but vocab_size {vocab_size} "
                f"needs {want}"
            )
        if seq_len is not None:
            if seq_len < 1:
                raise ValueError(f"seq_len must be positive, got {seq_len}")
            if not any(int(s["tokens"]) > seq_len for s in self.shards("train")):
                raise ShardCompatibilityError(
                    f"{where}: no train shard holds a window of seq_len + 1 = {seq_len + 1} tokens"
                )
        if vocab_size not in self._contents_ok:
            check_contents(self.path, self.manifest, vocab_size)
            self._contents_ok.add(vocab_size)

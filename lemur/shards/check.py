"""Structure and compatibility checks of a shard directory, cheap enough for start-up.

`check_structure` compares file sizes and last index entries with the manifest (no
hashing); `check_compatible` adds the tokenizer hash, vocabulary and dtype, and the shards'
contents (every document index, a sample of token ids). `lemur-data verify` reads all.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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
_SAMPLE_BLOCKS, _SAMPLE_LEN = 16, 4096
_VERIFY_HINT = "(`lemur-data verify DIR` checks every shard)"


def shards_of(manifest: dict[str, Any], split: str, domain: str | None) -> list[dict[str, Any]]:
    """The manifest's shards of one split, and of one domain unless `domain` is None."""
    return [
        s
        for s in manifest["shards"]
        if s.get("split") == split and (domain is None or s.get("domain") == domain)
    ]


def check_structure(
    directory: str | os.PathLike,
    shards: Sequence[dict[str, Any]] | None = None,
    manifest: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Quick structural check of a shard directory (sizes and last offsets, no hashing).

    Checks that the tokenizer copy and every listed shard exist, that each `.bin` holds
    `tokens * itemsize` bytes, each `.idx` holds `documents * 8` bytes and ends at
    `tokens`. Raises `ShardFormatError` with one line naming the offending file.
    Returns the manifest.
    """
    directory = Path(directory)
    manifest = read_manifest(directory) if manifest is None else manifest
    tok = manifest["tokenizer"]
    tok_path = directory / str(tok.get("file", "tokenizer.model"))
    if not tok_path.is_file():
        raise ShardFormatError(f"{tok_path}: tokenizer file listed in the manifest is missing")
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for shard in manifest["shards"] if shards is None else shards:
        bin_path, idx_path = directory / shard["file"], directory / shard["index"]
        tokens, documents = int(shard["tokens"]), int(shard["documents"])
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise ShardFormatError(f"{path}: shard file listed in the manifest is missing")
        if (size := bin_path.stat().st_size) != tokens * itemsize:
            raise ShardFormatError(
                f"{bin_path}: {size} bytes, manifest says {tokens} tokens x {itemsize} bytes"
            )
        if (size := idx_path.stat().st_size) != documents * INDEX_DTYPE.itemsize:
            raise ShardFormatError(
                f"{idx_path}: {size} bytes, manifest says {documents} documents x 8 bytes"
            )
        if documents:
            # The last end offset must be the token count: a cheap test that the index
            # belongs to this shard (8 bytes read, no full scan).
            with open(idx_path, "rb") as f:
                f.seek(-INDEX_DTYPE.itemsize, os.SEEK_END)
                last = int(np.frombuffer(f.read(INDEX_DTYPE.itemsize), INDEX_DTYPE)[0])
            if last != tokens:
                raise ShardFormatError(
                    f"{idx_path}: last document ends at {last}, manifest says {tokens} tokens"
                )
    return manifest


def check_index(path: str | os.PathLike, tokens: int) -> None:
    """Refuse a document index whose end offsets decrease or pass `tokens` (vectorized).

    Reads the whole `.idx` (8 bytes per document) in chunks; raises `ShardFormatError`
    naming the file and the first bad entry. Together with the last entry being `tokens`
    (`check_structure`), every document then lies inside the shard.
    """
    path = Path(path)
    if path.stat().st_size == 0:
        return
    ends = np.memmap(path, dtype=INDEX_DTYPE, mode="r")
    prev = np.uint64(0)
    for lo in range(0, len(ends), _INDEX_CHUNK):
        chunk = np.asarray(ends[lo : lo + _INDEX_CHUNK])
        before = np.empty_like(chunk)
        before[0], before[1:] = prev, chunk[:-1]
        bad = (chunk < before) | (chunk > tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise ShardFormatError(
                f"{path}: document index entry {lo + i} is {int(chunk[i])} (previous "
                f"{int(before[i])}, shard of {tokens} tokens): corrupt index {_VERIFY_HINT}"
            )
        prev = chunk[-1]
    del ends


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
    starts = np.unique(np.linspace(0, max(n - _SAMPLE_LEN, 0), _SAMPLE_BLOCKS).astype(np.int64))
    for start in starts.tolist():
        block = np.asarray(tokens[start : start + _SAMPLE_LEN])
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
    directory: str | os.PathLike,
    *,
    vocab_size: int,
    tokenizer_sha256: str | None = None,
    seq_len: int | None = None,
) -> dict[str, Any]:
    """Refuse a shard directory the model cannot train on; return its manifest.

    Checks the structure (`check_structure`), that the tokenizer copy hashes to the
    manifest's sha256, that the manifest's vocab size equals `vocab_size`, that the
    token dtype is the one `vocab_size` needs, that the tokenizer is `tokenizer_sha256`
    if given, that at least one `seq_len + 1` window fits in a train shard if
    `seq_len` is given, and the shards' contents (`check_contents`: every document
    index, sampled token ids). Raises `ShardFormatError` (one line, naming the file).
    """
    directory = Path(directory)
    manifest = check_structure(directory)
    where = directory / "manifest.json"
    tok = manifest["tokenizer"]
    tok_path = directory / str(tok.get("file", "tokenizer.model"))
    if sha256_file(tok_path) != tok.get("sha256"):
        raise ShardCompatibilityError(
            f"{tok_path}: sha256 differs from the manifest's tokenizer.sha256 (stale copy?)"
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
    if manifest["dtype"] != want:
        raise ShardCompatibilityError(
            f"{where}: token dtype {manifest['dtype']} but vocab_size {vocab_size} needs {want}"
        )
    if seq_len is not None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if not any(int(s["tokens"]) > seq_len for s in shards_of(manifest, "train", None)):
            raise ShardCompatibilityError(
                f"{where}: no train shard holds a window of seq_len + 1 = {seq_len + 1} tokens"
            )
    check_contents(directory, manifest, vocab_size)
    return manifest

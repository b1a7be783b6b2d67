"""`lemur-data verify`: recompute checksums and check every shard invariant."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lemur.shards.check import structure_problem
from lemur.shards.format import (
    INDEX_DTYPE,
    MANIFEST,
    MASK_DTYPE,
    ShardFormatError,
    read_manifest,
    sha256_file,
)

CHUNK_TOKENS = 1 << 24
# Manifest fields every reader relies on, with their JSON types.
# `bos_id` is checked apart: it may be null (a model that frames without BOS, Qwen2.5).
TOKENIZER_FIELDS = {"file": str, "sha256": str, "vocab_size": int, "eos_id": int}
SHARD_FIELDS = {
    "file": str,
    "index": str,
    "split": str,
    "domain": str,
    "tokens": int,
    "documents": int,
    "sha256": str,
}
TYPE_NAMES = {str: "a string", int: "an integer"}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _inside(rel: str) -> bool:
    """A relative path that stays inside the shard directory."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _field_problem(entry: Any, fields: dict[str, type], where: str) -> str | None:
    """The first missing or mistyped field of one manifest entry (integers must be >= 0)."""
    if not isinstance(entry, dict):
        return f"{where} must be a mapping, got {_short(entry)}"
    for name, tp in fields.items():
        value = entry.get(name)
        if not isinstance(value, tp) or isinstance(value, bool) or (tp is int and value < 0):
            bound = " >= 0" if tp is int else ""
            return f"{where}.{name} must be {TYPE_NAMES[tp]}{bound}, got {_short(value)}"
    for name in ("file", "index", "mask"):
        if name in entry and not (isinstance(entry[name], str) and _inside(entry[name])):
            return f"{where}.{name} {_short(entry[name])} is not a path inside the directory"
    return None


def manifest_problems(manifest: dict[str, Any], path: Path) -> list[str]:
    """Fields of a manifest with a wrong type, each a one-line message naming the field."""
    found = [_field_problem(manifest, {"seq_len": int}, "manifest")]
    tok = manifest.get("tokenizer")
    found.append(_field_problem(tok, TOKENIZER_FIELDS, "tokenizer"))
    if isinstance(tok, dict):
        bos = tok.get("bos_id", "missing")
        if bos is not None and (not isinstance(bos, int) or isinstance(bos, bool) or bos < 0):
            found.append(f"tokenizer.bos_id must be an integer >= 0 or null, got {_short(bos)}")
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        found.append(f"shards must be a list, got {_short(shards)}")
    else:
        found += [_field_problem(s, SHARD_FIELDS, f"shards[{i}]") for i, s in enumerate(shards)]
    if manifest.get("framing", "template") != "template":
        found.append(f'framing must be "template" or absent, got {_short(manifest["framing"])}')
    for key in ("mix", "counts"):
        if not isinstance(manifest.get(key, {}), dict):
            found.append(f"{key} must be a mapping, got {_short(manifest[key])}")
    mix = manifest.get("mix")
    tokens = mix.get("tokens", {}) if isinstance(mix, dict) else {}
    if not isinstance(tokens, dict) or not all(type(v) is int for v in tokens.values()):
        found.append(f"mix.tokens must map domains to integers, got {_short(tokens)}")
    return [f"{path}: {p}" for p in found if p]


def _check_tokens(path: Path, dtype: np.dtype, vocab: int, expected_sha: str) -> str | None:
    """Stream a shard once: sha256 and the largest token id; return a problem or None."""
    h = hashlib.sha256()
    itemsize = dtype.itemsize
    top = -1
    with open(path, "rb") as f:
        while block := f.read(CHUNK_TOKENS * itemsize):
            h.update(block)
            if len(block) % itemsize:
                return f"{path}: size is not a multiple of {itemsize} bytes"
            arr = np.frombuffer(block, dtype=dtype)
            top = max(top, int(arr.max()) if arr.size else -1)
    bad_id = f"token id {top} >= vocab size {vocab}" if top >= vocab else ""
    if h.hexdigest() != expected_sha:  # the root cause; a bad id is then its symptom
        return f"{path}: sha256 mismatch (corrupted or modified{'; ' + bad_id if bad_id else ''})"
    return f"{path}: {bad_id}" if bad_id else None


def _check_mask(root: Path, shard: dict[str, Any], ends: np.ndarray, framed: bool) -> str | None:
    """A shard's loss mask (its size already checked): sha256, 0/1 values, and with
    `framed` documents 0 at `<s>`/`</s>` (a chat template's end of turn is trained on)."""
    path = root / shard["mask"]
    if not isinstance(shard.get("mask_sha256"), str):
        return f"{path}: the manifest gives no mask_sha256 for it"
    if sha256_file(path) != shard["mask_sha256"]:
        return f"{path}: sha256 mismatch (corrupted or modified)"
    if not shard["tokens"]:
        return None
    mask = np.memmap(path, dtype=MASK_DTYPE, mode="r")
    if int(mask.max()) > 1:
        return f"{path}: a mask value is not 0 or 1"
    if len(ends) and framed:
        starts = np.concatenate(([0], ends[:-1]))
        if np.any(mask[starts] != 0) or np.any(mask[ends - 1] != 0):
            return f"{path}: the loss mask is 1 at a document's <s> or </s>"
    return None


def verify_shard(root: Path, shard: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    """Every problem of one shard, each a one-line message naming the file.

    The structure (files present, sizes, a strictly increasing index ending at the token
    count) is `structure_problem`'s, the same rules the trainer checks at start-up; on a
    sound structure, verify adds what needs every byte: checksums, token ids below the
    vocabulary, `<s> ... </s>` framing (not for documents a chat template framed, manifest
    `"framing": "template"`) and the loss mask's values.
    """
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    tok = manifest["tokenizer"]
    broken = structure_problem(root, shard, dtype.itemsize)
    if broken:
        return [broken]
    bin_path, idx_path = root / shard["file"], root / shard["index"]
    problems = []
    bad = _check_tokens(bin_path, dtype, tok["vocab_size"], shard["sha256"])
    if bad:
        problems.append(bad)
    ends = np.fromfile(idx_path, dtype=INDEX_DTYPE).astype(np.int64)
    framed = manifest.get("framing") != "template"
    if not problems and len(ends) and framed:
        tokens = np.memmap(bin_path, dtype=dtype, mode="r")
        starts = np.concatenate(([0], ends[:-1]))
        bos, eos = tok["bos_id"], tok["eos_id"]
        if bos is None and np.any(tokens[ends - 1] != eos):
            problems.append(f"{idx_path}: a document does not end with EOS (id {eos})")
        elif bos is not None and (np.any(tokens[starts] != bos) or np.any(tokens[ends - 1] != eos)):
            problems.append(f"{idx_path}: a document does not start with <s> and end with </s>")
        del tokens
    if "mask" in shard and (bad_mask := _check_mask(root, shard, ends, framed)):
        problems.append(bad_mask)
    if "provenance" in shard and (bad_docs := _check_provenance(root, shard)):
        problems.append(bad_docs)
    return problems


def _check_provenance(root: Path, shard: dict[str, Any]) -> str | None:
    """A shard's documents.parquet (`output.provenance`): present, its sha256, and one row
    per document of the index."""
    path = root / shard["provenance"]
    if not path.is_file():
        return f"{path}: missing"
    if sha256_file(path) != shard.get("provenance_sha256"):
        return f"{path}: sha256 mismatch (corrupted or modified)"
    import pyarrow.parquet as pq  # only builds with provenance pay for it

    rows = pq.ParquetFile(path).metadata.num_rows
    if rows != shard["documents"]:
        return f"{path}: {rows} rows for the shard's {shard['documents']} documents"
    return None


def verify(directory: str | Path, progress: Callable[[int, int], None] | None = None) -> list[str]:
    """All problems of a shard directory (empty when it is sound); ShardFormatError when it
    holds no manifest at all: not a shard directory, so nothing to verify."""
    root = Path(directory)
    try:
        manifest = read_manifest(root)
    except ShardFormatError as e:
        if not (root / MANIFEST).is_file():
            raise
        return [str(e)]
    problems = manifest_problems(manifest, root / MANIFEST)
    if problems:  # the checks below read these fields
        return problems
    tok_file = root / manifest["tokenizer"]["file"]
    if not tok_file.is_file():
        problems.append(f"{tok_file}: missing")
    elif sha256_file(tok_file) != manifest["tokenizer"]["sha256"]:
        problems.append(f"{tok_file}: sha256 does not match the manifest")
    shards = manifest["shards"]
    for i, shard in enumerate(shards):
        problems += verify_shard(root, shard, manifest)
        if progress:
            progress(i + 1, len(shards))
    train = sum(s["tokens"] for s in shards if s["split"] == "train")
    mixed = sum(manifest.get("mix", {}).get("tokens", {}).values())
    if "mix" in manifest and mixed != train:
        problems.append(
            f"{root / 'manifest.json'}: mix.tokens sum to {mixed}, train shards hold {train}"
        )
    return problems

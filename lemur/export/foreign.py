"""Other trainers' corpora read by lemur-train: Megatron prefixes and datatrove `.ds` folders.

A `data.dirs` (or `data.eval_dirs`) entry may be a mapping instead of a shard folder:

    {format: megatron, train: [PREFIX or FOLDER, ...], val: {code: [...]}, tokenizer: DIR}

(`format: nanotron` takes `.ds` files or folders of them). `open_foreign` presents it as a
`ShardDir` whose manifest is made in memory: each token file is mapped where it lies (no
copy), its document ends are its `.idx` as they are (datatrove's `.ds.index` is our `.idx`
byte for byte) or computed from Megatron's sequence lengths, and a `.ds.loss` is the loss
mask. The trainer's window source then reads them exactly as it reads our shards: the same
windows, document boundaries and masks. A folder of a lemur export (`export.json` above
it) also keeps the source shards' identity (their names and sha256), so the shuffle, and
so the batches, are those of the lemur shards it was exported from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lemur.export.megatron import read_index, token_ends
from lemur.export.nanotron import ds_files, ds_parts
from lemur.shards.check import ShardCompatibilityError, ShardDir, check_token_sample
from lemur.shards.format import ShardFormatError, dtype_name, sha256_file, token_dtype
from lemur.tokenizer.base import TokenizerError

FORMATS = ("megatron", "nanotron")
KEYS = ("format", "train", "val", "tokenizer")


@dataclass(frozen=True)
class ForeignData:
    """One `data.dirs` entry naming another trainer's corpus (see the module)."""

    format: str
    train: list[str] = field(default_factory=list)
    val: dict[str, list[str]] = field(default_factory=dict)
    tokenizer: str = ""

    def __hash__(self) -> int:
        # Lists are not hashable; the entry is a key of the trainer's opened directories.
        return hash(json.dumps([self.format, self.train, self.val, self.tokenizer]))

    def __str__(self) -> str:
        first = (self.train or [p for v in self.val.values() for p in v] or ["?"])[0]
        return f"{self.format}:{first}"

    def absolute(self) -> ForeignData:
        """The entry with every path absolute (a run's config is saved so)."""

        def ab(p: str) -> str:
            return os.path.abspath(os.path.expanduser(p))

        return ForeignData(
            self.format,
            [ab(p) for p in self.train],
            {d: [ab(p) for p in ps] for d, ps in self.val.items()},
            ab(self.tokenizer),
        )


def foreign_entry(raw: dict[str, Any], key: str) -> ForeignData:
    """A `ForeignData` from a config mapping; ValueError (one line naming `key`) if wrong."""
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ValueError(f"{key}: unknown key {unknown[0]!r} (keys: {', '.join(KEYS)})")
    if raw.get("format") not in FORMATS:
        raise ValueError(
            f"{key}.format must be one of {', '.join(FORMATS)}, got {raw.get('format')!r}"
        )
    if not isinstance(raw.get("tokenizer"), str) or not raw["tokenizer"]:
        raise ValueError(f"{key}.tokenizer must name the HF tokenizer folder of the corpus")

    def paths(value: Any, where: str) -> list[str]:
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise ValueError(f"{where} must be a list of paths, got {value!r}")
        return list(value)

    train = paths(raw.get("train", []), f"{key}.train")
    val = raw.get("val") or {}
    if not isinstance(val, dict):
        raise ValueError(f"{key}.val must map each val domain to its paths, got {val!r}")
    vals = {str(d): paths(p, f"{key}.val.{d}") for d, p in val.items()}
    if not train and not vals:
        raise ValueError(f"{key}: names no train or val paths")
    return ForeignData(raw["format"], train, vals, raw["tokenizer"])


def tokenizer_entry(folder: str) -> dict[str, Any]:
    """The manifest tokenizer entry of an HF tokenizer folder: its SentencePiece model when
    it has one (an export of a SentencePiece build: the build's own file), else its
    tokenizer.json."""
    path = Path(folder).expanduser()
    if path.is_dir():
        model = path / "tokenizer.model"
        path = model if model.is_file() else path / "tokenizer.json"
    if not path.is_file():
        raise ShardFormatError(f"{folder}: no tokenizer.model or tokenizer.json in it")
    # Here, not at the top: the trainer's config imports this module, not the tokenizers.
    from lemur.tokenizer.load import open_tokenizer

    try:
        tok = open_tokenizer(path)
    except (TokenizerError, OSError, ValueError) as e:
        raise ShardFormatError(f"{path}: cannot open the tokenizer ({e})") from None
    return {
        "file": str(path.resolve()),
        "sha256": sha256_file(path),
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
    }


def export_listing(path: Path) -> tuple[str, dict[str, str]] | None:
    """(the path relative to the lemur export holding it, that export's sha256 by file), or
    None outside an export (an `export.json` up to three folders above)."""
    for root in list(path.parents)[:3]:
        meta = root / "export.json"
        if meta.is_file():
            try:
                files = {f["path"]: f["sha256"] for f in json.loads(meta.read_text())["files"]}
            except (ValueError, KeyError, TypeError):
                return None
            return path.relative_to(root).as_posix(), files
    return None


def identity(token_file: Path, mask_file: Path | None) -> dict[str, Any]:
    """The keys the window source's content id hashes, as the lemur shard of a lemur export
    has them (name `train/00000.bin`, sha256s), else the file's own name and no sha256."""
    found = export_listing(token_file.resolve())
    if found is None:
        return {"identity": token_file.name, "sha256": None}
    rel, files = found
    out = {"identity": rel.rsplit(".", 1)[0] + ".bin", "sha256": files.get(rel)}
    if mask_file is not None:
        mask_rel = export_listing(mask_file.resolve())
        out["mask_sha256"] = None if mask_rel is None else mask_rel[1].get(mask_rel[0])
    return out


def megatron_prefixes(path: str) -> list[Path]:
    """A prefix itself, or every prefix (`*.idx`) under a folder in lexical order."""
    p = Path(path).expanduser()
    if p.is_dir():
        found = sorted(p.rglob("*.idx"), key=lambda q: q.relative_to(p).as_posix())
        if not found:
            raise ShardFormatError(f"{p}: no Megatron .idx files in it")
        return [q.with_suffix("") for q in found]
    return [p]


def megatron_shard(prefix: Path, split: str, domain: str) -> tuple[dict[str, Any], str]:
    """The manifest entry of one Megatron prefix, and its token dtype name."""
    index = read_index(Path(f"{prefix}.idx"))
    ends = token_ends(index)
    tokens = int(ends[-1]) if len(ends) else 0
    bin_path = Path(f"{prefix}.bin")
    if not bin_path.is_file():
        raise ShardFormatError(f"{bin_path}: missing (the tokens of {index.path})")
    if bin_path.stat().st_size != tokens * index.dtype.itemsize:
        raise ShardFormatError(
            f"{bin_path}: {bin_path.stat().st_size} bytes, its .idx says {tokens} tokens x "
            f"{index.dtype.itemsize} bytes"
        )
    entry = {
        "file": str(bin_path.resolve()),
        "index": str(index.path.resolve()),
        "split": split,
        "domain": domain,
        "tokens": tokens,
        "documents": len(ends),
        **identity(bin_path, None),
    }
    return entry, index.dtype.name


def nanotron_shard(path: Path, split: str, domain: str, size: int) -> dict[str, Any]:
    """The manifest entry of one `.ds` file (tokens of `size` bytes)."""
    tokens, documents, loss = ds_parts(path, size)
    entry = {
        "file": str(path.resolve()),
        "index": str(Path(f"{path}.index").resolve()),
        "split": split,
        "domain": domain,
        "tokens": tokens,
        "documents": documents,
        **identity(path, loss),
    }
    if loss is not None:
        entry["mask"] = str(loss.resolve())
    return entry


def ds_token_size(path: Path, vocab_size: int) -> int:
    """A `.ds` file's token size: its `.metadata`'s (`name|size`), else the vocabulary's."""
    meta = Path(f"{path}.metadata")
    if meta.is_file():
        first = meta.read_text().split("\n", 1)[0]
        size = first.rsplit("|", 1)[-1]
        if size in ("2", "4"):
            return int(size)
    return token_dtype(vocab_size).itemsize


def foreign_shards(spec: ForeignData, vocab_size: int) -> tuple[list[dict[str, Any]], str]:
    """Every shard entry of an entry (train, then val by domain) and the token dtype."""
    groups = [("train", "mixed", spec.train)] + [("val", d, p) for d, p in spec.val.items()]
    shards, dtypes = [], set()
    for split, domain, paths in groups:
        for path in paths:
            if spec.format == "megatron":
                for prefix in megatron_prefixes(path):
                    entry, dtype = megatron_shard(prefix, split, domain)
                    shards.append(entry)
                    dtypes.add(dtype)
            else:
                for ds in ds_files(path) if Path(path).is_dir() else [Path(path)]:
                    size = ds_token_size(ds, vocab_size)
                    shards.append(nanotron_shard(ds, split, domain, size))
                    dtypes.add("uint16" if size == 2 else "uint32")
    if len(dtypes) != 1:
        raise ShardFormatError(f"{spec}: token files of several dtypes ({sorted(dtypes)})")
    return shards, dtypes.pop()


def megatron_ends(path: Path) -> np.ndarray:
    """The document ends of a Megatron `.idx` (the window source's index reader)."""
    return token_ends(read_index(path))


class ForeignShardDir(ShardDir):
    """Another trainer's corpus as an opened shard directory (its manifest made here)."""

    def __init__(self, spec: ForeignData) -> None:
        tok = tokenizer_entry(spec.tokenizer)
        shards, dtype = foreign_shards(spec, int(tok["vocab_size"]))
        manifest = {"format": spec.format, "dtype": dtype, "seq_len": 0, "tokenizer": tok}
        manifest["shards"] = shards
        first = Path(shards[0]["file"]).parent
        super().__init__(first, manifest)
        self.spec = spec
        # Megatron's ends are computed from its lengths; a .ds.index is our .idx already.
        self.index_reader = megatron_ends if spec.format == "megatron" else None

    def __str__(self) -> str:
        return str(self.spec)

    def __repr__(self) -> str:
        return f"ForeignShardDir({self.spec!r})"

    def check_structure(self, shards: Any = None) -> None:
        """Checked when opened (each file's size against its index)."""

    def check_compatible(
        self, *, vocab_size: int, tokenizer_sha256: str | None = None, seq_len: int | None = None
    ) -> None:
        """Refuse a corpus the model cannot train on: another vocabulary or tokenizer, ids
        too wide for it, no window of `seq_len + 1` tokens, sampled ids past the vocabulary."""
        tok = self.tokenizer
        if tok["vocab_size"] != vocab_size:
            raise ShardCompatibilityError(
                f"{self}: tokenizer vocab_size {tok['vocab_size']} != model vocab_size {vocab_size}"
            )
        if tokenizer_sha256 is not None and tok["sha256"] != tokenizer_sha256:
            raise ShardCompatibilityError(
                f"{self}: tokenizer {tok['file']} is not the model's (sha256 differs)"
            )
        want = token_dtype(vocab_size)
        if np.dtype(self.manifest["dtype"]).itemsize != want.itemsize:
            raise ShardCompatibilityError(
                f"{self}: token dtype {self.manifest['dtype']} but vocab_size {vocab_size} "
                f"needs {dtype_name(want)}"
            )
        if seq_len is not None and not any(s["tokens"] > seq_len for s in self.shards("train")):
            raise ShardCompatibilityError(
                f"{self}: no train file holds a window of seq_len + 1 = {seq_len + 1} tokens"
            )
        for s in self.manifest["shards"]:
            check_token_sample(s["file"], np.dtype(self.manifest["dtype"]), vocab_size)


def open_foreign(spec: ForeignData) -> ForeignShardDir:
    """Open a `data.dirs` mapping entry (ShardFormatError, one line, when it cannot be read)."""
    return ForeignShardDir(spec)

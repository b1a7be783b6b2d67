"""`lemur-data export`'s driver: a finished shard folder written in another trainer's format.

The manifest's shards become `ShardPart`s (train shards in the manifest's order, the
corpus's global shuffle, then each val domain apart, numbered from 0 in each), a format's
`Exporter` writes them under a temporary sibling of OUT (`.OUT.tmp-PID@HOST`, the name
`lemur.atomic_files.temp_name` gives), and the folder is renamed to OUT only when every
file, `export.json`, `TRAINING.md` and the HF `tokenizer/` folder are in it. A killed
export leaves no OUT (a rerun removes the dead process's temporary and starts over); an
existing export is replaced only with `force`. Nothing written holds a time, so a rerun
gives the same bytes.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.atomic_files import atomic_write_text, temp_name
from lemur.export.formats import Exporter, ExportError, ExportInfo, ShardPart, exporter
from lemur.shards.check import ShardDir
from lemur.shards.format import (
    MANIFEST,
    atomic_write_json,
    dtype_name,
    read_manifest,
    sha256_file,
)
from lemur.tokenizer.base import TokenizerError
from lemur.tokenizer.hf_writer import write_hf_tokenizer

SPLITS = ("train", "val", "all")
EXPORT_JSON = "export.json"
TRAINING_MD = "TRAINING.md"
TOKENIZER_DIR = "tokenizer"
# The HF files that travel with a tokenizer.json build (those the build copied beside it).
HF_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
# Our own temporaries of OUT: `.OUT.tmp-PID@HOST` (and `.OUT.old-PID@HOST` while replacing).
_OURS = r"\.{name}\.(?:tmp|old)-(?P<pid>\d+)@(?P<host>[^/]+)"

Reporter = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the folder, its launch fragment, how many files."""

    out: Path
    training_md: str
    files: int


def shard_parts(directory: Path, manifest: dict[str, Any], split: str) -> list[ShardPart]:
    """The shards to write, train first (manifest order), then each val domain (sorted)."""
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    shards = manifest["shards"]
    groups: list[tuple[str, str | None, list[dict[str, Any]]]] = []
    if split in ("train", "all"):
        groups.append(("train", None, [s for s in shards if s["split"] == "train"]))
    if split in ("val", "all"):
        for domain in sorted({s["domain"] for s in shards if s["split"] == "val"}):
            chosen = [s for s in shards if s["split"] == "val" and s["domain"] == domain]
            groups.append(("val", domain, chosen))
    parts = []
    for which, domain, chosen in groups:
        folder = which if domain is None else f"{which}/{domain}"
        for n, s in enumerate(chosen):
            parts.append(
                ShardPart(
                    split=which,
                    domain=domain,
                    number=n,
                    tokens=directory / s["file"],
                    index=directory / s["index"],
                    mask=directory / s["mask"] if "mask" in s else None,
                    token_dtype=dtype,
                    stem=f"{folder}/{n:05d}",
                )
            )
    return parts


def export_info(
    source: Path, out: Path, manifest: dict[str, Any], parts: list[ShardPart]
) -> ExportInfo:
    """The `ExportInfo` of a corpus and the parts chosen from it."""
    tok = manifest["tokenizer"]
    val: dict[str, tuple[str, ...]] = {}
    for p in parts:
        if p.split == "val":
            val[str(p.domain)] = (*val.get(str(p.domain), ()), p.stem)
    return ExportInfo(
        source=source,
        out=out,
        manifest_sha256=sha256_file(source / MANIFEST),
        token_dtype=np.dtype(manifest["dtype"]).newbyteorder("<"),
        vocab_size=int(tok["vocab_size"]),
        eos_id=tok.get("eos_id"),
        bos_id=tok.get("bos_id"),
        has_masks=any(p.mask is not None for p in parts),
        seq_len=manifest.get("seq_len"),
        tokenizer_dir=out / TOKENIZER_DIR,
        train_stems=tuple(p.stem for p in parts if p.split == "train"),
        val_stems=val,
    )


def write_tokenizer(shard_dir: ShardDir, dest: Path, seq_len: int | None) -> None:
    """`dest` as an HF tokenizer folder: a SentencePiece build's files as `lemur-convert
    to-hf` writes them, a tokenizer.json build's own HF files copied."""
    path = shard_dir.tokenizer_path
    if path.suffix != ".json":
        try:
            write_hf_tokenizer(path, dest, model_max_length=seq_len)
        except TokenizerError as e:
            raise ExportError(f"{path}: no HF tokenizer folder for it ({e})") from None
        return
    dest.mkdir(parents=True, exist_ok=True)
    for name in HF_FILES:
        if (path.parent / name).is_file():
            shutil.copyfile(path.parent / name, dest / name)


def remove_dead_temporaries(out: Path) -> None:
    """Delete the temporaries of OUT that a killed export on this host left behind."""
    pattern = re.compile(_OURS.format(name=re.escape(out.name)))
    for path in out.parent.glob(f".{out.name}.*"):
        match = pattern.fullmatch(path.name)
        if match is None or match["host"] != socket.gethostname():
            continue
        try:
            os.kill(int(match["pid"]), 0)
            continue  # alive: another export is writing it
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue


def check_out(out: Path, force: bool) -> None:
    """Refuse an existing OUT unless it is an export and `force` is given."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or not (out / EXPORT_JSON).is_file():
        if out.is_dir() and not any(out.iterdir()):
            return  # an empty folder: nothing to lose
        raise ExportError(f"{out}: exists and is not a lemur export; choose another --out")
    if not force:
        raise ExportError(f"{out}: an export is already there; --force replaces it")


def file_listing(tmp: Path, known: dict[tuple[int, int], str]) -> list[dict[str, Any]]:
    """Every file under `tmp` (but export.json) with its size and sha256, sorted by path;
    a linked shard's sha256 comes from the manifest (`known`: (device, inode) -> sha256)."""
    listing = []
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = path.relative_to(tmp).as_posix()
        if rel == EXPORT_JSON:
            continue
        st = path.stat()
        sha = known.get((st.st_dev, st.st_ino)) or sha256_file(path)
        listing.append({"path": rel, "bytes": st.st_size, "sha256": sha})
    return listing


def linked_hashes(directory: Path, manifest: dict[str, Any]) -> dict[tuple[int, int], str]:
    """(device, inode) -> sha256 of the shard files the manifest hashes (a hard link to one
    is not read again)."""
    known = {}
    for s in manifest["shards"]:
        for key, sha in (("file", "sha256"), ("mask", "mask_sha256")):
            if key in s and s.get(sha):
                st = (directory / s[key]).stat()
                known[(st.st_dev, st.st_ino)] = s[sha]
    return known


def training_md(fmt: Exporter, info: ExportInfo) -> str:
    """OUT/TRAINING.md: what was exported, then the format's launch fragment."""
    domains = ", ".join(f"`{d}` ({len(s)})" for d, s in info.val_stems.items()) or "none"
    head = [
        f"# Training on {info.out.name} ({fmt.name})",
        "",
        f"Exported by `lemur-data export` from `{info.source}` (manifest sha256 "
        f"`{info.manifest_sha256}`): {len(info.train_stems)} train shard(s) in the corpus's "
        f"shuffled order, val shards per domain: {domains}. Tokens are "
        f"`{dtype_name(info.token_dtype)}`, vocab size {info.vocab_size}, EOS id "
        f"{info.eos_id}, BOS id {info.bos_id}.",
        "",
        f"The tokenizer is the HF folder `{info.tokenizer_dir}` "
        "(`transformers.AutoTokenizer.from_pretrained`): every trainer loads the same ids.",
        "",
    ]
    return "\n".join(head) + "\n" + fmt.launch_fragment(info)


def export_json(
    fmt: Exporter, info: ExportInfo, split: str, files: list[dict[str, Any]]
) -> dict[str, Any]:
    """OUT/export.json's content (no times: a rerun writes the same bytes)."""
    return {
        "format": fmt.name,
        "source": str(info.source),
        "source_manifest_sha256": info.manifest_sha256,
        "split": split,
        "dtype": dtype_name(info.token_dtype),
        "vocab_size": info.vocab_size,
        "eos_id": info.eos_id,
        "bos_id": info.bos_id,
        "seq_len": info.seq_len,
        "loss_masks": info.has_masks,
        "train": list(info.train_stems),
        "val": {d: list(s) for d, s in info.val_stems.items()},
        "files": files,
    }


def open_source(source: Path, split: str) -> tuple[ShardDir, dict[str, Any]]:
    """The shard folder opened and its structure checked (ShardFormatError, one line)."""
    if split not in SPLITS:
        raise ExportError(f"--split {split!r}: choose one of {', '.join(SPLITS)}")
    manifest = read_manifest(source)
    shard_dir = ShardDir(source, manifest)
    shard_dir.check_structure()
    return shard_dir, manifest


def export(
    source: str | os.PathLike,
    fmt_name: str,
    out: str | os.PathLike,
    *,
    split: str = "all",
    force: bool = False,
    report: Reporter | None = None,
) -> ExportResult:
    """Write the shard folder `source` as format `fmt_name` into `out` (see the module)."""
    source, out = Path(source).resolve(), Path(out).resolve()
    fmt = exporter(fmt_name)
    shard_dir, manifest = open_source(source, split)
    parts = shard_parts(source, manifest, split)
    if not parts:
        raise ExportError(f"{source / MANIFEST}: no {split} shards to export")
    info = export_info(source, out, manifest, parts)
    fmt.check(info)
    if out == source or source in out.parents:
        raise ExportError(f"{out}: inside the shard folder it exports; choose another --out")
    remove_dead_temporaries(out)
    check_out(out, force)
    tmp = temp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        text, files = write_all(fmt, info, shard_dir, manifest, parts, tmp, split, report)
    except BaseException:
        # A refusal or an error: nothing half-written stays (a SIGKILL cannot get here;
        # its temporary is removed by the next export to OUT).
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace(tmp, out)
    return ExportResult(out, text, files)


def write_all(
    fmt: Exporter,
    info: ExportInfo,
    shard_dir: ShardDir,
    manifest: dict[str, Any],
    parts: list[ShardPart],
    tmp: Path,
    split: str,
    report: Reporter | None,
) -> tuple[str, int]:
    """Everything of an export into `tmp`: tokenizer, parts, TRAINING.md, export.json last;
    the TRAINING.md text and the number of files."""
    write_tokenizer(shard_dir, tmp / TOKENIZER_DIR, info.seq_len)
    for i, part in enumerate(parts):
        if report:
            report(f"export {fmt.name}", i, len(parts))
        fmt.write_part(part, info, tmp)
    if report:
        report(f"export {fmt.name}", len(parts), len(parts))
    fmt.finish(parts, info, tmp)
    text = training_md(fmt, info)
    atomic_write_text(tmp / TRAINING_MD, text)
    files = file_listing(tmp, linked_hashes(shard_dir.path, manifest))
    atomic_write_json(tmp / EXPORT_JSON, export_json(fmt, info, split, files))
    return text, len(files) + 1


def replace(tmp: Path, out: Path) -> None:
    """Rename the finished `tmp` to `out`, an old export moved aside first and then removed
    (a kill in between leaves no OUT, and the old one as a temporary a rerun deletes)."""
    if out.exists():
        old = out.with_name(temp_name(out).name.replace(".tmp-", ".old-", 1))
        os.rename(out, old)
        os.rename(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)

"""Where a model's tokenizer is: a given path, or the one of a run's first data directory.

A run records its data directories in its config (`config.yaml` and each checkpoint's
`meta`). lemur-train stores them as absolute paths; runs from before it did hold them as
written, relative to the directory the run was started from. That directory is recovered
from the run's own `run_dir` (also relative then): `runs/x` found at `/home/u/proj/runs/x`
was started from `/home/u/proj`. When a directory is gone, the reason says which one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from lemur.model.checkpoint import TOKENIZER_FILE
from lemur.shards.format import MANIFEST, ShardFormatError, read_manifest


class TokenizerLookupError(ValueError):
    """A given tokenizer path that holds no tokenizer (one line, naming it)."""


@dataclasses.dataclass(frozen=True)
class Found:
    """The tokenizer file found for a model, or why there is none, and the hash the model
    was trained with when its run recorded one."""

    path: Path | None
    problem: str | None = None
    sha256: str | None = None


def started_from(stored: str | None, actual: Path) -> Path | None:
    """The working directory a run was started from, when its relative `stored` path (its
    run_dir or checkpoint dir as written in its config) is the tail of `actual`."""
    if not stored or "://" in stored:
        return None
    tail = Path(os.path.normpath(Path(stored).expanduser())).parts
    if Path(stored).expanduser().is_absolute() or ".." in tail or tail == (".",):
        return None
    whole = Path(os.path.abspath(actual)).parts
    if len(whole) > len(tail) and whole[-len(tail) :] == tail:
        return Path(*whole[: -len(tail)])
    return None


def run_path(value: str, origin: Path | None) -> Path:
    """A path of a run's config: absolute as stored, else relative to where it started (the
    current directory when that is unknown)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (origin or Path.cwd()) / path


def run_tokenizer(meta: dict[str, Any], origin: Path | None) -> Found:
    """The tokenizer of a run's first data directory (meta: a checkpoint's `meta` item)."""
    config = meta.get("config") or {}
    sha = meta.get("tokenizer_sha256")
    dirs = (config.get("data") or {}).get("dirs") or []
    if not dirs:
        return Found(None, "the run's config names no data directory", sha)
    if isinstance(dirs[0], dict):  # another trainer's corpus (lemur.export.foreign)
        folder = run_path(str(dirs[0].get("tokenizer", "")), origin)
        for name in (TOKENIZER_FILE, "tokenizer.json"):  # the order the trainer took it in
            if (folder / name).is_file():
                return Found(folder / name, None, sha)
        return Found(None, f"its data's tokenizer folder {folder} holds no tokenizer", sha)
    directory = run_path(str(dirs[0]), origin)
    written = "" if Path(str(dirs[0])).is_absolute() else f" ('{dirs[0]}' in the run's config)"
    if not (directory / MANIFEST).is_file():
        gone = f"its data directory {directory}{written} is gone (moved or deleted)"
        return Found(None, gone, sha)
    try:
        path = directory / str(read_manifest(directory)["tokenizer"]["file"])
    except (ShardFormatError, KeyError, TypeError) as e:
        return Found(None, f"its data directory's manifest is unreadable ({e})", sha)
    if not path.is_file():
        return Found(None, f"its data directory's tokenizer {path} is gone", sha)
    return Found(path, None, sha)


def given_tokenizer(value: str | os.PathLike[str]) -> Path:
    """The SentencePiece file `--tokenizer` names: the file, or the tokenizer a shard
    directory's manifest names, or the `tokenizer.model` in a model folder."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    if not path.exists():
        raise TokenizerLookupError(f"{path}: no such tokenizer file")
    if (path / MANIFEST).is_file():
        try:
            found = path / str(read_manifest(path)["tokenizer"]["file"])
        except (ShardFormatError, KeyError, TypeError) as e:
            raise TokenizerLookupError(f"{path}: no tokenizer in its manifest ({e})") from None
        if not found.is_file():
            raise TokenizerLookupError(f"{path}: its manifest's tokenizer {found} is missing")
        return found
    for name in (TOKENIZER_FILE, "tokenizer.json"):  # SentencePiece, or an HF tokenizer
        if (path / name).is_file():
            return path / name
    raise TokenizerLookupError(
        f"{path}: a directory without a tokenizer (give a {TOKENIZER_FILE} or tokenizer.json, "
        "a shard directory or a model folder that holds one)"
    )

"""Switching a shard directory to a new build: manifest renamed in, old build files removed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lemur.shards.format import (
    MANIFEST,
    atomic_write_json,
)


def _referenced(manifest_path: Path) -> set[str]:
    """Files a manifest points at (relative paths); empty if there is no readable manifest."""
    try:
        m = json.loads(manifest_path.read_text())
        files = {str(m["tokenizer"]["file"]), str(m.get("stats", "stats.json"))}
        for s in m["shards"]:
            files |= {str(s["file"]), str(s["index"])}
            files |= {str(s[k]) for k in ("mask", "provenance") if k in s}
        return files
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _remove_empty_dirs(root: Path) -> None:
    if root.is_dir():
        for d in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
        if not any(root.iterdir()):
            root.rmdir()


def commit(out: Path, prefix: str, manifest: dict[str, Any], finished: Iterable[Path] = ()) -> None:
    """Make a complete build the directory's build: rename its manifest in, then remove the
    previous build's files (none of which share a path with the new build's) and the
    `finished` work folders (the build's shuffles: data/work.py names them)."""
    previous = _referenced(out / MANIFEST)
    atomic_write_json(out / MANIFEST, manifest)  # readers switch here, atomically
    current = _referenced(out / MANIFEST)
    for rel in sorted(previous - current):
        (out / rel).unlink(missing_ok=True)
    for stale in out.glob("build-*"):
        if stale.is_dir() and stale.name != prefix:
            shutil.rmtree(stale, ignore_errors=True)  # earlier builds, finished or abandoned
    for legacy in ("train", "val"):  # shard directories of the layout before build-<id>/
        _remove_empty_dirs(out / legacy)
    for stale in finished:
        shutil.rmtree(stale, ignore_errors=True)  # bucket files and markers of finished shuffles

"""Listing remote paths (objects under a prefix, a glob, one object), and the record of a
source's listing in the work directory, so that a build lists a bucket once.

A resumed build or a rerun reads the record instead of listing again: every task of every
run reads the same objects, and a bucket with millions of objects is not listed twice. The
record is keyed by what decides the listing (the source's paths, format, include/exclude and
tree rules, `split_bytes`), never by credentials. An object changed after the listing is
found when read (S3: every ranged GET carries `If-Match` with the listed ETag; elsewhere a
HEAD compares its version when it is opened; a block shorter than the recorded size), and
fails its task: the build drops the source's record (`forget_record`), so that the next run
lists it again. To see objects added since, remove the record (`<work>/listing-<key>.json`):
the next run lists again, and a listing that differs makes a new build (its inputs digest
moves, as with local inputs).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemur.data import work as work_folders
from lemur.data.read.remote import Remote, object_version
from lemur.data.recipe.recipe import Recipe
from lemur.data.recipe.sources import SourceConfig, public_options
from lemur.shards.format import atomic_write_bytes

RECORD_VERSION = 1
GLOB_CHARS = "*?["


@dataclass(frozen=True)
class RemoteObject:
    """One listed object: its URL, its path under the listed root, size and version (ETag)."""

    url: str
    rel: str
    size: int
    version: str


def _objects(fs: Any, found: dict[str, dict[str, Any]], root: str) -> list[RemoteObject]:
    """The files of a listing (`path -> info`), named relative to `root` (a bare path)."""
    out = []
    for name, info in sorted(found.items()):
        if info.get("type") != "file":
            continue
        rel = posixpath.relpath(name, root) if root else posixpath.basename(name)
        out.append(
            RemoteObject(fs.unstrip_protocol(name), rel, int(info["size"]), object_version(info))
        )
    return out


def find_objects(remote: Remote, url: str) -> list[RemoteObject]:
    """The objects a remote path names: every object under a prefix (named relative to it),
    a glob's matches (by their base name, prefixes among them walked), or one object."""
    fs = remote.client(url)  # ClientError: the reason alone (the caller names the path)
    if any(c in url for c in GLOB_CHARS):
        matches = remote.call("LIST", url, "glob", url, detail=True)
        out = []
        for name, info in sorted(matches.items()):
            if info.get("type") == "directory":
                out += _under(remote, fs, fs.unstrip_protocol(name))
            else:
                out += _objects(fs, {name: info}, "")
        return out
    try:
        info = remote.call("HEAD", url, "info", url)
    except FileNotFoundError:
        return []
    if info.get("type") == "directory":
        return _under(remote, fs, url)
    return _objects(fs, {info["name"]: info}, "")


def _under(remote: Remote, fs: Any, url: str) -> list[RemoteObject]:
    """Every object under a prefix, named relative to it."""
    found = remote.call("LIST", url, "find", url, detail=True)
    return _objects(fs, found, url.split("://", 1)[1].rstrip("/"))


def record_key(source: SourceConfig, split_bytes: int) -> str:
    """What decides a source's listing, hashed: its config without credentials or reading
    settings, and the split size."""
    decides = {
        k: v
        for k, v in vars(source).items()
        if k not in ("storage_options", "content_storage_options", "remote", "name")
    }
    decides["storage_options"] = public_options(source.storage_options)
    blob = json.dumps([RECORD_VERSION, decides, split_bytes], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def load_record(path: Path) -> dict[str, Any] | None:
    """A recorded listing (`files`: InputFile fields, `skipped`), or None if there is none."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("version") == RECORD_VERSION else None


def save_record(path: Path, files: list[dict[str, Any]], skipped: dict[str, int]) -> None:
    """Write a source's listing, atomically (a killed build leaves none or a whole one)."""
    record = {"version": RECORD_VERSION, "files": files, "skipped": skipped}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(record, sort_keys=True).encode())


def forget_record(recipe: Recipe, index: int) -> None:
    """Drop source `index`'s recorded listing (one of its objects changed since): the next
    run lists the source again."""
    key = record_key(recipe.sources[index], recipe.executor.split_bytes)
    work_folders.listing_record(recipe.work_root(), key).unlink(missing_ok=True)

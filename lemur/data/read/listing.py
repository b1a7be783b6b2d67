"""Listing a recipe's input files: directory walks with .gitignore and skip rules, globs."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import posixpath
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from lemur.data import work as work_folders
from lemur.data.read import remote_listing
from lemur.data.read.compressed import Opener, open_local
from lemur.data.read.remote import Remote, display_url
from lemur.data.read.split import plan_parts
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.recipe import Recipe
from lemur.data.recipe.sources import SourceConfig, expand_paths, is_remote

LISTING_BLOCK_BYTES = 1 << 16  # a remote read while listing: a jsonl head, a parquet footer
# Directories that hold vendored, generated or tool data rather than authored source.
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        "node_modules",
        ".tox",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        "site-packages",
        "dist-packages",
        ".idea",
        ".vscode",
    }
)


@dataclass(frozen=True)
class InputFile:
    """One input file of one source; `rel` is its path relative to the source root.

    `path` and `rel` name the file in document ids, metadata and error lists, so they are
    always valid UTF-8 (see `display_name`); `fs_path` holds the real name when it differs.
    `error`, when set, is a problem found while listing (an unreadable directory) that the
    reader reports in place of reading. A part of a big file (`split.py`) has a `unit`
    (`bytes` or `row_groups`) and covers [start, end) of it; a whole file has no unit.
    """

    source: int
    path: str
    rel: str
    fs_path: str = ""
    error: str = ""
    unit: str = ""
    start: int = 0
    end: int = 0
    size: int = -1
    version: str = ""

    @property
    def open_path(self) -> str:
        """The name to open the file by."""
        return self.fs_path or self.path

    @property
    def first(self) -> bool:
        """Whether this is a whole file or its first part (which reports whole-file errors)."""
        return self.start == 0

    @property
    def bounds(self) -> tuple[int, ...]:
        """(start, end) of a part, () for a whole file: what the inputs digest adds per part."""
        return (self.start, self.end) if self.unit else ()


def display_name(name: str) -> str:
    """A file name as valid UTF-8 text: unchanged when it is, else escaped losslessly.

    POSIX names are bytes; Python decodes the bytes that are not UTF-8 to lone surrogates
    (`surrogateescape`), which cannot be encoded, hashed or written as JSON. We show each
    such byte as `\\xNN` and double the name's backslashes, so the bytes can be recovered.
    """
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        pass
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that did not come from undecodable bytes
        raw = name.encode("utf-8", "surrogatepass")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def _input(source: int, full: str, rel: str, error: str = "") -> InputFile:
    shown = display_name(full)
    return InputFile(source, shown, display_name(rel), full if shown != full else "", error)


class Listing:
    """Input files of a recipe plus the files skipped while listing, by source and reason."""

    def __init__(self) -> None:
        self.files: list[InputFile] = []
        self.skipped: dict[str, dict[str, int]] = {}

    def skip(self, source: str, reason: str, n: int = 1) -> None:
        """Count `n` files left out of the listing."""
        per = self.skipped.setdefault(source, {})
        per[reason] = per.get(reason, 0) + n


_WARNED: set[tuple[str, int]] = set()


def _warn_pattern(path: str, line: int, pattern: str, error: Exception) -> None:
    """Say once per process that a .gitignore line was skipped (not an error: git skips it too)."""
    if (path, line) in _WARNED:
        return
    _WARNED.add((path, line))
    print(
        f"lemur-data: warning: {display_name(path)}:{line}: invalid .gitignore pattern "
        f"{pattern!r} skipped ({error})",
        file=sys.stderr,
    )


def _gitignore(directory: str) -> Any | None:
    path = os.path.join(directory, ".gitignore")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    return gitignore_spec(lines, path)


def gitignore_spec(lines: list[str], path: str) -> Any:
    """The spec of a .gitignore file's lines; a bad pattern is skipped with a warning."""
    import pathspec

    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (ValueError, re.error):
        pass
    # One bad pattern (a lone `!`, a reversed range `[z-a]`) must not lose the whole file.
    good = []
    for number, line in enumerate(lines, start=1):
        try:
            pathspec.GitIgnoreSpec.from_lines([line])
        except (ValueError, re.error) as e:
            _warn_pattern(path, number, line, e)
            continue
        good.append(line)
    return pathspec.GitIgnoreSpec.from_lines(good)


def _unreadable(index: int, root: Path, found: list[InputFile]) -> Callable[[OSError], None]:
    """An `os.walk` error handler that lists an unreadable directory as an input error."""

    def on_error(e: OSError) -> None:
        where = str(e.filename or root)
        rel = os.path.relpath(where, root) if where != str(root) else "."
        found.append(_input(index, where, rel, f"unreadable directory: {e.strerror or e}"))

    return on_error


def _walk(root: Path, index: int, source: SourceConfig, listing: Listing) -> Iterator[InputFile]:
    """Files under root, honouring .gitignore files and skipping vendored directories."""
    import enry

    specs: list[tuple[str, Any]] = []  # (directory, spec) for .gitignore files above us
    errors: list[InputFile] = []  # unreadable directories, in walk order
    for dirpath, dirnames, filenames in os.walk(root, onerror=_unreadable(index, root, errors)):
        yield from errors
        errors.clear()
        specs = [(d, sp) for d, sp in specs if dirpath == d or dirpath.startswith(d + os.sep)]
        if source.gitignore and (spec := _gitignore(dirpath)) is not None:
            specs.append((dirpath, spec))

        def ignored(full: str, is_dir: bool, specs: list[tuple[str, Any]] = specs) -> bool:
            for d, spec in specs:
                rel_to = os.path.relpath(full, d).replace(os.sep, "/")
                if spec.match_file(rel_to + ("/" if is_dir else "")):
                    return True
            return False

        keep_dirs = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            # enry (Go) and fnmatch get the UTF-8 display name; see `display_name`.
            rel = display_name(os.path.relpath(full, root).replace(os.sep, "/"))
            if d in SKIP_DIRS:
                listing.skip(source.name, "tool_directory")
            elif source.skip_vendored and enry.is_vendor(rel + "/"):
                listing.skip(source.name, "vendored")
            elif source.gitignore and ignored(full, is_dir=True):
                listing.skip(source.name, "gitignored")
            else:
                keep_dirs.append(d)
        dirnames[:] = keep_dirs
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            shown = display_name(rel)
            if source.include and not any(fnmatch.fnmatch(shown, g) for g in source.include):
                continue
            if source.exclude and any(fnmatch.fnmatch(shown, g) for g in source.exclude):
                listing.skip(source.name, "excluded")
                continue
            if name == ".gitignore" or os.path.islink(full) or not os.path.isfile(full):
                continue
            if source.gitignore and ignored(full, is_dir=False):
                listing.skip(source.name, "gitignored")
                continue
            if source.skip_vendored and enry.is_vendor(shown.replace(os.sep, "/")):
                listing.skip(source.name, "vendored")
                continue
            yield _input(index, full, rel)
    yield from errors  # an unreadable root is reported after the walk ends


def _plain_files(root: Path, index: int) -> list[InputFile]:
    """Every file under a jsonl/parquet directory (dotfiles left out), sorted by path."""
    errors: list[InputFile] = []
    found = []
    for dirpath, _, filenames in os.walk(root, onerror=_unreadable(index, root, errors)):
        found += [Path(dirpath, n) for n in filenames if not n.startswith(".")]
    files = [_input(index, str(x), str(x.relative_to(root))) for x in sorted(found) if x.is_file()]
    return files + errors


def split_file(
    f: InputFile, source: SourceConfig, split_bytes: int, opener: Opener = open_local
) -> list[InputFile]:
    """A file's parts when it is big enough to split (see `split.py`), else [f]."""
    plan = None if f.error else plan_parts(f.open_path, source, split_bytes, f.size, opener)
    if plan is None:
        return [f]
    unit, bounds = plan
    return [dataclasses.replace(f, unit=unit, start=a, end=b) for a, b in bounds]


def list_inputs(recipe: Recipe) -> Listing:
    """Every input of every source, in a deterministic order; big files as several parts.

    An unreadable directory is listed as an input with an `error`, so the build counts it
    under the source's errors and names it, instead of silently leaving out its files.
    A file split into parts (`executor.split_bytes`) is listed once per part, in order.
    """
    listing = Listing()
    for i, source in enumerate(recipe.sources):
        if any(is_remote(p) for p in source.paths):
            listing.files += recorded_listing(recipe, i, listing)
            continue
        found = 0
        for match in expand_paths(source):
            p = Path(match)
            if p.is_dir():
                if source.format == "files":
                    files = list(_walk(p, i, source, listing))
                else:
                    files = _plain_files(p, i)
            else:
                files = [_input(i, str(p), p.name)]
            for f in files:
                listing.files += split_file(f, source, recipe.executor.split_bytes)
            found += len(files)
        if found == 0:
            raise RecipeError(f"recipe: source '{source.name}': no input files under its paths")
    return listing


def _keep_remote_file(
    obj: remote_listing.RemoteObject, source: SourceConfig, listing: Listing, specs: dict[str, Any]
) -> bool:
    """Whether an object of a remote code tree is kept by the tree rules `_walk` applies."""
    import enry

    rel = obj.rel
    parts = rel.split("/")
    if any(d in SKIP_DIRS for d in parts[:-1]):
        listing.skip(source.name, "tool_directory")
        return False
    if source.include and not any(fnmatch.fnmatch(rel, g) for g in source.include):
        return False
    if source.exclude and any(fnmatch.fnmatch(rel, g) for g in source.exclude):
        listing.skip(source.name, "excluded")
        return False
    if parts[-1] == ".gitignore":
        return False
    for directory, spec in specs.items():  # .gitignore files of the directories above it
        if (not directory or rel.startswith(directory + "/")) and spec.match_file(
            rel[len(directory) + 1 :] if directory else rel
        ):
            listing.skip(source.name, "gitignored")
            return False
    if source.skip_vendored and enry.is_vendor(rel):
        listing.skip(source.name, "vendored")
        return False
    return True


def _remote_tree(
    objects: list[remote_listing.RemoteObject],
    source: SourceConfig,
    remote: Remote,
    listing: Listing,
) -> list[remote_listing.RemoteObject]:
    """The objects of a remote code tree (`format: files`) its rules keep."""
    specs: dict[str, Any] = {}
    if source.gitignore:
        for obj in objects:
            if obj.rel.split("/")[-1] == ".gitignore":
                lines = remote.cat(obj.url).decode("utf-8", "replace").splitlines()
                specs[posixpath.dirname(obj.rel)] = gitignore_spec(lines, obj.url)
    return [o for o in objects if _keep_remote_file(o, source, listing, specs)]


def _list_remote_source(recipe: Recipe, index: int, listing: Listing) -> list[InputFile]:
    """List a source with remote paths (local ones listed as always), big files split."""
    source = recipe.sources[index]
    remote = Remote(source.storage_options, source.remote_settings())
    files: list[InputFile] = []
    for path in source.paths:
        if not is_remote(path):
            for match in expand_paths(dataclasses.replace(source, paths=[path])):
                p = Path(match)
                found = _plain_files(p, index) if p.is_dir() else [_input(index, match, p.name)]
                files += [
                    g for f in found for g in split_file(f, source, recipe.executor.split_bytes)
                ]
            continue
        try:
            objects = remote_listing.find_objects(remote, path)
        except (OSError, ImportError, ValueError) as e:  # denied, retries spent, no client
            raise RecipeError(
                f"recipe: source '{source.name}': cannot list '{display_url(path)}': {e}"
            ) from None
        if not objects:
            raise RecipeError(f"recipe: source '{source.name}': path '{path}' matches nothing")
        if source.format == "files":
            objects = _remote_tree(objects, source, remote, listing)
        elif any("/" in o.rel for o in objects):  # a prefix of data files: dotfiles left out
            objects = [o for o in objects if not o.rel.split("/")[-1].startswith(".")]
        for o in objects:
            f = InputFile(index, o.url, o.rel, size=o.size, version=o.version)
            # Splitting reads a head or a footer of a big file: small blocks, not whole ones.
            opener = partial(remote.open, size=o.size, block_bytes=LISTING_BLOCK_BYTES)
            files += split_file(f, source, recipe.executor.split_bytes, opener)
    return files


def recorded_listing(recipe: Recipe, index: int, listing: Listing) -> list[InputFile]:
    """A remote source's files: as recorded in the work directory by an earlier run of this
    build, else listed now and recorded (see remote_listing.py)."""
    source = recipe.sources[index]
    key = remote_listing.record_key(source, recipe.executor.split_bytes)
    path = work_folders.listing_record(recipe.work_root(), key)
    record = remote_listing.load_record(path)
    if record is None:
        before = dict(listing.skipped.get(source.name, {}))
        files = _list_remote_source(recipe, index, listing)
        if not files:
            raise RecipeError(f"recipe: source '{source.name}': no input files under its paths")
        skipped = {k: v - before.get(k, 0) for k, v in listing.skipped.get(source.name, {}).items()}
        remote_listing.save_record(path, [dataclasses.asdict(f) for f in files], skipped)
        return files
    for reason, n in record["skipped"].items():
        for _ in range(n):
            listing.skip(source.name, reason)
    return [dataclasses.replace(InputFile(**f), source=index) for f in record["files"]]

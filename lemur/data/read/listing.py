"""Listing a recipe's input files: directory walks with .gitignore and skip rules, globs."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemur.data.read.split import plan_parts
from lemur.data.recipe import Recipe, RecipeError, SourceConfig
from lemur.data.recipe_sources import expand_paths

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

    def skip(self, source: str, reason: str) -> None:
        """Count one file left out of the listing."""
        per = self.skipped.setdefault(source, {})
        per[reason] = per.get(reason, 0) + 1


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
    import pathspec

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
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
            elif source.gitignore and ignored(full, True):
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
            if source.gitignore and ignored(full, False):
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


def split_file(f: InputFile, source: SourceConfig, split_bytes: int) -> list[InputFile]:
    """A file's parts when it is big enough to split (see `split.py`), else [f]."""
    plan = plan_parts(f.open_path, source, split_bytes) if not f.error else None
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

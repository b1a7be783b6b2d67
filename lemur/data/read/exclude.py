"""The recipe's `exclude:` lists: documents a build must not hold, dropped as they are read.

How a user honours opt-out requests (The Stack's "Am I in The Stack?" removals, a takedown):
list the repositories, paths (globs) or document ids in files of one entry per line, and
rebuild. Each reader asks `Exclusions.reason` of every document before it is counted kept,
so an excluded document is dropped with the reason `excluded` (`dropped:<source>:excluded`
in the manifest's counts: read = kept + dropped) and never reaches a filter, dedup or the
shards. Lines are taken as written (surrounding blanks removed); empty lines and lines
starting with `#` are skipped.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemur.data.recipe.errors import RecipeError

if TYPE_CHECKING:  # annotations only
    from lemur.data.recipe.recipe import Recipe

EXCLUDED = "excluded"  # the drop reason
GLOB_CHARS = frozenset("*?[")
KINDS = ("repositories", "paths", "ids")


class ExcludeFileError(ValueError):
    """An exclude file that cannot be read as lines of UTF-8 text (the message names it)."""


def read_entries(path: str, kind: str) -> list[str]:
    """The entries of one exclude file; ExcludeFileError naming it and what is wrong."""
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ExcludeFileError(f"{p}: exclude.{kind} file not found") from None
    except IsADirectoryError:
        raise ExcludeFileError(f"{p}: exclude.{kind} is a directory, not a file") from None
    except OSError as e:
        raise ExcludeFileError(f"{p}: exclude.{kind} unreadable: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ExcludeFileError(
            f"{p}: exclude.{kind} is not UTF-8 text (invalid byte at offset {e.start})"
        ) from None
    if "\0" in text:
        raise ExcludeFileError(f"{p}: exclude.{kind} is a binary file (NUL byte)")
    lines = (line.strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


@dataclass(frozen=True)
class Exclusions:
    """The entries of a recipe's exclude files (picklable: each read task holds them)."""

    repositories: frozenset[str] = frozenset()
    paths: frozenset[str] = frozenset()  # exact paths
    globs: tuple[str, ...] = ()  # path patterns (fnmatch: `*` matches `/` too)
    ids: frozenset[str] = frozenset()
    repo_key: str = "repo_name"  # the metadata key naming a row's repository (`repos.key`)
    _glob: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, files: dict[str, str | None], repo_key: str = "repo_name") -> Exclusions:
        """The entries of `files` ({kind: path or None}, kinds of KINDS); `repo_key`: the
        metadata key naming a row's repository."""
        entries = {k: read_entries(p, k) if p else [] for k, p in files.items()}
        paths = entries.get("paths", [])
        globs = tuple(sorted(p for p in paths if GLOB_CHARS & set(p)))
        return cls(
            repositories=frozenset(entries.get("repositories", [])),
            paths=frozenset(p for p in paths if not GLOB_CHARS & set(p)),
            globs=globs,
            ids=frozenset(entries.get("ids", [])),
            repo_key=repo_key,
        )

    def __bool__(self) -> bool:
        return bool(self.repositories or self.paths or self.globs or self.ids)

    def key(self) -> str:
        """A digest of the entries (part of the read stage's work key)."""
        blob = "\0".join(
            f"{kind}\1" + "\1".join(sorted(values))
            for kind, values in (
                ("repositories", self.repositories),
                ("paths", self.paths | set(self.globs)),
                ("ids", self.ids),
            )
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _matcher(self) -> Any:
        if self._glob is None and self.globs:
            pattern = "|".join(fnmatch.translate(g) for g in self.globs)
            object.__setattr__(self, "_glob", re.compile(pattern))  # once per task
        return self._glob

    def path_excluded(self, *paths: str | None) -> bool:
        """Whether any of `paths` is listed or matches a listed glob."""
        for path in paths:
            if not path:
                continue
            if path in self.paths:
                return True
            matcher = self._matcher()
            if matcher is not None and matcher.match(path):
                return True
        return False

    def excluded(
        self,
        doc_id: str,
        local_id: str,
        paths: tuple[str | None, ...],
        repository: str | None,
    ) -> bool:
        """Whether a document is listed: by its id (`source/id`, or the id its source gave:
        a row's id, a Stack v2 blob id), a path (the document's, or its input file's), or
        its repository."""
        if self.ids and (doc_id in self.ids or local_id in self.ids):
            return True
        if repository is not None and repository in self.repositories:
            return True
        return self.path_excluded(*paths)


def exclusions_of(recipe: Recipe) -> Exclusions:
    """The entries of a recipe's `exclude:` files (none without it); RecipeError naming a
    file that cannot be read."""
    if recipe.exclude is None:
        return Exclusions()
    repo_key = recipe.repos.key if recipe.repos is not None else "repo_name"
    try:
        return Exclusions.load(recipe.exclude.files(), repo_key)
    except ExcludeFileError as e:
        raise RecipeError(str(e)) from None

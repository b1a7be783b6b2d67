"""The recipe's `sources:` list: one input source each (files of one format and one domain),
the checks of the list, keyed by position (`sources[1].format ...`), and the files a
source's paths match (`expand_paths`: loading a recipe checks them, listing reads them)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lemur.data.recipe_errors import RecipeError

FORMATS = ("jsonl", "parquet", "files", "chat")
# `format: chat` row layouts, each normalized to `messages` (lemur/data/read/chat.py).
CHAT_SCHEMAS = ("messages", "sharegpt", "oasst1", "openorca", "alpaca")
CHAT_DOMAIN = "chat"  # the domain of a chat source that names none
# Column layouts of well-known datasets; keys given in the recipe win over the preset's.
SOURCE_PRESETS: dict[str, dict[str, Any]] = {
    "the-stack": {
        "format": "parquet",
        "text_key": "content",
        "id_key": "hexsha",
        "path_key": "max_stars_repo_path",
        "language_key": "lang",
        "metadata_keys": ["max_stars_repo_name", "max_stars_count", "ext", "size"],
    },
    "refinedweb": {
        "format": "parquet",
        "text_key": "content",
        "id_key": "url",
        "metadata_keys": ["url", "timestamp"],
    },
}
# Source, domain and benchmark names: they become file and directory names.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SourceConfig:
    """One input source: files of one format and one domain (checked by the recipe holding
    it, whose messages name its position)."""

    name: str
    domain: str
    paths: list[str]
    format: str
    text_key: str = "text"
    id_key: str = "id"
    include: list[str] | None = None
    exclude: list[str] | None = None
    languages: list[str] | None = None
    language: str | None = None
    language_key: str | None = None
    path_key: str | None = None
    metadata_keys: list[str] | None = None
    preset: str | None = None
    max_file_bytes: int = 10_000_000
    gitignore: bool = True
    skip_vendored: bool = True
    schema: str | None = None


def expand_paths(source: SourceConfig, index: int | None = None) -> list[str]:
    """Expand `~` and globs of a source's paths; each entry must match something (the error
    says which key to set when the source's `index` in `sources` is given)."""
    out: list[str] = []
    for p in source.paths:
        pattern = os.path.expanduser(p)
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            hint = (
                ""
                if index is None
                else f"; point it at your files: --set 'sources.{index}.paths=[DIR_OR_GLOB]'"
            )
            raise RecipeError(f"recipe: source '{source.name}': path '{p}' matches nothing{hint}")
        out.extend(matches)
    return out


def check_sources(sources: Sequence[SourceConfig]) -> None:
    """RecipeError naming `sources[i]...` for an empty list, a bad or repeated name, domain,
    format or schema, no paths, or a non-positive max_file_bytes."""
    if not sources:
        raise RecipeError("recipe: 'sources' is empty")
    names = set()
    for i, s in enumerate(sources):
        key = f"sources[{i}]"
        if not NAME_RE.match(s.name):
            raise RecipeError(f"recipe: {key}.name {s.name!r} must be letters, digits, _ . -")
        if s.name in names:
            raise RecipeError(f"recipe: {key}.name {s.name!r} is used twice")
        names.add(s.name)
        if not NAME_RE.match(s.domain):
            raise RecipeError(f"recipe: {key}.domain {s.domain!r} must be letters, digits, _ . -")
        if s.format not in FORMATS:
            raise RecipeError(
                f"recipe: {key}.format {s.format!r} is not one of {', '.join(FORMATS)}"
            )
        _check_schema(s, key)
        if not s.paths:
            raise RecipeError(f"recipe: {key}.paths is empty")
        if s.max_file_bytes <= 0:
            raise RecipeError(f"recipe: {key}.max_file_bytes must be > 0")


def _check_schema(s: SourceConfig, key: str) -> None:
    """`format: chat` names one of the chat schemas; no other format takes a schema."""
    if s.format != "chat":
        if s.schema is not None:
            raise RecipeError(f"recipe: {key}.schema is only for format chat, not {s.format!r}")
        return
    if s.schema is None:
        raise RecipeError(
            f"recipe: {key}.schema is required for format chat: one of {', '.join(CHAT_SCHEMAS)}"
        )
    if s.schema not in CHAT_SCHEMAS:
        raise RecipeError(
            f"recipe: {key}.schema {s.schema!r} is not one of {', '.join(CHAT_SCHEMAS)}"
        )

"""The recipe's `export:` list: the formats the build writes its shards in when it is done."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lemur.data.recipe.errors import RecipeError
from lemur.export.formats import FORMAT_MODULES

SPLITS = ("train", "val", "all")


@dataclass(frozen=True)
class ExportConfig:
    """One `export:` entry: `lemur-data export OUTPUT --format FORMAT --out OUT --split
    SPLIT` run as the build's last stage (OUT replaced when it holds an older export)."""

    format: str
    out: str
    split: str = "all"

    def __post_init__(self) -> None:
        if self.format not in FORMAT_MODULES:
            known = ", ".join(FORMAT_MODULES)
            raise RecipeError(f"recipe: export.format {self.format!r} is not one of {known}")
        if not self.out.strip():
            raise RecipeError("recipe: export.out must name the folder to write")
        if self.split not in SPLITS:
            raise RecipeError(
                f"recipe: export.split {self.split!r} is not one of {', '.join(SPLITS)}"
            )


def check_exports(exports: list[ExportConfig], output: str) -> None:
    """Refuse exports into the build's output or into one another's folder (one line)."""
    root = Path(output).expanduser().resolve()
    seen: set[Path] = set()
    for e in exports:
        out = Path(e.out).expanduser().resolve()
        if out == root or root in out.parents or out in root.parents:
            raise RecipeError(f"recipe: export.out {e.out} overlaps the build's output {output}")
        if out in seen:
            raise RecipeError(f"recipe: export.out {e.out} is named twice")
        seen.add(out)

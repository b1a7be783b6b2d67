"""The recipe's `repos:` section: repository documents (lemur/data/repos/, docs/recipe.md#repos)."""

from __future__ import annotations

from dataclasses import dataclass

from lemur.data.recipe.errors import RecipeError

# `path`: by path (byte order of the UTF-8 names); `random`: a seeded shuffle per repository;
# `imports`: DeepSeek-Coder's topological order of the import graph (repos/imports.py).
# Named here, below the stages, so that the recipe does not import the repos package.
ORDERS = ("path", "random", "imports")
# `auto`: the model's markers where its tokenizer has both, else plain text; `markers`
# insists on them (a tokenizer without is a one-line error); `plain` always spells them.
REPO_FORMATS = ("auto", "markers", "plain")


@dataclass(frozen=True)
class ReposConfig:
    """Repository documents: which sources, the file order, the format and the length budget.

    `key`: the metadata key (a `jsonl`/`parquet` column listed in `metadata_keys`, or what a
    reader keeps, e.g. The Stack v2's `repo_name`) naming a row's repository; `files` sources
    are grouped by checkout. `max_tokens`: a document's budget, framing included (default
    `seq_len`). `sources`: the code sources to group (default: every code source).
    """

    order: str = "imports"
    format: str = "auto"
    max_tokens: int | None = None
    key: str = "repo_name"
    sources: list[str] | None = None

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise RecipeError(
                f"recipe: repos.order {self.order!r} is not one of {', '.join(ORDERS)}"
            )
        if self.format not in REPO_FORMATS:
            raise RecipeError(
                f"recipe: repos.format {self.format!r} is not one of {', '.join(REPO_FORMATS)}"
            )
        if self.max_tokens is not None and self.max_tokens < 8:
            raise RecipeError(f"recipe: repos.max_tokens must be >= 8, got {self.max_tokens}")
        if not self.key.strip():
            raise RecipeError("recipe: repos.key is empty")

    def spill_settings(self) -> tuple:
        """What the read stage's set-aside files depend on (part of its work key)."""
        return (self.key, tuple(self.sources) if self.sources is not None else None)

"""The order of a repository's files in its document (recipe `repos.order`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from lemur.data.recipe.repos import ORDERS
from lemur.data.repos.imports import dependencies, import_order


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository as it reaches grouping (kept by the filters and dedup)."""

    path: str  # inside the repository
    text: str
    language: str
    doc_id: str  # the file's document id (unique in the build)
    tokens: int = 0  # its ids as a document of its own, framed (the read stage's; 0: unknown)


def _by_path(files: list[RepoFile]) -> list[RepoFile]:
    """Files by path, then id (a table may hold one path twice)."""
    return sorted(files, key=lambda f: (f.path.encode("utf-8", "surrogatepass"), f.doc_id))


def order_files(files: list[RepoFile], order: str, seed: int, repo_key: str) -> list[RepoFile]:
    """`files` of the repository `repo_key` in the recipe's `order` (deterministic: the
    random order draws from `seed` and the repository, never from the files' arrival)."""
    if order not in ORDERS:
        raise ValueError(f"repository order {order!r} is not one of {', '.join(ORDERS)}")
    ranked = _by_path(files)
    if order == "path":
        return ranked
    if order == "random":
        random.Random(f"{seed}\0{repo_key}").shuffle(ranked)  # str seeds hash stably (sha512)
        return ranked
    first: dict[str, RepoFile] = {}
    for f in ranked:
        first.setdefault(f.path, f)
    deps = dependencies({p: f.text for p, f in first.items()})
    place = {p: i for i, p in enumerate(import_order(first, deps))}
    return sorted(ranked, key=lambda f: place[f.path])  # stable: one path's copies by id

"""Which repository a file of a `files` source belongs to.

A source path is a tree of checkouts. A file's repository is the nearest folder at or above
it, up to the source path itself, that holds `.git` (a checkout, nested or not); else the
top-level folder of the source path holding it; a file lying directly in a source path that
is no checkout belongs to the repository named after that path's folder.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath

# Metadata keys a `files` source's documents carry (FilesReader): the repository's name as
# shown in documents, the folder that identifies it (what files are grouped by), and the
# file's path inside it.
REPO_NAME, REPO_DIR, REPO_PATH = "repo_name", "repo_dir", "repo_path"


def _is_checkout(directory: str) -> bool:
    """Whether a folder holds `.git` (a folder, or a file in a worktree or submodule).
    Not cached: a few stats per file read cost little beside reading it, and a cache would
    outlive a checkout made or removed between two builds of one process."""
    return os.path.lexists(os.path.join(directory, ".git"))


def _folders(path: str, n: int) -> list[str]:
    """The `n` folders holding `path`, nearest first."""
    out = [os.path.dirname(path)]
    while len(out) < n:
        out.append(os.path.dirname(out[-1]))
    return out


def checkout_fields(real_path: str, shown_path: str, rel: str) -> dict[str, str]:
    """{REPO_NAME, REPO_DIR, REPO_PATH} of a file: `real_path` is what the disk is asked
    about, `shown_path` and `rel` (below its source path, '/'-separated) its names as the
    listing shows them (valid UTF-8), which the fields are made of."""
    parts = PurePosixPath(rel).parts
    real, shown = _folders(real_path, len(parts)), _folders(shown_path, len(parts))
    root_name = os.path.basename(shown[-1].rstrip(os.sep)) or shown[-1]
    for depth, folder in enumerate(real):  # nearest first
        if _is_checkout(folder):
            cut = len(parts) - 1 - depth  # parts above the checkout
            name = "/".join(parts[:cut]) if cut else root_name
            return {REPO_NAME: name, REPO_DIR: shown[depth], REPO_PATH: "/".join(parts[cut:])}
    if len(parts) == 1:  # directly in a source path that is no checkout
        return {REPO_NAME: root_name, REPO_DIR: shown[-1], REPO_PATH: parts[0]}
    return {
        REPO_NAME: parts[0],
        REPO_DIR: os.path.join(shown[-1], parts[0]),
        REPO_PATH: "/".join(parts[1:]),
    }

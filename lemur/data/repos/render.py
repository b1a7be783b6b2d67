"""The repository format of a model, and a repository's files split into documents that fit
a token budget at file boundaries.

With the model's own markers (Qwen2.5-Coder: `<|repo_name|>` and `<|file_sep|>`;
StarCoder2: `<repo_name>` and `<file_sep>`) a repository document is

    <|repo_name|>{name}\\n<|file_sep|>{path}\\n{content}<|file_sep|>{path}\\n{content}...

(Qwen2.5-Coder's layout; StarCoder2's has no newline after the name), each marker one id and
every text part encoded as text (the run of text between two markers as one text, as the
model's tokenizer encodes a string holding its markers). A tokenizer without them gets the
plain-text format, the same layout spelled in text (`PLAIN_REPO`, `PLAIN_FILE`) and encoded
as one text, as any document is. A file's content may itself be several parts: a
fill-in-the-middle document's (lemur/data/fim/cut.py), cut per file.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lemur.tokenizer.fim import CodeMarkers, Leading, Part

PLAIN_REPO, PLAIN_FILE = "<repo_name>", "<file_sep>"
# Marker styles whose repository layout has no newline after the name (StarCoder2's).
NO_NEWLINE_AFTER_NAME = ("starcoder",)


@dataclass(frozen=True)
class RepoFormat:
    """How a repository document is spelled: marker ids, or plain text (ids None)."""

    repo_id: int | None = None
    file_id: int | None = None
    newline_after_name: bool = True  # Qwen2.5-Coder's layout; StarCoder2's has none

    @classmethod
    def of(cls, markers: CodeMarkers | None, plain: bool = False) -> RepoFormat:
        """The format of a model with these markers: its own repository markers when it has
        both (and `plain` is not asked for), else plain text."""
        if plain or markers is None or markers.repo_name is None or markers.file_sep is None:
            return cls()
        newline = markers.style not in NO_NEWLINE_AFTER_NAME
        return cls(markers.repo_name, markers.file_sep, newline)

    @property
    def plain(self) -> bool:
        """Whether the markers are spelled in text (the tokenizer has none of its own)."""
        return self.repo_id is None or self.file_id is None

    def header(self, name: str) -> list[Part]:
        """The parts a repository document starts with."""
        tail = "\n" if self.newline_after_name else ""
        if self.plain:  # the start of a document's text (a dummy prefix where the model adds one)
            return [Leading(f"{PLAIN_REPO}{name}{tail}")]
        return [self.repo_id, f"{name}{tail}"]

    def file(self, path: str, content: Sequence[Part]) -> list[Part]:
        """The parts of one file: its separator, its path and its content's parts."""
        if self.plain:
            return [f"{PLAIN_FILE}{path}\n", *content]
        return [self.file_id, f"{path}\n", *content]


def join_text(parts: Sequence[Part]) -> list[Part]:
    """`parts` with neighbouring texts joined (what encoding a document sees as one text:
    a file's path and its content, a header and a file in plain text); a joined text keeps
    the kind of its first part (`Leading` or continuing), empty texts are left out."""
    out: list[Part] = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] = type(out[-1])(out[-1] + p)
        elif not (isinstance(p, str) and not p):
            out.append(p)
    return out


def split_repository(
    header: list[Part],
    files: list[list[Part]],
    encode: Callable[[list[Part]], np.ndarray],
    budget: int,
    additive: bool,
    sizes: list[int] | None = None,
) -> list[tuple[range, np.ndarray]]:
    """Split a repository's files (each a list of parts, in order) into documents of at most
    `budget` ids, each `header` then whole files: (the files it holds, its ids) per document.

    A file that alone exceeds the budget is a document of its own. `additive`: a document's
    ids are its parts' ids end to end (every file starts with a marker id, so no text runs
    across a file boundary), so each file is encoded once; otherwise (plain text, where
    neighbouring texts are encoded together) each document is encoded whole and a file that
    tips it over the budget moves to the next document; there `sizes` (each file's ids as
    counted before: the read stage encoded every file) spares encoding each file alone.
    """
    head = encode(header)
    if additive or sizes is None:
        each = [encode(f) for f in files]
        sizes = [len(e) for e in each]
    out: list[tuple[range, np.ndarray]] = []
    start = 0
    while start < len(files):
        end, size = start + 1, len(head) + sizes[start]
        while end < len(files) and size + sizes[end] <= budget:
            size += sizes[end]
            end += 1
        while True:
            if additive:
                ids = np.concatenate([head, *each[start:end]])
            else:
                ids = encode(join_text([p for f in (header, *files[start:end]) for p in f]))
            if len(ids) <= budget or end == start + 1:
                break
            end -= 1
        out.append((range(start, end), ids))
        start = end
    return out

"""The JSONL files `lemur-eval` reads (task files of `humaneval` and `agent`, `generate`'s
prompts): each line's JSON, and task ids, with errors that name the file and the line."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any


def read_rows(
    path: str | os.PathLike[str], error: type[ValueError] = ValueError
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of each non-blank line of a JSONL file (plain or .gz).

    A line that is not JSON, or nests deeper than Python's parser goes (a RecursionError
    otherwise), and a file that cannot be read or decoded raise `error` naming the file
    (and the line).
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise error(f"{path}:{number}: not JSON ({e.msg})") from None
                except RecursionError:
                    raise error(f"{path}:{number}: JSON nested too deeply") from None
                yield number, row
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read ({e})") from None


def task_id(row: dict[str, Any], index: int) -> str:
    """A task row's id: its `task_id`, else `task/<index>` (its place among the tasks)."""
    return str(row.get("task_id", f"task/{index}"))


def check_task_ids(path: str | os.PathLike[str], ids: Sequence[tuple[int, str]]) -> None:
    """Refuse (ValueError) a task file without tasks, or one whose (line number, task id)
    pairs repeat an id: samples and results are matched to their task by id, so a repeated
    id would check one task's code against another's test. The error names the line."""
    if not ids:
        raise ValueError(f"{path}: no tasks")
    first: dict[str, int] = {}
    for number, tid in ids:
        if tid in first:
            raise ValueError(
                f"{path}:{number}: task id {tid!r} repeats line {first[tid]}'s "
                "(task ids must be unique; a line without one is task/<its index>)"
            )
        first[tid] = number

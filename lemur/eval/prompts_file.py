"""The prompts `lemur-eval generate` reads: --prompt texts and a --prompts JSONL file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lemur.eval import jsonl


class PromptsError(ValueError):
    """A prompts file line that is not a prompt (one line naming the file and line)."""


def is_messages(value: Any) -> bool:
    """Whether `value` is a list of {"role": str, "content": str} messages (a chat prompt)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict)
            and set(m) == {"role", "content"}
            and all(isinstance(v, str) for v in m.values())
            for m in value
        )
    )


def read_prompts(prompt: Sequence[str], prompts: str | None, *, chat: bool) -> list[dict[str, Any]]:
    """Prompt records from --prompt and --prompts (each a dict with "prompt", or with --chat
    "messages": the conversation so far)."""
    rows: list[dict[str, Any]] = [{"prompt": p} for p in prompt]
    if prompts:
        for i, row in jsonl.read_rows(prompts, PromptsError):
            if chat and isinstance(row, dict) and "messages" in row:
                if not is_messages(row["messages"]) or "prompt" in row:
                    raise PromptsError(
                        f'{prompts}:{i}: "messages" must be a non-empty list of '
                        '{"role": str, "content": str} (and no "prompt" beside it)'
                    )
            elif not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise PromptsError(f'{prompts}:{i}: needs a string "prompt"')
            rows.append(row)
    if not rows:
        raise PromptsError("no prompts: give --prompt TEXT or --prompts FILE.jsonl")
    return rows

"""Task prompts longer than the model's context: refused, left out or cut, and counted.

`lemur-eval humaneval` and `infill` send each task's prompt whole; one longer than the
context (`--max-seq-len`, default the model's) is, by `--long-prompts`:

- `refuse` (the default): one line naming the first such task, its length, how many tasks
  are that long, and the flags that change it (exit 2, before anything is generated);
- `skip`: those tasks are left out of generation and scoring; pass@k is over the rest;
- `truncate` (humaneval only: a FIM prompt cannot lose its prefix marker): the prompt
  keeps its first `keep_first` ids (the BOS) and then its last ids, up to the context,
  as the bigcode harness truncates its prompts.

Either way the report (`LongPrompts.report`, in summary.json) counts and names them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from lemur.cli_common import UserError

POLICIES = ("refuse", "skip", "truncate")
# What each policy does to a task, as the refusal offers it.
DOES = {"skip": "left out", "truncate": "cut to the BOS and the prompt's last tokens"}


@dataclasses.dataclass
class LongPrompts:
    """What `fit` did to prompts longer than the context."""

    policy: str
    context: int
    skipped: list[str] = dataclasses.field(default_factory=list)
    truncated: list[str] = dataclasses.field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """summary.json's `long_prompts` entry: the policy, the context, the tasks touched."""
        return {
            "policy": self.policy,
            "context_tokens": self.context,
            "skipped": len(self.skipped),
            "truncated": len(self.truncated),
            "skipped_tasks": self.skipped,
            "truncated_tasks": self.truncated,
        }


def note(summary: Mapping[str, Any]) -> str:
    """The console's words for a summary's `long_prompts` entry ("" when no prompt was too
    long, or there was none: `--canonical`)."""
    entry = summary.get("long_prompts") or {}
    parts = [
        f"{entry[k]} task{'' if entry[k] == 1 else 's'} {k} "
        f"(prompt over {entry['context_tokens']} tokens)"
        for k in ("skipped", "truncated")
        if entry.get(k)
    ]
    return "".join(f"; {p}" for p in parts)


def fit(
    task_ids: Sequence[str],
    prompts: Sequence[list[int]],
    context: int,
    policy: str,
    allowed: Sequence[str],
    *,
    keep_first: int = 0,
) -> tuple[list[int], list[list[int]], LongPrompts]:
    """(indices of the tasks kept, their prompts, what was done) for one prompt per task.

    `allowed`: the policies the command offers besides `refuse` (named in the refusal).
    """
    if policy not in ("refuse", *allowed):
        raise ValueError(f"long-prompt policy {policy!r}: expected refuse or {allowed}")
    over = [i for i, p in enumerate(prompts) if len(p) > context]
    done = LongPrompts(policy, context)
    if over and policy == "refuse":
        first = over[0]
        offer = " or ".join(allowed)
        does = ", ".join(DOES[a] for a in allowed)
        raise UserError(
            f"{task_ids[first]}: a prompt of {len(prompts[first])} tokens exceeds the context "
            f"of {context} tokens ({len(over)} of {len(prompts)} tasks): raise --max-seq-len, "
            f"or pass --long-prompts {offer} ({does}, counted in the report)"
        )
    if over and len(over) == len(prompts):
        raise UserError(
            f"every task's prompt exceeds the context of {context} tokens (the shortest has "
            f"{min(len(p) for p in prompts)}): raise --max-seq-len"
        )
    kept, out = [], []
    for i, prompt in enumerate(prompts):
        if len(prompt) <= context:
            kept.append(i)
            out.append(list(prompt))
        elif policy == "skip":
            done.skipped.append(task_ids[i])
        else:
            head = list(prompt[: min(keep_first, context - 1)])
            kept.append(i)
            out.append(head + list(prompt[len(prompt) - (context - len(head)) :]))
            done.truncated.append(task_ids[i])
    return kept, out, done

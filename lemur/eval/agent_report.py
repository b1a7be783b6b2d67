"""An agent run's figures: success rate by turn budget, turns to success, and the plot.

Success at turn budget k is the share of tasks solved within their first k turns (MINT's
cumulative success rate), so the rates never fall as k grows; the rate at k = K is the
run's success rate. Mean turns to success averages over the solved tasks only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lemur.atomic_files import atomic_write_text
from lemur.plots import pyplot, save_figure


def summarize(records: Sequence[dict[str, Any]], turns: int) -> dict[str, Any]:
    """Success rate at each turn budget 1..turns, mean turns to success, how tasks ended."""
    n = len(records)
    solved = [r["solved_at"] for r in records if r["solved_at"] is not None]
    ended: dict[str, int] = {}
    attempts: dict[str, int] = {}
    for r in records:
        ended[r["ended"]] = ended.get(r["ended"], 0) + 1
        for t in r["turn_records"]:
            attempts[t["status"]] = attempts.get(t["status"], 0) + 1
    turn_records = [t for r in records for t in r["turn_records"]]
    return {
        "tasks": n,
        "turns": turns,
        "solved": len(solved),
        "success_rate": len(solved) / n if n else 0.0,
        "success_rate_by_turn": [
            sum(s <= k for s in solved) / n if n else 0.0 for k in range(1, turns + 1)
        ],
        "mean_turns_to_success": sum(solved) / len(solved) if solved else None,
        "ended": dict(sorted(ended.items())),
        "attempts": dict(sorted(attempts.items())),
        "generated_tokens": sum(t["reply_tokens"] for t in turn_records),
        "prefilled_tokens": sum(t["prefilled_tokens"] for t in turn_records),
        "prompt_tokens": sum(t["prompt_tokens"] for t in turn_records),
    }


def write_summary(out_dir: str | os.PathLike[str], summary: dict[str, Any]) -> Path:
    """summary.json in the run directory."""
    path = Path(out_dir) / "summary.json"
    atomic_write_text(path, json.dumps(summary, indent=2) + "\n")
    return path


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's summary: a summary.json, or the run directory holding one."""
    p = Path(path)
    p = p / "summary.json" if p.is_dir() else p
    try:
        summary = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: not an agent run summary ({e})") from None
    if not isinstance(summary, dict) or "success_rate_by_turn" not in summary:
        raise ValueError(f"{p}: not an agent run summary (no success_rate_by_turn)")
    return summary


def plot(runs: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Path:
    """A PNG of success rate against turn budget, one line per run (labelled by feedback)."""
    plt = pyplot()

    summaries = [read_summary(r) for r in runs]
    labels = [s.get("feedback", Path(r).name) for s, r in zip(summaries, runs, strict=True)]
    if len(set(labels)) < len(labels):  # the same mode twice: tell the runs apart by path
        labels = [f"{lab} ({Path(r).name})" for lab, r in zip(labels, runs, strict=True)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for s, label in zip(summaries, labels, strict=True):
        rates = s["success_rate_by_turn"]
        ax.plot(range(1, len(rates) + 1), [100 * r for r in rates], marker="o", label=label)
    longest = max(len(s["success_rate_by_turn"]) for s in summaries)
    ax.set_xticks(range(1, longest + 1))
    ax.set(xlabel="turn budget k", ylabel="success rate within k turns (%)")
    ax.set_title(f"{summaries[0].get('tasks_source', 'tasks')}: success by turn")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(title="feedback")
    fig.tight_layout()
    return save_figure(fig, out, dpi=110)

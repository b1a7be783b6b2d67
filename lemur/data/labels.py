"""The build's stat labels: written by readers, filters, taggers and the tokenize step, and
parsed back, in this one module, so the two sides cannot drift apart.

Every stage counts with datatrove's `stat_update(label)`; the labels are built by the
functions below and nowhere else. `run_labels` sums a run's tasks' labels and `per_source`
parses them into per-source counts; lemur/data/counts.py assembles the manifest's `counts`
from them. This module imports nothing of the build: every stage may use it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

DOCUMENTS = "documents"  # documents tokenized
TOKENS = "tokens"  # tokens written


def read_label(source: str) -> str:
    """A document read from `source`."""
    return f"read:{source}"


def dropped_label(source: str, reason: str) -> str:
    """A document of `source` dropped for `reason`."""
    return f"dropped:{source}:{reason}"


def repaired_label(source: str, kind: str) -> str:
    """A document of `source` kept after a repair of `kind` (e.g. `lone_surrogate`)."""
    return f"repaired:{source}:{kind}"


def truncated_label(source: str) -> str:
    """A chat document of `source` cut at a turn boundary to fit `seq_len` (kept, not dropped)."""
    return f"truncated:{source}"


def error_labels(kind: str, source: str) -> tuple[str, str]:
    """A bad input of `kind`: the overall label and the one per source."""
    return f"error_{kind}", f"error_{kind}:{source}"


def pii_label(source: str, kind: str) -> str:
    """One PII redaction of `kind` in a document of `source`."""
    return f"pii:{source}:{kind}"


def disagreement_label(source: str) -> str:
    """A code document whose declared language differs from the detected one."""
    return f"language_disagreement:{source}"


def language_label(language: str | None) -> str:
    """A document tagged with `language`."""
    return f"language:{language}"


# What remote reading counts per source (read/remote.py): bytes received, requests made,
# retries after throttling or transient errors, requests that failed for good, objects found
# changed since they were listed.
REMOTE_COUNTERS = ("bytes", "requests", "retries", "failures", "changed")


def remote_label(kind: str, source: str) -> str:
    """`kind` (one of REMOTE_COUNTERS) of the remote reading of `source`."""
    return f"remote_{kind}:{source}"


def _stat_total(value: Any) -> int:
    return int(value["total"]) if isinstance(value, dict) else int(value)


def task_labels(run_dir: Path, rank: int) -> Counter[str]:
    """Every stat label's total in one task's datatrove stats file."""
    labels: Counter[str] = Counter()
    for step in json.loads((run_dir / "logs" / "stats" / f"{rank:05d}.json").read_text()):
        for label, value in step["stats"].items():
            labels[label] += _stat_total(value)
    return labels


def run_labels(run_dir: Path, n_tasks: int) -> Counter[str]:
    """Every stat label's total over the tasks' datatrove stats files."""
    labels: Counter[str] = Counter()
    for rank in range(n_tasks):
        labels.update(task_labels(run_dir, rank))
    return labels


def per_source(labels: Counter[str], sources: dict[str, dict[str, Any]]) -> dict[str, Counter]:
    """Fill the per-source counts from the labels (parsed back here, where they are made);
    return the totals by reason and kind."""
    totals: dict[str, Counter] = {
        "dropped": Counter(),
        "errors": Counter(),
        "pii": Counter(),
        "truncated": Counter(),
        "repaired": Counter(),
        "remote": Counter(),
    }
    for label, n in sorted(labels.items()):
        if label.startswith("read:"):
            sources[label[5:]]["read"] += n
        elif label.startswith("dropped:"):
            _, src, reason = label.split(":", 2)
            sources[src]["dropped"][reason] = sources[src]["dropped"].get(reason, 0) + n
            totals["dropped"][reason] += n
        elif label.startswith("repaired:"):
            _, src, kind = label.split(":", 2)
            per = sources[src]["repaired"]
            per[kind] = per.get(kind, 0) + n
            totals["repaired"][kind] += n
        elif label.startswith("truncated:"):
            src = label.split(":", 1)[1]
            sources[src]["truncated"] = sources[src].get("truncated", 0) + n
            totals["truncated"][src] += n
        elif label.startswith("language_disagreement:"):
            sources[label.split(":", 1)[1]]["language_disagreements"] += n
        elif label.startswith("pii:"):
            _, src, kind = label.split(":", 2)
            per = sources[src].setdefault("pii", {})
            per[kind] = per.get(kind, 0) + n
            totals["pii"][kind] += n
        elif label.startswith("remote_") and ":" in label:  # remote reading (read/remote.py)
            kind, src = label[7:].split(":", 1)
            per = sources[src].setdefault("remote", dict.fromkeys(REMOTE_COUNTERS, 0))
            per[kind] = per.get(kind, 0) + n
            totals["remote"][kind] += n
        elif label.startswith("error_") and ":" in label:
            kind, src = label[6:].split(":", 1)
            sources[src]["errors"] += n
            totals["errors"][kind] += n
    return totals

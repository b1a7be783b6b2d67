"""The build's counts: stat labels written by readers, filters and taggers, parsed back here.

Every stage counts with datatrove's `stat_update(label)`; the labels are built by the
functions below and nowhere else, and `collect_counts` parses them back into the
manifest's `counts`, so the two sides cannot drift apart.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemur.data import work as work_folders
from lemur.data.corpus import corpus_of

if TYPE_CHECKING:  # annotations only: read/ and filter/ import this module
    from lemur.data.read.listing import Listing
    from lemur.data.recipe import Recipe

MAX_MANIFEST_ERRORS = 1000
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


def _task_labels(run_dir: Path, n_tasks: int) -> Counter[str]:
    """Every stat label's total over the tasks' datatrove stats files."""
    labels: Counter[str] = Counter()
    for rank in range(n_tasks):
        labels.update(task_labels(run_dir, rank))
    return labels


def _per_source(labels: Counter[str], sources: dict[str, dict[str, Any]]) -> dict[str, Counter]:
    """Fill the per-source counts from the labels; return the totals by reason and kind."""
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


def _errors(run_dir: Path, n_tasks: int) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The first MAX_MANIFEST_ERRORS error records, and every file's error total."""
    errors: list[dict[str, Any]] = []
    for rank in range(n_tasks):
        path = work_folders.errors_dir(run_dir) / f"{rank:05d}.jsonl"
        for line in path.read_text().splitlines():
            if len(errors) < MAX_MANIFEST_ERRORS:
                errors.append(json.loads(line))
    # Every file's error total, past the caps on the lists above (none in older work dirs).
    by_file: Counter[str] = Counter()
    for rank in range(n_tasks):
        totals = work_folders.errors_dir(run_dir) / f"{rank:05d}.files.json"
        if totals.is_file():
            by_file.update(json.loads(totals.read_text()))
    return errors, by_file


def _merge_skipped(listing: Listing) -> dict[str, int]:
    total: Counter[str] = Counter()
    for per in listing.skipped.values():
        total.update(per)
    return dict(sorted(total.items()))


def _remote_totals(remote: Counter[str]) -> dict[str, Any]:
    """The manifest's `remote` counts (bytes, requests, retries, failures), if any was read."""
    return {"remote": {k: remote[k] for k in REMOTE_COUNTERS}} if remote else {}


def collect_counts(
    run_dir: Path,
    recipe: Recipe,
    n_tasks: int,
    listing: Listing,
    dedup: dict[str, Any] | None = None,
    reading: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The manifest's `counts`: per-task datatrove stats and error logs merged, the dedup
    stage's section (`ManifestSections.dedup`: the removals summed) when it has run, and per source
    the input units and bytes read of those listed (`reading`, see budget.py) when given."""
    labels = _task_labels(run_dir, n_tasks)
    sources: dict[str, dict[str, Any]] = {
        s.name: {
            "read": 0,
            "dropped": {},
            "errors": 0,
            "kept": 0,
            "skipped_files": listing.skipped.get(s.name, {}),
            "language_disagreements": 0,
            "repaired": {},
        }
        for s in recipe.sources
    }
    for name, read in (reading or {}).items():
        sources[name].update(read)  # read_bytes, available_bytes, units_read, units_total
    totals = _per_source(labels, sources)
    dropped, error_kinds, pii = totals["dropped"], totals["errors"], totals["pii"]
    errors, by_file = _errors(run_dir, n_tasks)
    for s in sources.values():
        s["kept"] = s["read"] - sum(s["dropped"].values())
    read = sum(s["read"] for s in sources.values())
    # Only chat builds cut documents; other manifests stay as they were.
    truncated = corpus_of(recipe).counts(sum(totals["truncated"].values()))
    return {
        "read": read,
        "dropped": dict(sorted(dropped.items())),
        "duplicates": dedup["exact"] + dedup["near"] if dedup else 0,
        "kept": read - sum(dropped.values()),
        "tokenized": labels[DOCUMENTS],
        "skipped_files": _merge_skipped(listing),
        "errors": errors,
        "errors_total": sum(error_kinds.values()),
        "errors_by_file": dict(sorted(by_file.items())),
        "error_kinds": dict(sorted(error_kinds.items())),
        "decontaminated": {
            reason.removeprefix("contaminated:"): n
            for reason, n in sorted(dropped.items())
            if reason.startswith("contaminated:")
        },
        "pii": dict(sorted(pii.items())),
        "repaired": dict(sorted(totals["repaired"].items())),
        "sources": sources,
        **truncated,
        **_remote_totals(totals["remote"]),
        **({"dedup": dedup} if dedup is not None else {}),
    }


def remote_summary(remote: dict[str, int]) -> str:
    """Remote reading in one line: `12.3 MB in 45 requests, 3 retries, 0 failures`."""
    return (
        f"{remote.get('bytes', 0) / 1e6:,.1f} MB in {remote.get('requests', 0):,} requests, "
        f"{remote.get('retries', 0):,} retries, {remote.get('failures', 0):,} failures"
    )


def drop_reasons(counts: dict[str, Any]) -> str:
    """Every reason documents were dropped for, with its count, the largest first."""
    ranked = sorted(counts["dropped"].items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{reason} {n:,}" for reason, n in ranked)


def drops(counts: dict[str, Any]) -> str:
    """One line of what became of the documents read: `read N, dropped M (reason n, ...)`."""
    reasons = drop_reasons(counts)
    dropped = sum(counts["dropped"].values())
    return (
        f"read {counts['read']:,} documents, dropped {dropped:,}"
        + (f" ({reasons})" if reasons else "")
        + f", {counts['errors_total']:,} input errors"
    )

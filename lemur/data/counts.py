"""The manifest's `counts`, assembled from a run's stat labels (lemur/data/labels.py, where
they are made and parsed), its error records, the dedup and reading sections; and the
one-line summaries of them the command prints.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemur.data import work as work_folders
from lemur.data.corpus import Corpus
from lemur.data.labels import DOCUMENTS, REMOTE_COUNTERS, per_source, run_labels

if TYPE_CHECKING:  # annotations only
    from lemur.data.read.listing import Listing
    from lemur.data.recipe.recipe import Recipe

MAX_MANIFEST_ERRORS = 1000


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
    corpus: Corpus,
    n_tasks: int,
    listing: Listing,
    dedup: dict[str, Any] | None = None,
    reading: dict[str, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The manifest's `counts`: per-task datatrove stats and error logs merged, the dedup
    stage's section (`ManifestSections.dedup`: the removals summed) when it has run, and per source
    the input units and bytes read of those listed (`reading`, see budget.py) when given."""
    labels = run_labels(run_dir, n_tasks)
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
    totals = per_source(labels, sources)
    dropped, error_kinds, pii = totals["dropped"], totals["errors"], totals["pii"]
    errors, by_file = _errors(run_dir, n_tasks)
    for s in sources.values():
        s["kept"] = s["read"] - sum(s["dropped"].values())
    read = sum(s["read"] for s in sources.values())
    # Only chat builds cut documents; other manifests stay as they were.
    truncated = corpus.counts(sum(totals["truncated"].values()))
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

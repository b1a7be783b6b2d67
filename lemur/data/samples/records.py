"""The samples' format: file names, settings, the capped text, the drop verdict with the
value that tripped its rule, and the seeded priority that picks which documents are kept.

This module imports nothing of the build: filters, dedup and the stages all use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import xxhash

FORMAT = "lemur-samples/1"
DROPS = "drops.jsonl"
NEAR_DUPLICATES = "near_duplicates.jsonl"
EXACT_DUPLICATES = "exact_duplicates.jsonl"
DECONTAMINATION = "decontamination.jsonl"
PII = "pii.jsonl"
KEPT = "kept.jsonl"
SUMMARY = "summary.json"
# Every file of the samples folder, in the order the manifest lists them.
FILES = (DROPS, NEAR_DUPLICATES, EXACT_DUPLICATES, DECONTAMINATION, PII, KEPT, SUMMARY)
# The comparisons a rule may state (`value op threshold` is why the document went).
OPS = (">", "<", ">=", "<=", "==", "!=", "in", "not in")
# Removed members shown per near-duplicate cluster.
CLUSTER_MEMBERS = 3


@dataclass(frozen=True)
class SampleSettings:
    """How much the build keeps: up to `per_reason` documents per key, each text capped at
    `max_bytes` UTF-8 bytes; `seed` picks which (the recipe's seed)."""

    per_reason: int = 20
    max_bytes: int = 8192
    seed: int = 0


def priority(seed: int, *parts: str) -> int:
    """A document's seeded rank among its key's candidates (lowest kept): a hash of its
    key and id, so the same documents are kept whatever order or task they arrive in."""
    return xxhash.xxh3_64_intdigest("\x1f".join(parts), seed=seed & 0xFFFFFFFFFFFFFFFF)


def capped(text: str, max_bytes: int) -> dict[str, Any]:
    """`{"text", "cut", "bytes"}`: the text cut at a character boundary to at most
    `max_bytes` UTF-8 bytes, whether it was cut, and its full size in bytes."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return {"text": text, "cut": False, "bytes": len(raw)}
    end = max_bytes
    while end > 0 and raw[end] & 0xC0 == 0x80:  # inside a character: back to its start
        end -= 1
    return {"text": raw[:end].decode("utf-8", "surrogatepass"), "cut": True, "bytes": len(raw)}


def plain(value: Any) -> Any:
    """A measured value or threshold as JSON keeps it (floats to 6 significant digits)."""
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [plain(v) for v in items]
    if hasattr(value, "item"):  # a numpy scalar
        return plain(value.item())
    return value


def shown(value: Any) -> str:
    """A value as a rule line shows it: `14.2`, `0.12`, `[en, fr]`."""
    value = plain(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


class Dropped(tuple):
    """A filter's verdict to drop: `(False, reason)` as datatrove reads it (so counting and
    `rejects:` work unchanged), carrying what tripped the rule: the measure, its value,
    the comparison and the threshold (`mean_line_length 140 > 100`)."""

    measure: str
    value: Any
    op: str
    threshold: Any
    detail: str

    def __new__(
        cls, reason: str, measure: str, value: Any, op: str, threshold: Any, detail: str = ""
    ) -> Dropped:
        """The verdict; `detail`: what the rule line shows after the value (a score)."""
        if op not in OPS:
            raise ValueError(f"comparison {op!r} is not one of {', '.join(OPS)}")
        verdict = super().__new__(cls, (False, reason))
        verdict.measure, verdict.value, verdict.op = measure, value, op
        verdict.threshold, verdict.detail = threshold, detail
        return verdict

    @property
    def reason(self) -> str:
        """The drop reason, as counted."""
        return self[1]

    @property
    def rule(self) -> str:
        """The readable line: `alpha_fraction 0.12 < 0.25`, `language fr (0.97) not in [en]`."""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.measure} {shown(self.value)}{detail} {self.op} {shown(self.threshold)}"

    def fields(self) -> dict[str, Any]:
        """`{"value", "threshold", "op", "rule"}` as the samples and `rejects:` record them."""
        return {
            "value": plain(self.value),
            "threshold": plain(self.threshold),
            "op": self.op,
            "rule": self.rule,
        }


def verdict_fields(result: Any) -> dict[str, Any]:
    """The value, threshold, comparison and rule of a filter's drop (all None when the
    filter gave only a reason)."""
    if isinstance(result, Dropped):
        return result.fields()
    return {"value": None, "threshold": None, "op": None, "rule": None}

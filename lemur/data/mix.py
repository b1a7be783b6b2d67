"""The mix planner: token budgets per domain and language, and sampling rates per source.

Inputs (recipe `mix:`): `ratio` between domains, optional `total_tokens`, optional
`shares` of languages inside a domain, and `max_repeats` (the upsampling cap). Given the
tokens available after filtering and dedup per (domain, language, source), the planner
gives every (domain, language) unit a fraction f of the train tokens:
    f = ratio[domain] / sum(ratio) * share[domain][language]
where listed languages get their share and unlisted ones split the rest in proportion to
what they have (without `shares`, every language of a domain keeps its natural weight).
Then with a total T every unit's budget is T * f and its rate T * f / available: below 1
the unit is downsampled, above 1 repeated (up to `max_repeats`). Without `total_tokens`,
T is the largest total with no rate above 1 ("all of the scarcer side").

Sampling is deterministic: documents are ordered by a seeded hash of their id and taken
as whole passes plus a first-fit pass in that order, so each unit meets its budget to
within its smallest document.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# The Lemur paper's effective code tokens by language (billions); "others" ~3.3B.
LEMUR_CODE_TOKENS = {
    "Python": 65.46,
    "SQL": 4.63,
    "Shell": 1.64,
    "Jupyter Notebook": 1.54,
    "JavaScript": 1.52,
    "C": 1.44,
    "PHP": 1.19,
    "C++": 1.09,
}
LEMUR_CODE_TOTAL = 81.8
MIX_PRESETS: dict[str, dict] = {
    "lemur": {
        "ratio": {"code": 10, "text": 1},
        "shares": {
            "code": {k: round(v / LEMUR_CODE_TOTAL, 6) for k, v in LEMUR_CODE_TOKENS.items()}
        },
    },
}


class MixInfeasible(ValueError):
    """A mix target that the available tokens cannot meet; the message gives the nearest plan."""


def seeded_hash(id_hash: np.ndarray, seed: int, salt: str) -> np.ndarray:
    """A uint64 hash of each document id hash, keyed by seed and purpose (splitmix64 finalizer)."""
    key = int.from_bytes(
        hashlib.blake2b(f"{seed}/{salt}".encode(), digest_size=8).digest(), "little"
    )
    with np.errstate(over="ignore"):
        x = id_hash.astype(np.uint64) ^ np.uint64(key)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def fill_to_budget(tokens_in_order: np.ndarray, budget: int) -> np.ndarray:
    """Mask of documents to take, in the given order, so their tokens come closest to budget.

    Takes the longest prefix that fits, then (first fit) every later document that still
    fits: with large documents a plain prefix can miss a small budget by half a document.
    """
    n = len(tokens_in_order)
    take = np.zeros(n, bool)
    if budget <= 0 or n == 0:
        return take
    cum = np.cumsum(tokens_in_order, dtype=np.int64)
    k = int(np.searchsorted(cum, budget, side="right"))
    take[:k] = True
    total = int(cum[k - 1]) if k else 0
    if k < n:
        suffix_min = np.minimum.accumulate(tokens_in_order[::-1])[::-1]
        for i in range(k, n):
            if budget - total < suffix_min[i]:
                break  # nothing left fits
            t = int(tokens_in_order[i])
            if total + t <= budget:
                take[i] = True
                total += t
        # one more document overshooting the budget can still be the closer choice
        rest = np.flatnonzero(~take)
        if len(rest):
            j = rest[np.argmin(tokens_in_order[rest])]
            if total + int(tokens_in_order[j]) - budget < budget - total:
                take[j] = True
    return take


@dataclass
class UnitPlan:
    """One (domain, language) unit of the plan."""

    domain: str
    language: str
    available: int
    fraction: float
    budget: int = 0
    rate: float = 0.0

    def to_json(self) -> dict:
        """The manifest form of this unit."""
        return {
            "available": self.available,
            "fraction": round(self.fraction, 8),
            "budget": self.budget,
            "rate": round(self.rate, 6),
        }


@dataclass
class MixPlan:
    """Budgets and rates for every unit, plus the totals they came from."""

    total: int
    units: dict[tuple[str, str], UnitPlan]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The manifest's `mix.plan`."""
        langs: dict[str, dict] = {}
        for (d, lang), u in sorted(self.units.items()):
            langs.setdefault(d, {})[lang] = u.to_json()
        return {"total_tokens": self.total, "languages": langs, "notes": self.notes}


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _domain_units(
    d: str,
    r: float,
    rsum: float,
    available: dict[tuple[str, str], int],
    shares: dict[str, dict[str, float]],
    notes: list[str],
) -> dict[tuple[str, str], UnitPlan]:
    """The units of one domain: its languages' fractions of the whole mix (notes appended)."""
    units: dict[tuple[str, str], UnitPlan] = {}
    langs = {lang: a for (dd, lang), a in available.items() if dd == d and a > 0}
    if not langs:
        raise MixInfeasible(f"mix: domain '{d}' has no tokens after filtering and dedup")
    listed = shares.get(d, {})
    listed_sum = sum(listed.values())
    if listed_sum > 1 + 1e-9:
        raise MixInfeasible(f"mix: shares of domain '{d}' sum to {listed_sum:.4f} > 1")
    missing = [lang for lang, s in listed.items() if s > 0 and langs.get(lang, 0) == 0]
    if missing:
        raise MixInfeasible(
            f"mix: shares ask for {d}/{missing[0]} but no such tokens are available "
            f"(available languages: {', '.join(sorted(langs))}); remove it from mix.shares.{d}"
        )
    rest = {lang: a for lang, a in langs.items() if lang not in listed}
    rest_share = 1.0 - listed_sum
    if listed and not rest and rest_share > 1e-9:
        notes.append(
            f"{d}: listed shares sum to {listed_sum:.4f} and no other language is present; "
            "scaled them to 1"
        )
        listed = {k: v / listed_sum for k, v in listed.items()}
        rest_share = 0.0
    if rest and rest_share <= 1e-12 and listed:
        notes.append(f"{d}: shares leave nothing for {', '.join(sorted(rest))}; they are dropped")
    rest_total = sum(rest.values())
    for lang, a in sorted(langs.items()):
        within = listed[lang] if lang in listed else rest_share * a / rest_total
        units[(d, lang)] = UnitPlan(d, lang, a, r / rsum * within)
    return units


def plan_mix(
    available: dict[tuple[str, str], int],
    ratio: dict[str, float],
    total_tokens: float | None = None,
    shares: dict[str, dict[str, float]] | None = None,
    max_repeats: float = 1.0,
) -> MixPlan:
    """Plan budgets and rates; raise MixInfeasible with the nearest feasible plan."""
    shares = shares or {}
    rsum = sum(ratio.values())
    units: dict[tuple[str, str], UnitPlan] = {}
    notes: list[str] = []
    for d, r in ratio.items():
        units.update(_domain_units(d, r, rsum, available, shares, notes))
    active = [u for u in units.values() if u.fraction > 0]
    natural = min(u.available / u.fraction for u in active)
    cap = min(u.available * max_repeats / u.fraction for u in active)
    if total_tokens is None:
        total = natural
    else:
        total = float(total_tokens)
        if total > cap * (1 + 1e-9):
            worst = max(active, key=lambda u: total * u.fraction / u.available)
            need = total * worst.fraction / worst.available
            raise MixInfeasible(
                f"mix infeasible: total_tokens {_fmt(total)} needs {worst.domain}/{worst.language} "
                f"repeated {need:.2f}x (it has {worst.available:,} tokens; max_repeats "
                f"{max_repeats:g}). Nearest feasible plan: total_tokens {_fmt(cap)}, or "
                f"max_repeats {need:.2f}, or a smaller share for {worst.domain}/{worst.language}"
            )
    for u in units.values():
        u.budget = int(round(total * u.fraction))
        u.rate = u.budget / u.available if u.available else 0.0
    return MixPlan(int(round(total)), units, notes)


def plan_all(available: dict[tuple[str, str], int]) -> MixPlan:
    """A plan that takes every available token once (chat builds without `mix.weights`)."""
    total = sum(available.values())
    units = {
        (d, lang): UnitPlan(
            d, lang, a, a / total if total else 0.0, budget=a, rate=1.0 if a else 0.0
        )
        for (d, lang), a in available.items()
    }
    return MixPlan(total, units, ["chat: every kept conversation once (no ratio applies)"])

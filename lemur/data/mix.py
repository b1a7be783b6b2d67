"""Mixing domains to a token ratio, and the seeded hashes that make every choice deterministic.

This first mix step keeps all of the scarcer domain (relative to its ratio) and takes a
deterministic hash-ordered prefix of every other domain so that token counts meet the
ratio within one document.
"""

from __future__ import annotations

import hashlib

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


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


def domain_budgets(
    available: dict[str, int], ratio: dict[str, float], total_tokens: float | None = None
) -> dict[str, int]:
    """Token budget per domain: the largest scale at which every domain can meet its ratio."""
    scale = min(available[d] / r for d, r in ratio.items())
    if total_tokens is not None:
        scale = min(scale, total_tokens / sum(ratio.values()))
    return {d: int(round(scale * r)) for d, r in ratio.items()}


def take_prefix(tokens_in_order: np.ndarray, budget: int) -> int:
    """How many leading documents give a token sum closest to `budget` (never over by a doc)."""
    if budget <= 0 or len(tokens_in_order) == 0:
        return 0
    cum = np.cumsum(tokens_in_order, dtype=np.int64)
    if cum[-1] <= budget:
        return len(cum)
    k = int(np.searchsorted(cum, budget, side="left"))  # cum[k] >= budget
    below = int(cum[k - 1]) if k > 0 else 0
    return k + 1 if int(cum[k]) - budget < budget - below else k

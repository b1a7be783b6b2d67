"""What the tokenize benchmarks share: the best CPU time of runs interleaved in one process."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def cpu_time(fn: Callable[[], int]) -> tuple[float, int]:
    """CPU seconds (all threads of this process) of fn(), and what it returned."""
    t0 = time.process_time()
    n = fn()
    return time.process_time() - t0, n


def best_of(runs: dict[str, Callable[[], int]], repeats: int) -> tuple[dict[str, float], int]:
    """Best CPU seconds of each run over `repeats` rounds, and the token count they share.

    The runs alternate within each round, so a slow spell of the machine hits all of them
    alike; every run must produce the same number of tokens (a check that they did the
    same work).
    """
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in runs.items():
            secs, n = cpu_time(fn)
            tokens[name] = n
            best[name] = min(best.get(name, float("inf")), secs)
    if len(set(tokens.values())) != 1:
        raise AssertionError(f"token counts differ: {tokens}")
    return best, next(iter(tokens.values()))


def tokenizer_bench_args(
    doc: str, mb: float, mb_help: str, tokenizer_help: str
) -> argparse.Namespace:
    """The tokenizer benchmarks' options: --mb, --tokenizer, --repeats, --batch-docs."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=mb, help=mb_help)
    ap.add_argument("--tokenizer", help=tokenizer_help)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-docs", type=int, default=256)
    return ap.parse_args()

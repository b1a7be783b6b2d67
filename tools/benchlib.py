"""What the benchmarks share: the best CPU time of runs interleaved in one process, the
tokenizer benchmarks' options, and a synthetic shard directory (loader and export benches)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

SYNTHETIC_VOCAB = 32000  # Llama-2's: uint16 tokens, ids 1 and 2 framing each document


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


def synthesize_shards(
    directory: Path, tokens: int, seed: int, shard_tokens: int, tokenizer: bytes | Path
) -> tuple[int, int] | None:
    """Write a train split of about `tokens` tokens through `shards/`'s writer, documents of
    lognormal length (median ~900 tokens, a long tail, like source files) drawn from a
    seeded pool; `tokenizer` (bytes or a model file) is the directory's tokenizer file.
    (tokens written, shards), or None when the directory already has a manifest."""
    import shutil

    import numpy as np

    from lemur.shards.format import (
        MANIFEST,
        ShardWriter,
        make_manifest,
        token_dtype,
        tokenizer_entry,
        write_manifest,
    )

    if (directory / MANIFEST).exists():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    if isinstance(tokenizer, bytes):
        (directory / "tokenizer.model").write_bytes(tokenizer)
    else:
        shutil.copyfile(tokenizer, directory / "tokenizer.model")
    rng = np.random.default_rng(seed)
    dtype = token_dtype(SYNTHETIC_VOCAB)
    writer = ShardWriter(directory, "train", "train", "mixed", dtype, shard_tokens)
    pool = rng.integers(3, SYNTHETIC_VOCAB, 1 << 24).astype(dtype)  # body tokens
    written = 0
    while written < tokens:
        n = int(min(rng.lognormal(6.8, 1.2), 200_000))
        at = int(rng.integers(0, len(pool) - n))
        doc = np.concatenate(([1], pool[at : at + n], [2])).astype(dtype)
        writer.add(doc)
        written += len(doc)
    shards = writer.close()
    entry = tokenizer_entry(directory, "tokenizer.model", SYNTHETIC_VOCAB, bos_id=1, eos_id=2)
    sections = {"mix": {}, "counts": {}, "recipe": {}, "recipe_sha256": ""}  # no build behind it
    write_manifest(directory, make_manifest(dtype, 4096, entry, shards, **sections))
    return written, len(shards)

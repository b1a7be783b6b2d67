"""Benchmark the Grain shard loader: tokens/s per host, ratio to raw memmap slicing, RSS.

Synthesizes a shard directory (lognormal document lengths, uint16 tokens) once under
--dir, warms the page cache, then makes full passes over the train windows:

- floor: the same windows, in the same shuffled order, sliced from `np.memmap`s and
  stacked into [batch, seq_len + 1] arrays (no segment ids, no Grain): what any
  loader pays at least;
- loader: `make_train_iterator` batches (inputs, targets, segment_ids, positions,
  loss_mask as int32), with and without a prefetch thread, with page release turned
  off for comparison, and optionally with worker processes.

RSS (anonymous and file-backed, from /proc/*/status, this process plus its worker
processes) is sampled before, during (every 256 batches) and after each pass. Example:

    python tools/bench_loader.py --tokens 200e6 --workers 2
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import grain
import numpy as np
import psutil
from benchlib import synthesize_shards

from lemur.shards.windows import ShardSource
from lemur.train.loader import Reading, derived_seed, make_train_iterator


def synthesize(directory: Path, tokens: int, seed: int, shard_tokens: int) -> None:
    """Write a train split of about `tokens` tokens (skipped if already there)."""
    t0 = time.perf_counter()
    made = synthesize_shards(directory, tokens, seed, shard_tokens, b"bench tokenizer")
    if made is not None:
        written, shards = made
        took = time.perf_counter() - t0
        print(
            f"synthesized {written / 1e6:.0f}M tokens in {shards} shards ({took:.1f}s)",
            file=sys.stderr,
        )


def rss_mb(pid: int | str = "self") -> tuple[float, float]:
    """(anonymous, file-backed) resident set of a process in MiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in text.split("\n") if ":" in line)
    return (int(fields["RssAnon"].split()[0]) / 1024, int(fields["RssFile"].split()[0]) / 1024)


def total_rss_mb() -> tuple[float, float]:
    """`rss_mb` of this process plus its worker processes (children)."""
    anon, file = rss_mb()
    for child in psutil.Process().children(recursive=True):
        try:
            a, f = rss_mb(child.pid)
        except (FileNotFoundError, KeyError):  # gone, or a zombie without Rss fields
            continue
        anon, file = anon + a, file + f
    return anon, file


def floor_pass(src: ShardSource, order: np.ndarray, batch: int) -> float:
    """Seconds to slice and stack every window of `order` straight from np.memmap."""
    L = src.seq_len
    maps = [
        np.memmap(Path(src.directory) / s["file"], dtype=src.dtype, mode="r") for s in src.shards
    ]
    locs = [src.locate(int(i)) for i in order]  # index arithmetic kept out of the timing
    t0 = time.perf_counter()
    for b in range(len(locs) // batch):
        np.stack([maps[s][a : a + L + 1] for s, a in locs[b * batch : (b + 1) * batch]])
    return time.perf_counter() - t0


def loader_pass(directory: str, args: argparse.Namespace, steps: int, **kw) -> dict:
    """Tokens/s and RSS over `steps` batches of a fresh `make_train_iterator`."""
    it = make_train_iterator(
        directory,
        seq_len=args.seq_len,
        batch_size=args.batch,
        seed=args.seed,
        process_index=0,
        process_count=1,
        reading=Reading(**kw),
    )
    next(it)  # start-up (worker processes, first mappings) is not throughput
    before = total_rss_mb()
    peak = before
    t0 = time.perf_counter()
    for s in range(steps):
        batch = next(it)
        if s % 256 == 0:
            now = total_rss_mb()
            peak = (max(peak[0], now[0]), max(peak[1], now[1]))
    dt = time.perf_counter() - t0
    after = total_rss_mb()
    assert batch["inputs"].shape == (args.batch, args.seq_len)
    it.close()
    del it, batch
    gc.collect()  # unmap this run's shards before the next run measures RSS
    return {
        "tok_s": steps * args.batch * args.seq_len / dt,
        "before": before,
        "peak": peak,
        "after": after,
        "seconds": dt,
    }


def main() -> None:
    """Run the benchmark and print a markdown table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default="/tmp/lemur-bench-loader")
    p.add_argument("--tokens", type=float, default=200e6)
    p.add_argument("--shard-tokens", type=float, default=64e6)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workers",
        type=int,
        nargs="*",
        default=[],
        help="also measure with these numbers of worker processes",
    )
    args = p.parse_args()
    directory = Path(args.dir)
    synthesize(directory, int(args.tokens), args.seed, int(args.shard_tokens))
    # Warm the page cache so every pass reads from memory, not disk.
    subprocess.run(
        f"cat {directory}/train/*.bin {directory}/train/*.idx > /dev/null", shell=True, check=True
    )
    src = ShardSource(directory, args.seq_len)
    steps = len(src) // args.batch
    print(
        f"{src!r}: {src.tokens / 1e6:.1f}M tokens, {len(src)} windows, "
        f"{src.dropped_tokens} tokens dropped ({src.dropped_tokens / src.tokens:.4%}), "
        f"{steps} batches of {args.batch} x {args.seq_len} per pass; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        file=sys.stderr,
    )
    # The loader's window order for one source: the same derived seed, epoch 0.
    order_ds = grain.MapDataset.range(len(src)).shuffle(
        seed=derived_seed(args.seed, 0, src.content_id)
    )
    order = np.fromiter((order_ds[i] for i in range(steps * args.batch)), np.int64)
    floor_s = floor_pass(src, order, args.batch)
    floor_tok_s = steps * args.batch * args.seq_len / floor_s

    runs = [
        ("loader, no prefetch (num_threads=0)", {"num_threads": 0}),
        ("loader, 1 prefetch thread (default)", {}),
    ]
    runs += [(f"loader, {w} worker processes", {"num_workers": w}) for w in args.workers]
    # Last, as the pages it leaves mapped would inflate the next run's RSS.
    runs += [
        ("loader, num_threads=0, page release off", {"num_threads": 0, "release_bytes": 1 << 62})
    ]
    print(
        "| pipeline | tokens/s | ratio to floor | RSS anon / file MiB: before -> peak -> after "
        "(with workers) |"
    )
    print("|---|---|---|---|")
    print(
        f"| floor: memmap slice + np.stack (uint16, no segment ids) | "
        f"{floor_tok_s / 1e6:.1f}M | 1.00 | - |"
    )
    for name, kw in runs:
        r = loader_pass(str(directory), args, steps, **kw)
        rss = " -> ".join(f"{a:.0f} / {f:.0f}" for a, f in (r["before"], r["peak"], r["after"]))
        print(
            f"| {name} | {r['tok_s'] / 1e6:.1f}M | {r['tok_s'] / floor_tok_s:.3f} | {rss} |",
            flush=True,
        )
    # The machine is shared: a second floor pass shows how much the load drifted.
    again = steps * args.batch * args.seq_len / floor_pass(src, order, args.batch)
    print(
        f"| floor again, after the loader runs | {again / 1e6:.1f}M | "
        f"{again / floor_tok_s:.2f} | - |"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()

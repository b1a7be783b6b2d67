"""Benchmark `lemur-data export`: every format side by side, and each re-chunked format
against that format's own writer fed the same arrays, in one run.

Synthesizes a train split of uint16 shards under --dir (lognormal document lengths,
median ~900 tokens; the real 32k SentencePiece model of the mistral-common wheel as its
tokenizer, so the whole command can write its HF tokenizer folder), warms the page cache,
then runs each side in a subprocess of its own and reports its wall and CPU seconds and
its peak RSS (`os.wait4`'s ru_maxrss of that child alone: anonymous and file-backed):

- `command <fmt>`: `lemur-data export --format <fmt>` as a whole (the driver: HF tokenizer
  folder, every file's sha256 in export.json, TRAINING.md), for all six formats;
- `format <fmt>`: the format's own work only (`write_part` per shard, `finish`), for
  litdata, mds and parquet: the same job as the library writer's;
- `writer <lib>`: the library's writer fed the same documents from the same memory maps
  (pages released as ours are): litdata's `BinaryWriter` (TokensLoader, the same 64 MiB
  chunks), mosaicml-streaming's `MDSWriter` (the same `size_limit`), and pyarrow's
  `pq.write_table` of one table per shard (the same columns and compression).

Example (the 1 GB run is optional, it writes ~2 GB per side):

    python tools/bench_export.py --tokens 100e6 300e6
    python tools/bench_export.py --tokens 1e9
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
from benchlib import synthesize_shards

from lemur.shards.format import (
    MANIFEST,
    open_array,
    release_pages,
)

CHUNK = 1 << 26  # litdata's chunk_bytes and MDS's size_limit, ours and theirs alike
ZERO_COPY = ("megatron", "nanotron", "olmo")
RECHUNKED = ("litdata", "mds", "parquet")
SIDES = (
    *(f"command {f}" for f in ZERO_COPY + RECHUNKED),
    *(f"format {f}" for f in RECHUNKED),
    "writer litdata",
    "writer mds",
    "writer parquet",
)


def synthesize(directory: Path, tokens: int, seed: int, shard_tokens: int) -> None:
    """Write a train split of about `tokens` uint16 tokens (skipped if already there), with
    the mistral-common wheel's Llama-2-style model as its tokenizer."""
    import mistral_common

    model = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    made = synthesize_shards(directory, tokens, seed, shard_tokens, model)
    if made is not None:
        print(f"synthesized {made[0] / 1e6:.0f}M tokens in {made[1]} shards", file=sys.stderr)


def documents(src: Path):
    """(shard number, tokens memmap, exclusive ends) of every train shard, in order."""
    manifest = json.loads((src / MANIFEST).read_text())
    for n, shard in enumerate(manifest["shards"]):
        tokens = open_array(src / shard["file"], np.dtype(manifest["dtype"]))
        yield n, tokens, open_array(src / shard["index"], np.uint64).astype(np.int64)


def run_format(fmt: str, src: Path, out: Path) -> None:
    """The format's own work: `write_part` of every shard, then `finish`."""
    from lemur.export.formats import exporter
    from lemur.export.run import export_info, shard_parts

    manifest = json.loads((src / MANIFEST).read_text())
    parts = shard_parts(src, manifest, "all")
    info = export_info(src, out, manifest, parts)
    writer = exporter(fmt)
    writer.check(info)
    for part in parts:
        writer.write_part(part, info, out)
    writer.finish(parts, info, out)


def feed(src: Path, write) -> None:
    """Call `write(i, document)` for every document in order, releasing read pages."""
    i = 0
    for _, tokens, ends in documents(src):
        start = 0
        for end in ends.tolist():
            write(i, np.asarray(tokens[start:end]))
            start, i = end, i + 1
            if i % 4096 == 0:
                release_pages(tokens)
        release_pages(tokens)


def run_writer(lib: str, src: Path, out: Path) -> None:
    """The library's own writer fed the same documents (see the module docstring)."""
    if lib == "litdata":
        from litdata.streaming.item_loader import TokensLoader
        from litdata.streaming.writer import BinaryWriter

        (out / "train").mkdir(parents=True)
        bw = BinaryWriter(str(out / "train"), chunk_bytes=CHUNK, item_loader=TokensLoader())
        feed(src, lambda i, doc: bw.add_item(i, doc))
        bw.done()
        bw.merge()
    elif lib == "mds":
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
        from streaming import MDSWriter

        columns = {"tokens": "ndarray:uint16"}
        with MDSWriter(out=str(out / "train"), columns=columns, size_limit=CHUNK) as w:
            feed(src, lambda i, doc: w.write({"tokens": doc}))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        (out / "train").mkdir(parents=True)
        for n, tokens, ends in documents(src):
            offsets = pa.array(np.concatenate([[0], ends]).astype(np.int32))
            ids = pa.array(np.asarray(tokens, np.int32))
            table = pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)})
            pq.write_table(table, out / "train" / f"{n:05d}.parquet", compression="zstd")
            del table, ids
            release_pages(tokens)


def child(side: str, src: Path, out: Path) -> None:
    """Run one side in this (child) process."""
    kind, name = side.split()
    if kind == "synthesize":
        tokens, shard_tokens = (int(float(x)) for x in name.split(","))
        synthesize(src, tokens, 0, shard_tokens)
    elif kind == "command":
        from lemur.export.run import export

        export(src, name, out)
    elif kind == "format":
        run_format(name, src, out)
    else:
        run_writer(name, src, out)


def measure(side: str, src: Path, out: Path) -> dict:
    """Wall and CPU seconds, peak RSS and output size of one side, run in a subprocess.

    The child's ru_maxrss (from `os.wait4`, that child alone) counts from its fork, so it
    includes this parent's resident set at that moment: the parent only imports numpy and
    lemur.shards.format and never holds data (synthesis runs in a child too).
    """
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, __file__, "--child", side, "--dir", str(src), "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{side}: exited {proc.returncode}")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out, ignore_errors=True)
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "rss_mib": usage.ru_maxrss / 1024,
        "out_mib": size / 2**20,
    }


def warm(src: Path) -> int:
    """Read every file of the source once (page cache warm for every side); its bytes."""
    total = 0
    for path in sorted(src.rglob("*.bin")):
        with open(path, "rb") as fh:
            while block := fh.read(1 << 24):
                total += len(block)
    return total


def main() -> None:
    """Synthesize each size, run every side on it, print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=float, nargs="+", default=[100e6], help="corpus sizes")
    ap.add_argument("--dir", default="/tmp/bench_export", help="work folder (sources kept)")
    ap.add_argument("--shard-tokens", type=float, default=1 << 27, help="tokens per shard")
    ap.add_argument("--sides", nargs="+", default=list(SIDES), help="a subset of the sides")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, Path(args.dir), Path(args.out or args.dir))
        return
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"parent process peak RSS {parent:.0f} MiB (part of every child's figure)")
    print("| tokens | side | wall s | CPU s | wall s per GB | peak RSS MiB | output MiB |")
    print("|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        src = Path(args.dir) / f"src-{tokens:.0e}"
        if not (src / MANIFEST).exists():  # in a child: this process stays small (see measure)
            spec = f"{tokens:.0f},{args.shard_tokens:.0f}"
            cmd = [sys.executable, __file__, "--child", f"synthesize {spec}", "--dir", str(src)]
            subprocess.run(cmd, check=True)
        gb = warm(src) / 1e9
        for side in args.sides:
            r = measure(side, src, Path(args.dir) / "out")
            print(
                f"| {tokens / 1e6:.0f}M | {side} | {r['wall']:.2f} | {r['cpu']:.2f} | "
                f"{r['wall'] / gb:.2f} | {r['rss_mib']:.0f} | {r['out_mib']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Benchmark: reading the same corpus from a local S3 server and from disk, in one run.

The corpus is bench_ingest's real code and text (JSONL.zst, cached under --work) plus the
code again as parquet of several row groups. moto's S3 server runs as a separate process
on 127.0.0.1 (its CPU is not ours); the objects are uploaded once. Then, in this process,
the reader step (`SourcesReader`: open, decompress, parse, documents out; no tagging or
filters, so the I/O's share is the largest it can be) reads every input from disk, then
from `s3://` at each `--concurrency` (requests in flight per task: the read-ahead of
`block_bytes` blocks). Per core = input MB / CPU seconds of this process (every thread:
the readers, fsspec's event loop, the read-ahead pool) per MB of document text read.

Each setting runs `--repeats` times, the settings alternating; its least-CPU run is shown.

    python tools/bench_remote.py --mb 60 --concurrency 1,4,8
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_ingest, beside this file

from bench_ingest import build_data  # noqa: E402

KEY, SECRET = "bench-key", "bench-secret"
BUCKET = "bench"


def parquet_copy(jsonl_zst: Path, out: Path, groups: int = 8) -> Path:
    """The rows of a JSONL.zst file as parquet with about `groups` row groups (cached)."""
    if out.is_file():
        return out
    import orjson
    import zstandard

    data = zstandard.ZstdDecompressor().decompressobj().decompress(jsonl_zst.read_bytes())
    rows = [orjson.loads(line) for line in data.splitlines() if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=-(-len(rows) // groups))
    return out


def start_moto(work: Path) -> tuple[subprocess.Popen, str]:
    """moto's S3 server in its own process on a free 127.0.0.1 port; (process, endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=(work / "moto.log").open("w"),
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("moto_server did not start (see moto.log)")


def upload(endpoint: str, files: list[Path]) -> None:
    """Put the files into the bucket (multipart for big ones)."""
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET
    )
    client.create_bucket(Bucket=BUCKET)
    for f in files:
        client.upload_file(str(f), BUCKET, f.name)


def recipe(paths: list[str], opts: dict | None, concurrency: int, block_mb: int):
    """A recipe of three sources (code jsonl, text jsonl, code parquet) over `paths`."""
    from lemur.data.recipe_loader import recipe_from_dict

    extra = (
        {
            "storage_options": opts,
            "remote": {"concurrency": concurrency, "block_bytes": block_mb << 20},
        }
        if opts
        else {}
    )
    code, text, table = paths
    return recipe_from_dict(
        {
            "output": "/tmp/unused",
            "tokenizer": {"train": {}},
            "mix": {"ratio": {"code": 10, "text": 1}},
            "executor": {"split_bytes": 0},
            "sources": [
                {
                    "name": "code",
                    "domain": "code",
                    "format": "jsonl",
                    "paths": [code],
                    "path_key": "path",
                    **extra,
                },
                {"name": "text", "domain": "text", "format": "jsonl", "paths": [text], **extra},
                {
                    "name": "table",
                    "domain": "code",
                    "format": "parquet",
                    "paths": [table],
                    "path_key": "path",
                    **extra,
                },
            ],
        },
        check_paths=False,
    )


def read_all(r) -> tuple[float, float, int, int]:
    """(wall s, CPU s, documents, text bytes) of reading every input of a recipe."""
    from lemur.data.read.listing import list_inputs
    from lemur.data.read.sources import SourcesReader

    files = list_inputs(r).files  # a remote listing is recorded: listed once, not timed
    reader = SourcesReader(files, r.sources, errors_dir="")
    wall, cpu = time.perf_counter(), time.process_time()
    docs = size = 0
    for f in files:
        for d in reader.read(f):
            docs += 1
            size += len(d.text.encode())
    return time.perf_counter() - wall, time.process_time() - cpu, docs, size


def best_runs(settings: dict, repeats: int) -> list[tuple[str, tuple[float, float, int, int]]]:
    """Each setting's read with the least CPU over `repeats` rounds; the settings alternate
    within a round, so a busy spell of the shared machine hits them alike."""
    best: dict[str, tuple[float, float, int, int]] = {}
    for _ in range(repeats):
        for name, r in settings.items():
            run = read_all(r)
            if name not in best or run[1] < best[name][1]:
                best[name] = run
    return list(best.items())


def main() -> None:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=60, help="corpus size (bench_ingest's data)")
    ap.add_argument("--work", default="/tmp/bench_remote")
    ap.add_argument("--concurrency", default="1,4,8", help="requests in flight, comma-separated")
    ap.add_argument("--block-mb", type=int, default=8, help="bytes of one ranged read, MiB")
    ap.add_argument("--repeats", type=int, default=3, help="rounds; the least CPU is kept")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    code, text = build_data(work, args.mb)
    table = parquet_copy(code, work / "code.parquet")
    files = [code, text, table]
    mb = sum(f.stat().st_size for f in files) / 1e6
    os.environ.update({"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET})
    for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        os.environ[name] = str(work / "empty")
    (work / "empty").write_text("")
    proc, endpoint = start_moto(work)
    try:
        upload(endpoint, files)
        opts = {"client_kwargs": {"endpoint_url": endpoint}}
        urls = [f"s3://{BUCKET}/{f.name}" for f in files]
        settings = {"disk": recipe([str(f) for f in files], None, 1, args.block_mb)}
        for c in (int(x) for x in args.concurrency.split(",")):
            settings[f"s3 concurrency {c}"] = recipe(urls, opts, c, args.block_mb)
        rows = best_runs(settings, args.repeats)
    finally:
        proc.terminate()
        proc.wait(10)
    text_mb = rows[0][1][3] / 1e6  # per core: MB of document text out per CPU second
    local_rate = text_mb / rows[0][1][1]
    print(
        f"{mb:.1f} MB of files (jsonl.zst code + text, parquet code), {text_mb:.1f} MB of"
        f" text read from each; block {args.block_mb} MiB"
    )
    print("| read from | wall s | CPU s | MB/s per core | MB/s wall | docs | per core vs disk |")
    print("|---|---|---|---|---|---|---|")
    for name, (wall, cpu, docs, _) in rows:
        rate = text_mb / cpu
        print(
            f"| {name} | {wall:.1f} | {cpu:.1f} | {rate:.1f} | {text_mb / wall:.1f} | {docs:,} "
            f"| {rate / local_rate:.2f}x |"
        )
    if len({r[1][2] for r in rows}) != 1 or len({r[1][3] for r in rows}) != 1:
        raise SystemExit("the reads differ: not the same documents")


if __name__ == "__main__":
    main()

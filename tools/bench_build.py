"""Benchmark: end-to-end `lemur-data build` vs a plain datatrove chain, same data, same run.

Data (built once, cached): >= 200 MB of real code and text as JSONL.zst (Python stdlib,
/usr/include, Perl modules, npm JavaScript; English man pages, /usr/share/doc, pydoc
topics). One SentencePiece model is trained up front and given to both sides.

  lemur    : `lemur-data build` (read, tag, all filters, PII, exact + MinHash dedup,
             tokenize; dedup, histogram, scatter and gather tasks; mix 10:1), executor
             local, --workers processes
  datatrove: read -> GopherQualityFilter -> JsonlWriter; MinhashDedupSignature ->
             MinhashDedupBuckets -> MinhashDedupCluster; read -> MinhashDedupFilter ->
             DocumentTokenizer (the same model, converted to HF `tokenizer.json`)

Both run as subprocess trees with the same number of worker processes; CPU seconds are
the children's user + system time, so MB/s per core = MB / CPU s.

    python tools/bench_build.py --mb 230 --workers 2   # needs spaCy: pip install -e '.[bench]'
    python tools/bench_build.py --mb 230 --skip-datatrove --set pii.enabled=false

With `--fim RATE`, the lemur side runs three times in one run: without FIM, with `fim:
{rate: RATE, spm_rate: 0.5}` (a fresh output), and that output rebuilt at another rate
(`fim.rate` changed: only the FIM stage and packing re-run). `--tokenizer MODEL` gives a
SentencePiece model instead of training one; `--work DIR` moves the cached data and outputs.

    python tools/bench_build.py --mb 40 --skip-datatrove --fim 0.5 \
        --tokenizer .venv/lib/python3.11/site-packages/mistral_common/data/tokenizer.model.v1

With `--compare DIR`, the lemur side also runs from another checkout (a `git worktree` of
the commit before a change), in the same run on the same data; `--repeat N` alternates the
two N times, so that a load that comes and goes weighs on both.

    git worktree add --detach /tmp/before HEAD~1
    python tools/bench_build.py --mb 80 --workers 2 --compare /tmp/before --repeat 2

With `--inspect`, the lemur side builds with `inspect:` off and on (the build's samples,
docs/format.md#samples-samples-recipe-inspect), side by side in one run, each into a
fresh output, alternated `--repeat` times; it prints the cost of the samples (CPU and
wall, on / off), the size of the samples folder, and checks that the shards are the same.

    python tools/bench_build.py --mb 100 --workers 2 --skip-datatrove --inspect --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORK = Path("/tmp/lemur-bench-build")

DATATROVE_CHAIN = r"""
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig
from datatrove.pipeline.filters import GopherQualityFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from datatrove.pipeline.writers import JsonlWriter

data, out, tok, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = MinhashConfig(n_grams=5, num_buckets=16, hashes_per_bucket=8)
tasks = 8
def run(pipeline, n, **kw):
    LocalPipelineExecutor(pipeline, tasks=n, workers=min(workers, n), logging_dir=f"{out}/logs/{kw['name']}").run()
run([JsonlReader(data, glob_pattern="*.jsonl.zst"), GopherQualityFilter(), JsonlWriter(f"{out}/filtered")], tasks, name="filter")
run([JsonlReader(f"{out}/filtered"), MinhashDedupSignature(output_folder=f"{out}/sigs", config=cfg)], tasks, name="sigs")
run([MinhashDedupBuckets(input_folder=f"{out}/sigs", output_folder=f"{out}/buckets", config=cfg)], cfg.num_buckets, name="buckets")
run([MinhashDedupCluster(input_folder=f"{out}/buckets", output_folder=f"{out}/remove", config=cfg)], 1, name="cluster")
run([JsonlReader(f"{out}/filtered"), MinhashDedupFilter(input_folder=f"{out}/remove"),
     DocumentTokenizer(output_folder=f"{out}/tokens", tokenizer_name_or_path=tok, eos_token="</s>", batch_size=1000)],
    tasks, name="tokenize")
"""


def build_data(mb: float) -> Path:
    """Real code + text JSONL.zst files under WORK/data (cached)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_ingest

    data = WORK / "data"
    if not (data / "code.jsonl.zst").is_file():
        bench_ingest.build_data(data, mb)
    return data


def prepare_tokenizer(data: Path) -> tuple[Path, Path]:
    """Train one 32k SentencePiece model on a sample; convert it for HF `tokenizers`."""
    from transformers import LlamaTokenizerFast

    from lemur.data.encode.prepare import sample_texts
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.read.listing import list_inputs
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig
    from lemur.data.recipe_loader import recipe_from_dict

    model = WORK / "tokenizer.model"
    hf = WORK / "hf-tokenizer"
    if not model.is_file():
        r = recipe_from_dict(recipe(data, WORK / "unused", model=None))
        train_tokenizer(
            sample_texts(r, list_inputs(r).files, 50_000_000),
            TokenizerTrainConfig(vocab_size=32000),
            model,
        )
    if not (hf / "tokenizer.json").is_file():
        LlamaTokenizerFast(vocab_file=str(model), legacy=False).save_pretrained(hf)
    return model, hf / "tokenizer.json"


def recipe(data: Path, out: Path, model: Path | None, workers: int = 2) -> dict:
    """The lemur recipe for the benchmark data."""
    return {
        "output": str(out),
        "tokenizer": {"model": str(model)} if model else {"train": {"vocab_size": 32000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "executor": {"kind": "local", "tasks": 8, "workers": workers},
        "sources": [
            {
                "name": "code",
                "domain": "code",
                "format": "jsonl",
                "paths": [str(data / "code.jsonl.zst")],
                "path_key": "path",
            },
            {
                "name": "text",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(data / "text.jsonl.zst")],
            },
        ],
    }


TICK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """pid -> (parent pid, CPU seconds so far, resident MiB) for every process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, utime, stime, rss_pages = (
            int(fields[1]),
            int(fields[11]),
            int(fields[12]),
            int(fields[21]),
        )
        out[int(d)] = (ppid, (utime + stime) / TICK, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20)
    return out


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run a command; wall time, CPU time of its whole process tree, and peak tree RSS.

    Worker processes of a forkserver are not reaped by the command itself, so
    RUSAGE_CHILDREN would miss them; we sample /proc for every descendant instead (a
    process's last < 0.2 s may be missed).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    cpu: dict[int, float] = {}
    peak_rss = 0.0
    while proc.poll() is None:
        table = _proc_table()
        tree = {proc.pid}
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _, _) in table.items():
                if ppid in tree and pid not in tree:
                    tree.add(pid)
                    changed = True
        rss = 0.0
        for pid in tree:
            if pid in table:
                cpu[pid] = max(cpu.get(pid, 0.0), table[pid][1])
                rss += table[pid][2]
        peak_rss = max(peak_rss, rss)
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    err = proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"{cmd[:3]} failed:\n{err[-3000:]}")
    return {
        "wall_s": wall,
        "cpu_s": sum(cpu.values()),
        "peak_rss_mib": peak_rss,
        "processes": len(cpu),
    }


def lemur_build(
    data: Path,
    out: Path,
    model: Path,
    workers: int,
    sets: list[str],
    more: dict | None = None,
    fresh: bool = True,
    tree: Path | None = None,
) -> dict:
    """One timed `lemur-data build` (into a fresh `out` unless `fresh` is False), of the
    checkout `tree` when given (else this one)."""
    if fresh:
        subprocess.run(["rm", "-rf", str(out)], check=True)
    rpath = WORK / f"recipe-{out.name}.yaml"
    rpath.write_text(yaml.safe_dump({**recipe(data, out, model, workers), **(more or {})}))
    args = [a for kv in sets for a in ("--set", kv)]
    # `python -m` puts the working directory before PYTHONPATH: run in the tree as well.
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    r = timed([sys.executable, "-m", "lemur.data.cli", "build", str(rpath), *args], env, tree)
    manifest = json.loads((out / "manifest.json").read_text())
    what = [f"fim.rate={more['fim']['rate']}"] if more else []
    where = [f"at {commit(tree)}"] if tree else []
    name = " ".join(["lemur-data build", *where, *sets, *what, *([] if fresh else ["(rerun)"])])
    r.update(name=name, tokens=sum(s["tokens"] for s in manifest["shards"]))
    if "fim" in manifest:
        r["fim"] = manifest["fim"]["counts"]
    print(r, file=sys.stderr, flush=True)
    return r


def commit(tree: Path) -> str:
    """The short commit checked out in `tree`."""
    head = ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]
    return subprocess.run(head, capture_output=True, text=True, check=True).stdout.strip()


def compared(data: Path, model: Path, args: argparse.Namespace) -> list[dict]:
    """`--compare`: the other checkout's build and this one's, alternated `--repeat` times."""
    rows = []
    for _ in range(args.repeat):
        rows.append(
            lemur_build(
                data, WORK / "lemur-before", model, args.workers, args.set, tree=args.compare
            )
        )
        rows.append(lemur_build(data, WORK / "lemur-out", model, args.workers, args.set))
    return rows


def inspect_pair(data: Path, model: Path, args: argparse.Namespace) -> list[dict]:
    """`--inspect`: builds with `inspect:` off and on, alternated `--repeat` times."""
    rows = []
    for _ in range(args.repeat):
        off = [*args.set, "inspect.enabled=false"]
        rows.append(lemur_build(data, WORK / "lemur-inspect-off", model, args.workers, off))
        rows.append(lemur_build(data, WORK / "lemur-out", model, args.workers, args.set))
    return rows


def shard_digests(out: Path) -> list[str]:
    """The sha256 of every shard file of a build, in the manifest's order."""
    return [s["sha256"] for s in json.loads((out / "manifest.json").read_text())["shards"]]


def inspect_summary(rows: list[dict], n: int) -> str:
    """The samples' cost: mean CPU and wall on / off, the samples folder's size."""
    off = [r for r in rows[: 2 * n : 2]]
    on = [r for r in rows[1 : 2 * n : 2]]
    cpu = sum(r["cpu_s"] for r in on) / sum(r["cpu_s"] for r in off)
    wall = sum(r["wall_s"] for r in on) / sum(r["wall_s"] for r in off)
    manifest = json.loads((WORK / "lemur-out" / "manifest.json").read_text())
    folder = WORK / "lemur-out" / manifest["samples"]["dir"]
    size = sum(p.stat().st_size for p in folder.iterdir())
    same = shard_digests(WORK / "lemur-out") == shard_digests(WORK / "lemur-inspect-off")
    return (
        f"\ninspect on / off, mean CPU s: {cpu:.3f}x ({cpu - 1:+.1%}), wall: {wall:.3f}x "
        f"({wall - 1:+.1%}); samples/ {size / 1e6:.2f} MB in {len(list(folder.iterdir()))} "
        f"files; shards identical: {same}"
    )


def main() -> int:
    """Run both sides and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=210.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-datatrove", action="store_true")
    ap.add_argument("--fim", type=float, default=None, metavar="RATE")
    ap.add_argument("--tokenizer", type=Path, default=None, metavar="MODEL")
    ap.add_argument("--work", type=Path, default=None, metavar="DIR")
    ap.add_argument(
        "--compare",
        type=Path,
        default=None,
        metavar="DIR",
        help="also build from the checkout DIR (e.g. a git worktree of the commit before)",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="with --compare or --inspect: runs of each"
    )
    ap.add_argument(
        "--inspect", action="store_true", help="build with inspect: off and on, side by side"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe override for the lemur side (e.g. pii.enabled=false), repeatable",
    )
    args = ap.parse_args()
    if sum(x is not None and x is not False for x in (args.compare, args.fim, args.inspect)) > 1:
        ap.error("--compare, --fim, --inspect: one comparison at a time")
    global WORK
    WORK = args.work or WORK
    data = build_data(args.mb)
    mb = sum(p.stat().st_size for p in data.glob("*.jsonl.zst")) / 1e6  # compressed, for reference
    raw_mb = (
        float(json.loads((data / "size.json").read_text())["mb"])
        if (data / "size.json").is_file()
        else None
    )
    model, tokjson = args.tokenizer, None
    if model is None or not args.skip_datatrove:
        model, tokjson = prepare_tokenizer(data)
    if args.compare is not None:
        rows = compared(data, model, args)
    elif args.inspect:
        rows = inspect_pair(data, model, args)
    else:
        rows = [lemur_build(data, WORK / "lemur-out", model, args.workers, args.set)]
    if args.fim is not None:
        fim = {"fim": {"rate": args.fim, "spm_rate": 0.5}}
        out = WORK / "lemur-fim-out"
        rows.append(lemur_build(data, out, model, args.workers, args.set, fim))
        other = {"fim": {"rate": 0.9 if args.fim != 0.9 else 0.5, "spm_rate": 0.5}}
        rows.append(lemur_build(data, out, model, args.workers, args.set, other, fresh=False))
    if not args.skip_datatrove:
        dt = WORK / "datatrove-out"
        subprocess.run(["rm", "-rf", str(dt)], check=True)
        r = timed(
            [
                sys.executable,
                "-c",
                DATATROVE_CHAIN,
                str(data),
                str(dt),
                str(tokjson),
                str(args.workers),
            ]
        )
        r.update(name="plain datatrove chain", tokens=None)
        rows.append(r)
        print(r, file=sys.stderr, flush=True)
    size = raw_mb or mb
    print(f"data: {size:.1f} MB of text ({mb:.1f} MB compressed), {args.workers} workers\n")
    print(
        "| chain | wall s | CPU s | MB/s per core | peak RSS MiB (all processes) |\n|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['name']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {size / r['cpu_s']:.2f} | {r['peak_rss_mib']:.0f} |"
        )
    if args.fim is not None:
        base, on, rerun = rows[:3]
        print(
            f"\nFIM on / off, CPU s: {on['cpu_s'] / base['cpu_s']:.3f}x, wall: "
            f"{on['wall_s'] / base['wall_s']:.3f}x; rate changed (FIM stage and packing only) / "
            f"FIM build, CPU s: {rerun['cpu_s'] / on['cpu_s']:.3f}x; FIM counts {on['fim']}"
        )
    elif args.compare is not None:
        n = args.repeat
        before = sum(r["cpu_s"] for r in rows[: 2 * n : 2]) / n
        after = sum(r["cpu_s"] for r in rows[1 : 2 * n : 2]) / n
        procs = [sum(r["processes"] for r in rows[i : 2 * n : 2]) / n for i in (0, 1)]
        print(
            f"\nthis checkout / {commit(args.compare)}, mean CPU s: {after / before:.3f}x "
            f"({before:.1f} -> {after:.1f}); processes in the tree: {procs[0]:.0f} -> {procs[1]:.0f}"
        )
        if not args.skip_datatrove:
            dt = rows[-1]["cpu_s"]
            print(
                f"lemur / plain datatrove throughput per core: before {dt / before:.1f}x, "
                f"after {dt / after:.1f}x"
            )
    elif args.inspect:
        print(inspect_summary(rows, args.repeat))
    elif len(rows) == 2:
        print(
            f"\nlemur / plain datatrove throughput per core: {rows[1]['cpu_s'] / rows[0]['cpu_s']:.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

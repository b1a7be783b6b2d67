"""Benchmark: lemur's MinHash dedup vs datatrove's MinHash stages, and a detection curve.

Documents are non-overlapping windows of real text (stdlib sources, /usr/include headers,
/usr/share/doc, man pages), 5% of them planted as near copies (1% of words edited). Both
sides use word 5-grams and 16 bands x 8 rows. Each side runs in its own subprocess (one
core) so peak RSS is its own:

  lemur    : DedupSigner over the documents (one task), then its bucket tasks and cluster
             task run one after the other in this process (run_here)
  datatrove: MinhashDedupSignature -> MinhashDedupBuckets -> MinhashDedupCluster
             (stage 4, the filter, re-reads the data and is left out of both timings)

    python tools/bench_dedup.py --docs 100000 1000000 --datatrove-max 100000
    python tools/bench_dedup.py --curve        # detection rate over edit rates
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORK = Path("/tmp/lemur-bench-dedup")


def word_stream(max_words: int) -> list[str]:
    """Words of real text and code found on this machine."""
    from lemur.data.demo import doc_files, pydoc_topics

    words: list[str] = []
    for row in list(pydoc_topics()) + list(doc_files(20_000_000)):
        words += row["text"].split()
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/include")]
    for root in roots:
        for p in sorted(root.rglob("*")):
            if len(words) >= max_words:
                return words[:max_words]
            if "site-packages" in p.parts or not p.is_file() or p.is_symlink():
                continue
            try:
                words += p.read_text(encoding="utf-8").split()
            except (UnicodeDecodeError, OSError):
                continue
    return words


def iter_docs(n: int):
    """Stream the n cached documents from disk (so memory reflects the dedup itself)."""
    with (WORK / f"docs-{n}.jsonl").open() as f:
        for line in f:
            yield json.loads(line)


def make_docs(n: int, words_per_doc: int = 40, planted: float = 0.05) -> list[str]:
    """n documents: windows of the word stream, plus planted near copies; cached on disk."""
    path = WORK / f"docs-{n}.jsonl"
    if path.is_file():
        return [json.loads(x) for x in path.open()]
    rng = random.Random(0)
    n_planted = int(n * planted)
    stream = word_stream((n - n_planted) * words_per_doc)
    # with less text on disk than asked for, use shorter windows rather than more copies
    wpd = max(8, min(words_per_doc, len(stream) // (n - n_planted)))
    base = [" ".join(stream[i : i + wpd]) for i in range(0, len(stream) - wpd + 1, wpd)]
    base = base[: n - n_planted]
    docs = base + [edit(base[rng.randrange(len(base))], 0.01, rng) for _ in range(n - len(base))]
    WORK.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    tmp.replace(path)  # a killed run never leaves a partial cache behind
    return docs


def edit(text: str, rate: float, rng: random.Random) -> str:
    """Replace a share of the words (at least one) with fresh ones."""
    w = text.split()
    for i in rng.sample(range(len(w)), max(1, round(rate * len(w)))):
        w[i] = f"x{rng.randrange(10**9)}"
    return " ".join(w)


def run_lemur(docs) -> dict:
    """Signatures + clusters with lemur; CPU seconds and documents removed."""
    from datatrove.data import Document

    from lemur.data.dedup.signer import DedupSigner
    from lemur.data.dedup.stage import dedup_result, dedup_stages
    from lemur.data.recipe.recipe import DedupConfig
    from lemur.data.run.task import run_here
    from lemur.data.runs.format import DOC_RECORD

    cfg = DedupConfig()
    if spec := os.environ.get("LEMUR_DEDUP"):  # BANDSxROWS[:SIM[:SKETCH]], see --lemur
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_dedup_quality import parse_layout

        cfg = parse_layout(spec, cfg)
    tmp = Path(tempfile.mkdtemp(prefix="lemur-dedup-"))
    t0 = time.process_time()
    for _ in DedupSigner(cfg, str(tmp)).run(
        Document(text=d, id=str(i)) for i, d in enumerate(docs)
    ):
        pass
    t1 = time.process_time()
    n = (tmp / "00000.chash.bin").stat().st_size // 8
    rec = np.zeros(n, DOC_RECORD)  # the tokenize task's records: keep order = document order
    rec["id_hash"] = np.arange(n)
    np.save(tmp / "00000.docs.npy", rec)
    ddir = tmp / "dedup"
    for stage, step, tasks in dedup_stages(cfg, tmp, 1, ddir):  # in this process, in turn
        run_here([step], ddir / stage, tasks, stage)
    res = dedup_result(tmp, 1, ddir)
    t2 = time.process_time()
    return {"signature_s": t1 - t0, "cluster_s": t2 - t1, "removed": int(res.removed.sum())}


def run_datatrove(docs) -> dict:
    """datatrove's MinHash stages 1-3 with the same parameters, in this process."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    cfg = MinhashConfig(n_grams=5, num_buckets=16, hashes_per_bucket=8)
    tmp = Path(tempfile.mkdtemp(prefix="dt-dedup-"))
    stream = (Document(text=d, id=str(i)) for i, d in enumerate(docs))
    t0 = time.process_time()
    sig = MinhashDedupSignature(output_folder=str(tmp / "sigs"), config=cfg)
    sig.run(stream, 0, 1)
    t1 = time.process_time()
    for bucket in range(cfg.num_buckets):
        MinhashDedupBuckets(
            input_folder=str(tmp / "sigs"), output_folder=str(tmp / "buckets"), config=cfg
        ).run(None, bucket, cfg.num_buckets)
    MinhashDedupCluster(
        input_folder=str(tmp / "buckets"), output_folder=str(tmp / "remove_ids"), config=cfg
    ).run(None, 0, 1)
    t2 = time.process_time()
    removed = 0
    for f in (tmp / "remove_ids").glob("*.remove"):
        removed += f.stat().st_size // 4
    return {"signature_s": t1 - t0, "cluster_s": t2 - t1, "removed": removed}


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM). Unlike ru_maxrss, it does not carry over from the
    parent across fork + exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(side: str, n: int) -> None:
    """Run one side on n documents and print JSON with timings and peak RSS."""
    mb = sum(len(d.encode()) for d in iter_docs(n)) / 1e6
    rss0 = peak_rss_mib()
    out = run_lemur(iter_docs(n)) if side == "lemur" else run_datatrove(iter_docs(n))
    out.update(
        side=side,
        docs=n,
        mb=mb,
        peak_rss_mib=peak_rss_mib(),
        rss_before_mib=rss0,
    )
    print(json.dumps(out))


def curve() -> None:
    """Share of planted copies removed, by share of words edited, on 2,000 real windows."""
    from lemur.data.recipe.recipe import DedupConfig

    rng = random.Random(3)
    base = make_docs(20000)[:2000]
    # longer documents: join 5 windows (200 words), closer to real files
    base = [" ".join(base[i : i + 5]) for i in range(0, len(base), 5)]
    print("| words edited | copies removed | mean exact 5-gram Jaccard |\n|---|---|---|")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_data_dedup import jaccard, run_dedup

    for rate in (0.005, 0.01, 0.02, 0.05, 0.10):
        copies = [edit(t, rate, rng) for t in base]
        tmp = Path(tempfile.mkdtemp(prefix="curve-"))
        res = run_dedup(base + copies, [0] * len(base) + [1] * len(copies), DedupConfig(), tmp)
        jac = np.mean([jaccard(a, b) for a, b in zip(base, copies, strict=True)])
        print(f"| {rate:.1%} | {res.removed[len(base) :].mean():.1%} | {jac:.3f} |")


def main() -> int:
    """Run children for each size and side; print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, nargs="+", default=[100_000])
    ap.add_argument("--datatrove-max", type=int, default=100_000, help="skip datatrove above this")
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "N"))
    ap.add_argument(
        "--lemur", help="lemur's config as BANDSxROWS[:SIM[:SKETCH]] (default: its defaults)"
    )
    ap.add_argument("--curve", action="store_true")
    ap.add_argument("--make", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.lemur:
        os.environ["LEMUR_DEDUP"] = args.lemur  # read by the child processes
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    if args.curve:
        curve()
        return 0
    if args.make:
        make_docs(args.make)
        return 0
    rows = []
    for n in args.docs:
        if not (WORK / f"docs-{n}.jsonl").is_file():  # in a child, so this process stays small
            subprocess.run([sys.executable, __file__, "--make", str(n)], check=True)
        for side in ("lemur", "datatrove"):
            if side == "datatrove" and n > args.datatrove_max:
                continue
            res = subprocess.run(
                [sys.executable, __file__, "--child", side, str(n)], capture_output=True, text=True
            )
            if res.returncode:
                print(res.stderr[-2000:], file=sys.stderr)
                return 1
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr, flush=True)
    print(
        "| side | docs | MB | signature MB/s/core | docs/s/core (all stages) | cluster s "
        "| peak RSS MiB | removed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        total = r["signature_s"] + r["cluster_s"]
        print(
            f"| {r['side']} | {r['docs']:,} | {r['mb']:.1f} | {r['mb'] / r['signature_s']:.2f} | "
            f"{r['docs'] / total:,.0f} | {r['cluster_s']:.1f} | {r['peak_rss_mib']:.0f} "
            f"| {r['removed']:,} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

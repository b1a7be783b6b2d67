"""Benchmark: `lemur-data inspect` on a build of 10M documents: the page's size and the time
to write it (issue #46 item 3: under 10 MB, under 10 s).

A build of that size takes hours to make, and what `inspect` reads of it does not depend
on how its tokens came about, so this synthesizes one: `--shards` train shards holding
`--documents` documents in all (real `.idx` files, 20 to 200 tokens a document; the `.bin`
files sparse, their bytes zeros but for the browsed documents' tokens), a manifest with
`--sources` sources of `--reasons` drop reasons each, a stats.json of 10 languages per
source, and a samples/ folder as full as the build's defaults allow (K = 20 documents of
8 KB per source and reason, per source and language, near-duplicate clusters). The
tokenizer is a small SentencePiece model trained on this machine's text. Then it runs
`lemur-data inspect` in this process, timed, `--repeats` times.

    python tools/bench_inspect.py --documents 10000000
    python tools/bench_inspect.py --build out/demo        # an existing build instead
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
K, MAX_BYTES, LANGUAGES = 20, 8192, 10


def _texts() -> list[str]:
    """Real text and code of this machine (the demo's sources), for tokens and samples."""
    from lemur.data.demo import pydoc_topics

    texts = [t for t in pydoc_topics() if len(t) > 200][:300]
    return texts or ["def f(x):\n    return x + 1\n" * 50]


def _tokenizer(out: Path, texts: list[str]) -> tuple[Path, Any]:
    """A 2,000-piece SentencePiece model trained on `texts`, and the tokenizer opened."""
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig
    from lemur.tokenizer import open_tokenizer

    path = train_tokenizer(texts, TokenizerTrainConfig(vocab_size=2000), out / "tokenizer.model")
    return path, open_tokenizer(path)


def _shards(out: Path, n_docs: int, n_shards: int, tok: Any, texts: list[str]) -> list[dict]:
    """Shard files and their manifest entries; the first documents hold real tokens."""
    rng = np.random.default_rng(0)
    entries = []
    per = n_docs // n_shards
    (out / "train").mkdir(parents=True, exist_ok=True)
    for i in range(n_shards):
        ends = np.cumsum(rng.integers(20, 200, size=per, dtype=np.int64)).astype("<u8")
        rel = f"train/{i:05d}"
        (out / f"{rel}.idx").write_bytes(ends.tobytes())
        with open(out / f"{rel}.bin", "wb") as f:
            f.truncate(int(ends[-1]) * 2)  # sparse: zeros cost no disk
            ids = [tok.bos_id, *tok.encode(texts[i % len(texts)]), tok.eos_id]
            f.seek(0)
            f.write(np.asarray(ids[: int(ends[-1])], "<u2").tobytes())
        entries.append(
            {
                "file": f"{rel}.bin",
                "index": f"{rel}.idx",
                "split": "train",
                "domain": "mixed",
                "tokens": int(ends[-1]),
                "documents": per,
                "sha256": "0" * 64,
            }
        )
    return entries


def _sections(n_docs: int, sources: int, reasons: int) -> dict[str, Any]:
    """The manifest's counts, mix and recipe of a build of `n_docs` documents."""
    per = n_docs // sources
    names = [f"source-{i:02d}" for i in range(sources)]
    counts = {
        n: {
            "read": per + per // 10,
            "kept": per,
            "dropped": {f"reason_{r:02d}": per // 10 // reasons for r in range(reasons)},
        }
        for n in names
    }
    mix = {
        n: {
            "available_tokens": per * 110,
            "tokens": per * 100,
            "documents": per,
            "domain": "code",
            "rate": 0.9,
            "copies": per,
        }
        for n in names
    }
    return {
        "counts": {"read": n_docs, "sources": counts, "dropped": {}, "duplicates": 0},
        "mix": {"target": {"code": 1}, "tokens": {"code": n_docs * 110}, "sources": mix},
        "recipe": {"sources": [{"name": n, "domain": "code"} for n in names]},
    }


def _jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _samples(out: Path, sources: int, reasons: int, texts: list[str]) -> int:
    """A samples/ folder as full as the defaults allow; its size in bytes."""
    rng = random.Random(0)

    def doc(i: int) -> dict[str, Any]:
        text = "\n".join(rng.choice(texts) for _ in range(4)).encode()[:MAX_BYTES]
        return {"id": f"doc-{i}", "text": text.decode(errors="ignore"), "cut": True, "bytes": 9999}

    folder = out / "samples"
    folder.mkdir()
    names = [f"source-{i:02d}" for i in range(sources)]
    drops = [
        {
            "source": n,
            "reason": f"reason_{r:02d}",
            **doc(k),
            "value": 1.5,
            "threshold": 1,
            "op": ">",
            "rule": "value 1.5 > 1",
        }  # fmt: skip
        for n in names
        for r in range(reasons)
        for k in range(K)
    ]
    kept = [
        {"source": n, "domain": "code", "language": f"lang{g}", "kind": "document", **doc(k)}
        for n in names
        for g in range(LANGUAGES)
        for k in range(K)
    ]
    near = [
        {
            "cluster": f"c{k}",
            "source": n,
            "size": 4,
            "kept": doc(k),
            "removed": [{**doc(k + j), "jaccard": 0.9} for j in range(3)],
        }  # fmt: skip
        for n in names
        for k in range(K)
    ]
    _jsonl(folder / "drops.jsonl", drops)
    _jsonl(folder / "kept.jsonl", kept)
    _jsonl(folder / "near_duplicates.jsonl", near)
    edges = [0] + [2**i for i in range(4, 25)]
    summary = {
        "format": "lemur-samples/1",
        "histograms": {"length": {"code": {"edges": edges, "counts": [1000] * (len(edges) - 1)}}},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    return sum(p.stat().st_size for p in folder.iterdir())


def synthesize(out: Path, args: argparse.Namespace) -> None:
    """A build folder of `args.documents` documents that `inspect` reads as any other."""
    texts = _texts()
    tok_path, tok = _tokenizer(out, texts)
    shards = _shards(out, args.documents, args.shards, tok, texts)
    manifest = {
        "format": "lemur-shards/1",
        "dtype": "uint16",
        "seq_len": 4096,
        "tokenizer": {
            "file": tok_path.name,
            "sha256": tok.sha256,
            "vocab_size": tok.vocab_size,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
        },
        "shards": shards,
        **_sections(args.documents, args.sources, args.reasons),
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    groups = [
        {
            "split": "train",
            "domain": "code",
            "source": f"source-{s:02d}",
            "language": f"lang{g}",
            "documents": 1000,
            "tokens": 100000,
        }  # fmt: skip
        for s in range(args.sources)
        for g in range(LANGUAGES)
    ]
    (out / "stats.json").write_text(json.dumps({"groups": groups}))
    size = _samples(out, args.sources, args.reasons, texts)
    print(f"synthesized {args.documents:,} documents in {args.shards} shards; samples {size:,} B")


def main() -> int:
    """Time `lemur-data inspect` and report the page's size."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--documents", type=int, default=10_000_000)
    p.add_argument("--shards", type=int, default=200)
    p.add_argument("--sources", type=int, default=20)
    p.add_argument("--reasons", type=int, default=15, help="drop reasons per source")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--build", help="time this existing build instead of a synthesized one")
    args = p.parse_args()
    from lemur.data.cli import main as lemur_data

    tmp = Path(tempfile.mkdtemp(prefix="lemur-bench-inspect-"))
    try:
        root = Path(args.build) if args.build else tmp / "build"
        if not args.build:
            root.mkdir()
            synthesize(root, args)
        page = tmp / "inspect.html"
        times, cpu = [], []
        for _ in range(args.repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            assert lemur_data(["inspect", str(root), "--out", str(page)]) == 0
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        size = page.stat().st_size
        print(
            f"inspect: page {size:,} B ({size / 2**20:.2f} MiB); wall {min(times):.2f} s, "
            f"CPU {min(cpu):.2f} s, best of {args.repeats} "
            f"(wall {', '.join(f'{t:.2f}' for t in times)}; the first imports the command)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

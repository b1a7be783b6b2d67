"""Benchmark: near-dedup quality of lemur and of datatrove's MinHash against exact Jaccard.

Real documents (pydoc help topics, /usr/share/doc text files, stdlib modules, 100 to 3,000
words) each get one planted copy: 10% exact, the others with a share of their words
replaced, deleted or inserted, drawn uniformly in [0, 8%], which spreads the pairs' exact
word-5-gram Jaccard over ~[0.5, 1]. Both sides see the same documents and the same
shingles (lemur's hashed, lowercased word 5-grams: datatrove's signature step is given them
in place of its own), and are scored against the exact Jaccard of those shingle sets:

  recall    : share of planted pairs whose two documents end in the same cluster, by
              Jaccard bin and over all pairs at J >= 0.75;
  precision : share of removed documents that have a partner at J >= 0.75 anywhere in the
              corpus (exact, through an inverted index of the shingles).

    python tools/bench_dedup_quality.py                       # lemur defaults vs datatrove
    python tools/bench_dedup_quality.py --lemur 16x8:0.75:0 32x4:0.75:1024 --docs 1500
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import sysconfig
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
BINS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 1.01]


def base_docs(n: int) -> list[str]:
    """n distinct real documents of 100 to 3,000 words (text and code, interleaved)."""
    from lemur.data.demo import doc_files, pydoc_topics

    text = [r["text"] for r in list(pydoc_topics()) + list(doc_files(40_000_000))]
    root = Path(sysconfig.get_paths()["stdlib"])
    code = []
    for p in sorted(root.rglob("*.py")):
        if "site-packages" in p.parts or "test" in p.parts or len(code) >= n:
            continue
        try:
            code.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    out, seen = [], set()
    for t in (x for pair in zip(text, code, strict=False) for x in pair):
        words = t.split()
        if len(words) >= 100 and (key := " ".join(words[:50])) not in seen:
            seen.add(key)
            out.append(" ".join(words[:3000]))
        if len(out) >= n:
            break
    return out


def planted_copy(text: str, rng: random.Random) -> str:
    """A copy with a share of its words replaced, deleted or inserted (10%: exact)."""
    if rng.random() < 0.1:
        return text
    words = text.split()
    rate = rng.uniform(0.0, 0.08)
    for i in sorted(rng.sample(range(len(words)), max(1, round(rate * len(words)))), reverse=True):
        op = rng.randrange(3)
        if op == 0:
            words[i] = f"w{rng.randrange(10**9)}"
        elif op == 1:
            del words[i]
        else:
            words.insert(i, f"w{rng.randrange(10**9)}")
    return " ".join(words)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique shingle arrays."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def best_partner(sets: list[np.ndarray], docs: np.ndarray) -> np.ndarray:
    """For each of `docs`, the highest exact Jaccard with any other document."""
    index: dict[int, list[int]] = {}
    for d, s in enumerate(sets):
        for h in s.tolist():
            index.setdefault(h, []).append(d)
    best = np.zeros(len(docs))
    for k, d in enumerate(docs.tolist()):
        shared = Counter(o for h in sets[d].tolist() for o in index[h] if o != d)
        for o, inter in shared.items():
            best[k] = max(best[k], inter / (len(sets[d]) + len(sets[o]) - inter))
    return best


def run_lemur(docs: list[str], cfg, tmp: Path) -> tuple[np.ndarray, np.ndarray]:
    """(cluster id, removed) per document, lemur's signer and tasks in this process."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_data_dedup import run_dedup

    res = run_dedup(docs, [0] * len(docs), cfg, tmp, n_tasks=2)
    return res.cluster, res.removed


def run_datatrove(docs: list[str], tmp: Path) -> tuple[np.ndarray, np.ndarray]:
    """(cluster id, removed) per document, datatrove's MinHash stages 1-3 at their defaults."""
    from datatrove.data import Document
    from datatrove.pipeline.dedup import (
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.dedup import minhash as dt_minhash
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    from lemur.data.dedup.signer import shingles

    class SameShingles(MinhashDedupSignature):
        def get_shingles(self, text: str) -> np.ndarray:
            return shingles(text, 5).reshape(-1, 1)

    # Its word tokenizer (spaCy) is never used with our shingles: don't load it.
    dt_minhash.load_word_tokenizer = lambda language: None

    cfg = MinhashConfig(n_grams=5)
    SameShingles(output_folder=str(tmp / "sigs"), config=cfg).run(
        (Document(text=d, id=str(i)) for i, d in enumerate(docs)), 0, 1
    )
    for b in range(cfg.num_buckets):
        MinhashDedupBuckets(str(tmp / "sigs"), str(tmp / "buckets"), config=cfg).run(
            None, b, cfg.num_buckets
        )
    MinhashDedupCluster(
        str(tmp / "buckets"), str(tmp / "out"), config=cfg, save_cluster_id=True
    ).run(None, 0, 1)
    cluster = np.arange(len(docs)) + len(docs)  # singletons: their own id
    removed = np.zeros(len(docs), bool)
    if (f := tmp / "out" / "000000.clusters").is_file():
        pairs = np.fromfile(f, "<u4").reshape(-1, 2)
        cluster[pairs[:, 0]] = pairs[:, 1]
    if (f := tmp / "out" / "000000.remove").is_file():
        removed[np.fromfile(f, "<u4")] = True
    return cluster, removed


def score(name, cluster, removed, pairs, jac, sets) -> dict:
    """Recall by Jaccard bin and at J >= 0.75, precision of the removals."""
    found = cluster[pairs[:, 0]] == cluster[pairs[:, 1]]
    row = {"side": name, "removed": int(removed.sum())}
    for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
        m = (jac >= lo) & (jac < hi)
        row[f"{lo:.2f}"] = (found[m].mean(), int(m.sum()))
    row["recall>=0.75"] = found[jac >= 0.75].mean()
    partner = best_partner(sets, np.flatnonzero(removed))
    row["precision"] = (partner >= 0.75).mean() if len(partner) else 1.0
    return row


def parse_layout(spec: str, base):
    """`32x4:0.75:1024` -> 32 bands of 4 rows, min_similarity 0.75, sketch_size 1024."""
    layout, sim, sketch = (spec.split(":") + ["", ""])[:3]
    bands, rows = (int(x) for x in layout.split("x"))
    return replace(
        base,
        bands=bands,
        rows=rows,
        min_similarity=float(sim or base.min_similarity),
        sketch_size=int(sketch or base.sketch_size),
    )


def main() -> int:
    """Build the planted corpus, run every side, print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=1500, help="real documents (each gets a copy)")
    ap.add_argument(
        "--lemur", nargs="*", default=[], help="extra configs BANDSxROWS[:SIM[:SKETCH]]"
    )
    ap.add_argument("--no-datatrove", action="store_true")
    args = ap.parse_args()
    from lemur.data.dedup.signer import shingles
    from lemur.data.recipe.recipe import DedupConfig

    rng = random.Random(0)
    base = base_docs(args.docs)
    docs = base + [planted_copy(t, rng) for t in base]
    sets = [shingles(d, 5) for d in docs]
    pairs = np.array([(i, len(base) + i) for i in range(len(base))])
    jac = np.array([jaccard(sets[a], sets[b]) for a, b in pairs])
    print(f"{len(docs)} documents, {len(pairs)} planted pairs", file=sys.stderr)
    rows = []
    default = DedupConfig()
    d = default
    configs = [(f"lemur {d.bands}x{d.rows}:{d.min_similarity}:{d.sketch_size}", d)]
    configs += [(f"lemur {s}", parse_layout(s, default)) for s in args.lemur]
    for name, cfg in configs:
        cluster, removed = run_lemur(docs, cfg, Path(tempfile.mkdtemp(prefix="dq-lemur-")))
        rows.append(score(name, cluster, removed, pairs, jac, sets))
        print(rows[-1], file=sys.stderr, flush=True)
    if not args.no_datatrove:
        cluster, removed = run_datatrove(docs, Path(tempfile.mkdtemp(prefix="dq-dt-")))
        rows.append(score("datatrove 14x8", cluster, removed, pairs, jac, sets))
    bins = [f"{lo:.2f}" for lo in BINS[:-1]]
    heads = [f"[{lo}, {hi if hi <= 1 else 1})" for lo, hi in zip(BINS[:-1], BINS[1:], strict=True)]
    print("| side | " + " | ".join(heads) + " | recall J>=0.75 | precision | removed |")
    print("|---|" + "---|" * (len(bins) + 3))
    print("| planted pairs | " + " | ".join(str(rows[0][b][1]) for b in bins) + " | | | |")
    for r in rows:
        cells = " | ".join(f"{r[b][0]:.1%}" for b in bins)
        print(
            f"| {r['side']} | {cells} | {r['recall>=0.75']:.1%} | {r['precision']:.1%} "
            f"| {r['removed']:,} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

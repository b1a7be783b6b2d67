"""Drop rates and speed of each text filter alone, lemur's and datatrove's, on real text.

The text is the demo's (English man pages, /usr/share/doc files, pydoc topics), gathered
with `lemur.data.demo` into --work. Prints the table in docs/filters.md, plus the
newlines-per-word distribution that motivates the FineWeb `new_line_ratio` default.
datatrove's filters need spaCy (`pip install -e '.[bench]'`).

`--classifier` instead compares the quality classifier stage (lemur.data.filter.classifier)
with datatrove's `FastTextClassifierFilter` (model_url = a local path), the same fastText
model on the same documents, in one run: CPU seconds per core of each, side by side and
alternated over `--rounds`, and whether every score and decision is the same. The model is
trained here (DCLM's settings: dim 100, bigrams, 5 epochs; `--bucket` rows of n-gram hashes)
on the demo's help topics (positive) against its /usr/share/doc files (negative).

    python tools/bench_filters.py
    python tools/bench_filters.py --classifier
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import zstandard
from datatrove.data import Document

from lemur.data.demo import materialize_text
from lemur.data.filter.text import (
    C4Filter,
    FineWebFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from lemur.data.recipe.filters import (
    C4Config,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
)

KINDS = ("man", "doc", "pydoc")


def load(work: Path) -> list[Document]:
    """The demo's text documents, tagged with their kind (id prefix)."""
    path = materialize_text(work)
    with zstandard.ZstdDecompressor().stream_reader(open(path, "rb")) as r:
        rows = [orjson.loads(line) for line in io.BufferedReader(r)]
    return [
        Document(text=d["text"], id=d["id"], metadata={"domain": "text", "source": "demo"})
        for d in rows
    ]


def copies(docs: list[Document]) -> list[Document]:
    """Fresh documents: filters write metadata (and datatrove's fastText filter the text)."""
    return [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs]


def train_bench_model(docs: list[Document], work: Path, bucket: int) -> Path:
    """A DCLM-settings classifier: help topics (`__label__hq`) against doc files (`cc`)."""
    from lemur.data.filter.classifier_train import TrainSettings, fit, split

    settings = TrainSettings(bucket=bucket)
    pos = split([d.text for d in docs if d.id.startswith("pydoc/")], settings, "p")
    neg = split([d.text for d in docs if d.id.startswith("doc/")], settings, "n")
    out = work / f"bench-classifier-{bucket}.bin"
    fit(pos.train + pos.valid, neg.train + neg.valid, settings, out)
    return out


def bench_classifier(docs: list[Document], work: Path, bucket: int, rounds: int) -> int:
    """lemur's classifier stage against datatrove's FastTextClassifierFilter: CPU time per
    core and identical scores, on the same model and documents."""
    model = train_bench_model(docs, work, bucket)
    print(f"model {model.name} ({model.stat().st_size / 1e6:.0f} MB)")
    # Whole documents (7 kB on average), then their paragraphs (web-page-sized texts).
    paragraphs = [
        Document(text=p, id=f"{d.id}#{i}", metadata=dict(d.metadata))
        for d in docs
        for i, p in enumerate(d.text.split("\n\n"))
        if len(p.split()) >= 20
    ]
    ok = True
    for name, texts in (("documents", docs), ("paragraphs", paragraphs)):
        print(f"\n### {name}")
        ok &= compare_classifiers(texts, model, rounds)
    return 0 if ok else 1


def compare_classifiers(docs: list[Document], model: Path, rounds: int) -> bool:
    """One side-by-side run of both filters over `docs`; True when all scores agree."""
    import tempfile

    from datatrove.pipeline.filters import FastTextClassifierFilter

    from lemur.data.filter.classifier import ClassifierFilter, open_model
    from lemur.data.recipe.classifier import ClassifierConfig

    config = ClassifierConfig(name="hq", model=str(model), label="hq", min_score=0.5)
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    secs: dict[str, list[float]] = {"lemur": [], "datatrove": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as cache:  # no score cached from a round before
            ours = ClassifierFilter(config, ["demo"], {}, cache_dir=cache)
            theirs = FastTextClassifierFilter(
                str(model), keep_labels=("hq", 0.5), newline_replacement=" "
            )
            # Load each model outside the timing (lemur's loads once per process).
            open_model(str(model), config.fasttext_label)
            list(theirs.run(iter(copies(docs[:20]))))
            for name, f in (("lemur", ours), ("datatrove", theirs)):
                fresh = copies(docs)
                t0 = time.process_time()
                kept = list(f.run(iter(fresh)))
                secs[name].append(time.process_time() - t0)
                if name == "lemur":
                    ours_docs, ours_kept = fresh, {d.id for d in kept}
                else:
                    theirs_docs, theirs_kept = fresh, {d.id for d in kept}
    differ = sum(
        a.metadata["quality"]["hq"] != b.metadata["__label__hq"]
        for a, b in zip(ours_docs, theirs_docs, strict=True)
    )
    best = {k: min(v) for k, v in secs.items()}
    print(f"{len(docs):,} texts, {mb:.1f} MB")
    print("\n| filter | CPU s (best of rounds) | docs/s per core | MB/s per core |")
    print("|---|---|---|---|")
    for name, t in best.items():
        print(f"| {name} | {t:.3f} | {len(docs) / t:,.0f} | {mb / t:.2f} |")
    print(f"\nlemur / datatrove throughput: {best['datatrove'] / best['lemur']:.2f}x")
    print(
        f"scores that differ: {differ} of {len(docs)}; kept sets equal: {ours_kept == theirs_kept}"
    )
    return differ == 0 and ours_kept == theirs_kept


def main() -> int:
    """Run every filter alone over the demo text and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", default="/tmp/lemur-bench-filters")
    ap.add_argument("--skip-datatrove", action="store_true")
    ap.add_argument("--classifier", action="store_true", help="bench the classifier stage")
    ap.add_argument("--bucket", type=int, default=2_000_000, help="the model's n-gram rows")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    docs = load(Path(args.work))
    if args.classifier:
        return bench_classifier(docs, Path(args.work), args.bucket, args.rounds)
    mb = sum(len(d.text.encode()) for d in docs) / 1e6
    totals = Counter(d.id.split("/")[0] for d in docs)
    filters = [
        ("lemur gopher quality", GopherQualityFilter(GopherQualityConfig())),
        ("lemur gopher repetition", GopherRepetitionFilter(GopherRepetitionConfig())),
        ("lemur c4", C4Filter(C4Config())),
        ("lemur fineweb", FineWebFilter(FineWebConfig())),
    ]
    if not args.skip_datatrove:
        from datatrove.pipeline import filters as dt

        filters += [
            ("datatrove GopherQualityFilter", dt.GopherQualityFilter()),
            ("datatrove GopherRepetitionFilter", dt.GopherRepetitionFilter()),
            (
                "datatrove C4QualityFilter (no line removal)",
                dt.C4QualityFilter(filter_no_terminal_punct=False),
            ),
            ("datatrove FineWebQualityFilter", dt.FineWebQualityFilter()),
        ]
    print(f"{len(docs):,} documents, {mb:.1f} MB: " + ", ".join(f"{k} {totals[k]}" for k in KINDS))
    print(
        "\n| filter | man pages dropped | doc files dropped | pydoc topics dropped | MB/s | top reasons |"
    )
    print("|---|---|---|---|---|---|")
    for name, f in filters:
        dropped: Counter = Counter()
        reasons: Counter = Counter()
        # fresh copies: datatrove's C4 filter rewrites document text in place
        fresh = [Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs]
        t0 = time.process_time()
        for d in fresh:
            res = f.filter(d)
            if res is not True:
                dropped[d.id.split("/")[0]] += 1
                reasons[res[1] if isinstance(res, tuple) else "dropped"] += 1
        secs = time.process_time() - t0
        cells = " | ".join(f"{dropped[k]}/{totals[k]}" for k in KINDS)
        top = ", ".join(f"{r} {n}" for r, n in reasons.most_common(3))
        print(f"| {name} | {cells} | {mb / secs:.2f} | {top} |")
    print("\nnewlines per word (percentiles 50/80/90/95/98):")
    for kind in KINDS:
        ratios = [
            d.text.count("\n") / len(d.text.split())
            for d in docs
            if d.id.startswith(kind + "/") and d.text.split()
        ]
        print(
            f"  {kind}: "
            + " ".join(f"{v:.2f}" for v in np.percentile(ratios, [50, 80, 90, 95, 98]))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

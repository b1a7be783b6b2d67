"""Drop rates and speed of each text filter alone, lemur's and datatrove's, on real text.

The text is the demo's (English man pages, /usr/share/doc files, pydoc topics), gathered
with `lemur.data.demo` into --work. Prints the table in docs/filters.md, plus the
newlines-per-word distribution that motivates the FineWeb `new_line_ratio` default.
datatrove's filters need spaCy (`pip install -e '.[bench]'`).

    python tools/bench_filters.py
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
from lemur.data.recipe import C4Config, FineWebConfig, GopherQualityConfig, GopherRepetitionConfig

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


def main() -> int:
    """Run every filter alone over the demo text and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", default="/tmp/lemur-bench-filters")
    ap.add_argument("--skip-datatrove", action="store_true")
    args = ap.parse_args()
    docs = load(Path(args.work))
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

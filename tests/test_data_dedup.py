"""Deduplication: planted exact and near copies against exact Jaccard ground truth."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl
from datatrove.data import Document

from lemur.data.build import build
from lemur.data.dedup.cluster import connected_roots, find_duplicates
from lemur.data.dedup.signer import DedupSigner, normalized_hash, shingles
from lemur.data.load import recipe_from_dict
from lemur.data.recipe import DedupConfig


def jaccard(a: str, b: str, n: int = 5) -> float:
    """Exact word n-gram Jaccard, computed independently of lemur's hashing."""

    def grams(t: str) -> set[tuple[str, ...]]:
        w = re.findall(r"\w+", t.lower())
        return {tuple(w[i : i + n]) for i in range(max(1, len(w) - n + 1))}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def edit_words(text: str, rate: float, rng: random.Random) -> str:
    """Replace a `rate` share of the words with fresh ones."""
    words = text.split(" ")
    for i in rng.sample(range(len(words)), max(1, int(rate * len(words)))):
        words[i] = f"edited{rng.randrange(10**9)}"
    return " ".join(words)


def run_dedup(docs: list[str], sources: list[int], cfg: DedupConfig, tmp: Path):
    """Sign documents in two tasks and find duplicates; return the result."""
    task = np.array([i % 2 for i in range(len(docs))])
    local = np.zeros(len(docs), np.int64)
    for t in (0, 1):
        idx = np.flatnonzero(task == t)
        local[idx] = np.arange(len(idx))
        signer = DedupSigner(cfg, str(tmp))
        list(signer.run(iter(Document(text=docs[i], id=str(i)) for i in idx), rank=t))
    lengths = np.array([len(d) for d in docs])
    priority = np.lexsort((np.arange(len(docs)), -lengths, np.array(sources)))
    rank = np.empty(len(docs), np.int64)
    rank[priority] = np.arange(len(docs))
    return find_duplicates(tmp, 2, task, local, np.zeros(len(docs), np.int64), rank, cfg)


def corpus() -> list[str]:
    """Real documents: Python help topics and stdlib modules of >= 200 words."""
    texts = [d["text"] for d in real_text_docs(79)] + [p.read_text() for p in real_python_files(80)]
    return [t for t in texts if len(t.split()) >= 200]


def test_planted_duplicates_recall_and_precision(tmp_path):
    rng = random.Random(0)
    originals = corpus()
    docs, sources, twin = list(originals), [0] * len(originals), {}
    for i, t in enumerate(originals):
        kind = i % 3
        copy = t if kind == 0 else edit_words(t, 0.01 if kind == 1 else 0.012, rng)
        twin[len(docs)] = i
        docs.append(copy)
        sources.append(1)
    res = run_dedup(docs, sources, DedupConfig(), tmp_path)
    truth = {j: jaccard(docs[i], docs[j]) for j, i in twin.items()}
    near = [j for j, jac in truth.items() if jac >= 0.85]
    assert len(near) >= 40
    recall = np.mean([res.removed[j] for j in near])
    assert recall >= 0.95, recall
    # the first source's copy is the one kept, and exact copies are counted as exact
    assert not res.removed[: len(originals)].any()
    exact = [j for j, i in twin.items() if docs[j] == docs[i]]
    assert res.removed_exact[exact].all() and not res.removed_near[exact].any()
    assert all(res.cluster[j] == twin[j] for j in near if res.removed[j])


def test_distinct_documents_are_never_removed(tmp_path):
    docs = corpus()
    pairs = [(i, j) for i in range(len(docs)) for j in range(i + 1, len(docs))]
    res = run_dedup(docs, [0] * len(docs), DedupConfig(), tmp_path)
    # every removed document must have a partner at Jaccard >= 0.5 (none are planted here)
    for k in np.flatnonzero(res.removed):
        best = max(jaccard(docs[k], docs[m]) for m in range(len(docs)) if m != k)
        assert best >= 0.5, (k, best)
    assert len(pairs) > 1000


def test_detection_curve_falls_with_edit_rate(tmp_path):
    rng = random.Random(1)
    originals = corpus()[:40]
    rates = {}
    for rate in (0.005, 0.05, 0.2):
        docs = originals + [edit_words(t, rate, rng) for t in originals]
        sub = tmp_path / str(rate)
        sub.mkdir()
        res = run_dedup(docs, [0] * 40 + [1] * 40, DedupConfig(), sub)
        rates[rate] = res.removed[40:].mean()
    assert rates[0.005] >= 0.95 and rates[0.2] <= 0.05 and rates[0.005] >= rates[0.05] >= rates[0.2]


def test_hashing_building_blocks():
    assert normalized_hash("a  \r\nb\n\n") == normalized_hash("a\nb")
    assert normalized_hash("a b") != normalized_hash("a  b")
    assert len(shingles("one two three four five six", 5)) == 2
    assert len(shingles("short text", 5)) == 1 and len(shingles("", 5)) == 0
    roots = connected_roots(6, np.array([5, 1, 3]), np.array([4, 2, 4]))
    assert roots.tolist() == [0, 1, 1, 3, 3, 3]


def test_build_keeps_one_copy_across_sources(tmp_path):
    docs = [d for d in real_text_docs(79) if len(d["text"].split()) >= 300][:30]
    write_jsonl(tmp_path / "a.jsonl", docs[:20])
    rng = random.Random(2)
    second = [{"id": f"copy{i}", "text": docs[i]["text"]} for i in range(5)]
    second += [
        {"id": f"near{i}", "text": edit_words(docs[i]["text"], 0.01, rng)} for i in range(5, 10)
    ]
    assert all(jaccard(docs[i]["text"], second[i]["text"]) >= 0.85 for i in range(5, 10))
    second += docs[20:]
    write_jsonl(tmp_path / "b.jsonl", second)
    raw = {
        "output": str(tmp_path / "out"),
        "val_fraction": 0.0,
        "filters": NO_FILTERS,
        "tokenizer": {"train": {"vocab_size": 500}},
        "mix": {"ratio": {"text": 1}},
        "executor": {"tasks": 2, "workers": 1},
        "dedup": {"write_duplicates": True},
        "sources": [
            {
                "name": "first",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "a.jsonl")],
            },
            {
                "name": "second",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "b.jsonl")],
            },
        ],
    }
    m = build(recipe_from_dict(raw))
    d = m["counts"]["dedup"]
    assert d["by_source"] == {"first": {"exact": 0, "near": 0}, "second": {"exact": 5, "near": 5}}
    assert m["counts"]["duplicates"] == 10 and d["cluster_sizes"] == {"2": 10}
    assert m["mix"]["sources"]["first"]["documents"] == 20
    assert m["mix"]["sources"]["second"]["documents"] == 10
    rows = [json.loads(x) for x in open(tmp_path / "out" / d["file"])]
    assert sorted(r["id"] for r in rows) == sorted(
        [f"second/copy{i}" for i in range(5)] + [f"second/near{i}" for i in range(5, 10)]
    )
    by_id = {r["id"]: r for r in rows}
    assert (
        by_id["second/copy0"]["kept_id"] == f"first/{docs[0]['id']}"
        and by_id["second/copy0"]["kind"] == "exact"
    )
    assert by_id["second/near5"]["text"] == second[5]["text"]

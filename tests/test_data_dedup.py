"""Deduplication: planted exact and near copies against exact Jaccard ground truth."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl
from datatrove.data import Document

from lemur.data.build import build
from lemur.data.dedup import buckets
from lemur.data.dedup.buckets import Verifier
from lemur.data.dedup.cluster import DedupResult, connected_roots
from lemur.data.dedup.merge import BigGroup, chunk_entries, merge_runs
from lemur.data.dedup.runs import GOLDEN64, RUN
from lemur.data.dedup.signer import (
    DedupSigner,
    combine_ngrams,
    minhash,
    normalized_hash,
    permutations,
    shingles,
    words_of,
)
from lemur.data.dedup.sketch import NONE, bottom_k, sketch_jaccard
from lemur.data.dedup.stage import dedup_result, dedup_stages
from lemur.data.recipe.recipe import DedupConfig
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.run.task import run_here
from lemur.data.runs.format import DOC_RECORD
from lemur.shards.format import open_array


def run_in_process(config: DedupConfig, tok_dir: Path, n_tasks: int, ddir: Path) -> DedupResult:
    """Every dedup task run in this process, one after the other; the stage's decisions."""
    for stage, step, tasks in dedup_stages(config, tok_dir, n_tasks, ddir):
        run_here([step], ddir / stage, tasks, stage)
    return dedup_result(tok_dir, n_tasks, ddir)


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


def sign(docs: list[str], sources: list[int], cfg: DedupConfig, tmp: Path, n_tasks: int = 2):
    """Sign documents round-robin over tasks, writing the records the tasks would write.

    Records carry the text length as `tokens` and the document's index as `id_hash`, so the
    keep order is: first source, then longest, then first listed.
    """
    task = np.arange(len(docs)) % n_tasks
    local = np.zeros(len(docs), np.int64)
    for t in range(n_tasks):
        idx = np.flatnonzero(task == t)
        local[idx] = np.arange(len(idx))
        signer = DedupSigner(cfg, str(tmp))
        list(signer.run(iter(Document(text=docs[i], id=str(i)) for i in idx), rank=t))
        rec = np.zeros(len(idx), DOC_RECORD)
        rec["source"] = np.asarray(sources)[idx]
        rec["tokens"] = [len(docs[i]) for i in idx]
        rec["id_hash"] = idx
        np.save(tmp / f"{t:05d}.docs.npy", rec)
    return task, local


def run_dedup(docs: list[str], sources: list[int], cfg: DedupConfig, tmp: Path, n_tasks: int = 2):
    """Sign documents in `n_tasks` tasks and run the dedup tasks; return the result by doc."""
    task, _ = sign(docs, sources, cfg, tmp, n_tasks)
    res = run_in_process(cfg, tmp, n_tasks, tmp / "dedup")
    doc = np.argsort(task, kind="stable")  # record (task-major) -> document index
    out = DedupResult(
        *(np.empty_like(a) for a in (res.removed_exact, res.removed_near, res.cluster)),
        res.candidate_pairs,
        res.verified_pairs,
    )
    out.removed_exact[doc], out.removed_near[doc] = res.removed_exact, res.removed_near
    out.cluster[doc] = doc[res.cluster]
    return out


def load_signatures(sig_dir: Path, rank: int, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """Memory-mapped (content hashes, MinHash signatures) of one task."""
    chash = open_array(Path(sig_dir) / f"{rank:05d}.chash.bin", np.uint64)
    sig = open_array(Path(sig_dir) / f"{rank:05d}.minhash.bin", np.uint32, (num_perm,))
    return chash, sig


def reference_dedup(docs, sources, cfg: DedupConfig, tmp: Path, n_tasks: int = 2) -> DedupResult:
    """The former single-process cluster stage: every band's keys of the corpus in memory."""
    task, local = sign(docs, sources, cfg, tmp, n_tasks)
    n = len(docs)
    order = np.lexsort((np.arange(n), -np.array([len(d) for d in docs]), np.array(sources)))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)
    loaded = [load_signatures(tmp, t, cfg.num_perm) for t in range(n_tasks)]
    verify = Verifier(tmp, n_tasks, cfg)  # the same decision for a pair on both sides
    chash = np.array([loaded[t][0][j] for t, j in zip(task, local, strict=True)], np.uint64)
    sig = np.array([loaded[t][1][j] for t, j in zip(task, local, strict=True)], np.uint64)
    with np.errstate(over="ignore"):
        exact_key = chash ^ np.uint64(0x632BE59BD9B4E019)
        edges, stars = [], lambda k: _stars(k, rank)
        a, b = stars(exact_key)
        edges.append((a, b))
        removed_exact = np.zeros(n, bool)
        removed_exact[order[b]] = True
        candidates = verified = 0
        for band in range(cfg.bands):
            h = np.full(n, 1, np.uint64)
            for c in range(cfg.rows):
                h = (h ^ sig[:, band * cfg.rows + c]) * GOLDEN64 + np.uint64(c + 1)
            a, b = stars(h)
            keep = verify.keep(task[order[a]], local[order[a]], task[order[b]], local[order[b]])
            candidates, verified = candidates + len(a), verified + int(keep.sum())
            edges.append((a[keep], b[keep]))
    roots = connected_roots(n, *(np.concatenate(x) for x in zip(*edges, strict=True)))
    cluster = np.empty(n, np.int64)
    cluster[order] = order[roots]
    removed = np.zeros(n, bool)
    removed[order] = roots != np.arange(n)
    return DedupResult(removed_exact, removed & ~removed_exact, cluster, candidates, verified)


def _stars(keys: np.ndarray, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edges (rank space) joining each bucket's members to its first member."""
    by_rank = np.empty_like(keys)
    by_rank[rank] = keys
    order = np.lexsort((np.arange(len(by_rank)), by_rank))
    sk = by_rank[order]
    same = np.concatenate(([False], sk[1:] == sk[:-1]))
    run_start = np.maximum.accumulate(np.where(~same, np.arange(len(sk)), 0))
    return order[run_start[same]], order[same]


def assert_same(res: DedupResult, ref: DedupResult) -> None:
    """Every decision and count equal."""
    for f in ("removed_exact", "removed_near", "cluster"):
        np.testing.assert_array_equal(getattr(res, f), getattr(ref, f), err_msg=f)
    assert (res.candidate_pairs, res.verified_pairs) == (ref.candidate_pairs, ref.verified_pairs)


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


def test_words_and_signatures_match_their_definitions():
    """The fast paths (ASCII words by translate + split, the min before the shift) give what
    the definitions give: `\\w+` words, the n-gram hashes of each word's xxh3, and the min
    over shingles of ((x ^ k) * m) >> 32 per permutation."""
    import xxhash

    every_ascii = "".join(map(chr, range(128))) * 2  # \x1c-\x1f: whitespace to str.split
    texts = [p.read_text(encoding="utf-8") for p in real_python_files(20)]
    texts += [d["text"] for d in real_text_docs(20)]
    texts += [
        every_ascii,
        "naïve café\u00a0x_1 über\u2028end",
        "ÅNGSTRÖM_2 ı İ",
        "",
        "_",
        " \t\x1f",
    ]
    keys, mults = permutations(25, 7)
    for text in texts:
        assert words_of(text) == re.findall(r"\w+", text)
        words = re.findall(r"\w+", text.lower())
        sh = shingles(text, 5)
        if not words:
            assert len(sh) == 0
            continue
        h = np.array([xxhash.xxh3_64_intdigest(w) for w in words], np.uint64)
        assert np.array_equal(sh, np.unique(combine_ngrams(h, min(5, len(h)))))
        with np.errstate(over="ignore"):
            full = ((sh[:, None] ^ keys[None, :]) * mults[None, :]) >> np.uint64(32)
        assert np.array_equal(minhash(sh, keys, mults), full.min(axis=0).astype(np.uint32))


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
    # the bucket and cluster stages ran as executor tasks: datatrove's completion markers
    # and task logs, one per bucket task (exact + 25 bands) and one for the cluster task
    (ddir,) = (tmp_path / "out" / ".work").glob("tokens-*/dedup-*")
    for stage, tasks in (("buckets", 26), ("cluster", 1)):
        logs = ddir / stage / "logs"
        assert sorted(p.name for p in (logs / "completions").iterdir()) == [
            f"{r:05d}" for r in range(tasks)
        ]
        assert len(list((logs / "logs").glob("task_*.log"))) == tasks
    # a killed bucket task (no marker, no output) reruns alone; the shards stay identical
    shards = {p: p.read_bytes() for p in (tmp_path / "out").glob("build-*/**/*.bin")}
    victim = ddir / "buckets" / "pairs" / "00003.pairs"
    pairs = victim.read_bytes()
    others = {p: p.stat().st_mtime_ns for p in victim.parent.glob("*.pairs") if p != victim}
    victim.unlink()
    (ddir / "buckets" / "logs" / "completions" / "00003").unlink()
    shutil.rmtree(ddir / "cluster")
    assert build(recipe_from_dict(raw), force=True)["counts"]["dedup"] == d
    assert victim.read_bytes() == pairs
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert {p: p.read_bytes() for p in shards} == shards


def test_tasks_match_the_single_process_reference(tmp_path):
    rng = random.Random(5)
    originals = corpus()[:60]
    docs = originals + [
        t if i % 4 == 0 else edit_words(t, 0.01 * (i % 5), rng) for i, t in enumerate(originals)
    ]
    # groups bigger than a merge buffer (16 entries per run with 0.001 MB): exact and near
    docs += [originals[3]] * 60 + [edit_words(originals[7], 0.005, rng) for _ in range(60)]
    sources = [0] * 60 + [1] * (len(docs) - 60)
    for n_tasks, cfg in (
        (2, DedupConfig()),
        (3, DedupConfig(bucket_tasks=48, merge_buffer_mb=0.001)),
    ):
        sub = tmp_path / f"t{n_tasks}"
        sub.mkdir()
        ref_dir = tmp_path / f"ref{n_tasks}"
        ref_dir.mkdir()
        res = run_dedup(docs, sources, cfg, sub, n_tasks)
        assert res.removed.sum() >= 150
        assert_same(res, reference_dedup(docs, sources, cfg, ref_dir, n_tasks))


class CountingRun:
    """A run that records the length of every slice read from it (to check buffer bounds)."""

    def __init__(self, arr: np.ndarray, reads: list[int], field: str | None = None):
        self.arr, self.reads, self.field = arr, reads, field

    def __len__(self) -> int:
        return len(self.arr)

    def __getitem__(self, item):
        if isinstance(item, str):
            return CountingRun(self.arr, self.reads, item)
        self.reads.append(item.stop - item.start)
        part = self.arr[item]
        return part[self.field] if self.field else part


def test_k_way_merge_with_duplicates_across_tasks_and_empty_tasks():
    rng = np.random.default_rng(0)
    runs = []
    for size in (0, 500, 37, 0, 1200):
        run = np.zeros(size, RUN)
        keys = rng.integers(0, 40, size).astype(np.uint64)  # many equal keys in every run
        keys[: size // 3] = 7  # one key bigger than any buffer
        order = np.argsort(keys, kind="stable")
        run["key"], run["local"] = keys[order], order
        runs.append(run)
    reads: list[int] = []
    chunk = 16
    wrapped = [CountingRun(r, reads) for r in runs]
    got, seen, big = [], set(), 0
    for item in merge_runs(wrapped, [0] * 5, [len(r) for r in runs], chunk):
        if isinstance(item, BigGroup):
            big += 1
            rows = [(item.key, t, int(x)) for t, s, e in item.spans for x in runs[t]["local"][s:e]]
        else:
            rows = list(
                zip(item.key.tolist(), item.task.tolist(), item.local.tolist(), strict=True)
            )
        keys = {k for k, _, _ in rows}
        assert not keys & seen  # every group comes out whole, once
        seen |= keys
        got += rows
    want = sorted((int(k), t, int(x)) for t, r in enumerate(runs) for k, x in r.tolist())
    assert got == want and big >= 1
    assert reads and max(reads) <= chunk  # never more than one chunk of a run at a time
    assert chunk_entries(2**20, 4) == 2**20 // (128 * 4)


def test_big_groups_and_key_ranges_match_the_reference(tmp_path, monkeypatch):
    calls = []
    real = buckets.big_group_pairs
    monkeypatch.setattr(buckets, "big_group_pairs", lambda *a: calls.append(1) or real(*a))
    rng = random.Random(6)
    originals = corpus()[:30]
    docs = (
        originals + [originals[3]] * 80 + [edit_words(originals[7], 0.005, rng) for _ in range(80)]
    )
    sources = [0] * 30 + [1] * 160
    cfg = DedupConfig(bucket_tasks=32, merge_buffer_mb=0.001)
    res = run_dedup(docs, sources, cfg, tmp_path / "tasks", 3)
    assert calls and res.removed_exact.sum() == 80 and res.removed_near.sum() >= 70
    assert_same(res, reference_dedup(docs, sources, cfg, tmp_path / "ref", 3))


def test_killed_bucket_task_reruns_to_the_same_output(tmp_path):
    originals = corpus()[:30]
    docs = originals + [edit_words(t, 0.01, random.Random(i)) for i, t in enumerate(originals)]
    cfg = DedupConfig()
    sign(docs, [0] * 30 + [1] * 30, cfg, tmp_path, 2)
    first = run_in_process(cfg, tmp_path, 2, tmp_path / "a")
    pairs = tmp_path / "a" / "buckets" / "pairs"
    victim = pairs / "00005.pairs"
    before = victim.read_bytes()
    kept = {p: p.stat().st_mtime_ns for p in pairs.glob("*.pairs") if p != victim}
    victim.unlink()  # killed before its rename: a half-written temporary file is left
    (pairs / ".00005.pairs.tmp-99999").write_bytes(b"partial")
    shutil.rmtree(tmp_path / "a" / "cluster")
    again = run_in_process(cfg, tmp_path, 2, tmp_path / "a")
    assert victim.read_bytes() == before and first.removed.sum() >= 25
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished tasks were not redone
    assert_same(again, first)


def test_sketch_jaccard_is_exact_for_short_documents_and_close_for_long_ones():
    rng = random.Random(7)
    texts = corpus()
    short = [t for t in texts if len(shingles(t, 5)) < 300][:10]
    long = [t for t in texts if len(shingles(t, 5)) > 3000][:10]
    assert len(short) == 10 and len(long) == 10
    for group, k, tol in ((short, 500, 1e-12), (long, 1024, 0.06)):
        a = [bottom_k(shingles(t, 5), k) for t in group]
        copies = [edit_words(t, rng.uniform(0.005, 0.05), rng) for t in group]
        b = [bottom_k(shingles(t, 5), k) for t in copies]
        w = max(len(x) for x in a + b)
        pa, pb = (
            np.array([np.pad(x, (0, w - len(x)), constant_values=NONE) for x in xs])
            for xs in (a, b)
        )
        est = sketch_jaccard(
            pa, pb, np.array([len(x) for x in a]), np.array([len(x) for x in b]), k
        )
        exact = [jaccard(x, y) for x, y in zip(group, copies, strict=True)]
        assert np.abs(est - exact).max() <= tol, (est, exact)
    # a long document's sketch is its k smallest hashes, sorted and distinct
    s = bottom_k(shingles(long[0], 5), 1024)
    assert len(s) == 1024 and (np.diff(s.astype(np.int64)) > 0).all()

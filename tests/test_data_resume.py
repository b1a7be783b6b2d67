"""Killed builds resume without redoing finished work and give byte-identical shards;
the achieved mix meets the plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import real_python_files, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.dedup.cluster import SUMMARY
from lemur.data.dedup.stage import bucket_tasks
from lemur.data.demo import DEMO_TEXT_FILTERS
from lemur.data.recipe.recipe import DedupConfig
from lemur.data.recipe_loader import recipe_from_dict

# Runs a build in a child process that SIGKILLs itself when the build reports `stage`
# at progress >= `at`: a real kill at a precise point, with no hook in lemur itself.
KILLER = """
import os, signal, sys
from lemur.data.encode import step as tokenizer
from lemur.data.build import build
from lemur.data.recipe_loader import load_recipe
stage, at = sys.argv[2], int(sys.argv[3])
def report(s, done, total):
    if s == stage and done >= at:
        os.kill(os.getpid(), signal.SIGKILL)
if stage == "task":  # die as task `at` finishes writing, before its completion marker
    original = tokenizer.TokenizeWriter.run
    def run(self, data, rank=0, world_size=1):
        yield from original(self, data, rank, world_size)
        if rank == at:
            os.kill(os.getpid(), signal.SIGKILL)
    tokenizer.TokenizeWriter.run = run
if stage in ("scatter", "gather"):  # die as pack task `at` has written its files
    from lemur.data.pack import steps
    original_task = getattr(steps, f"{stage}_task")
    def task(rank, *args):
        original_task(rank, *args)
        if rank == at:
            os.kill(os.getpid(), signal.SIGKILL)
    setattr(steps, f"{stage}_task", task)
if stage == "buckets":  # die as bucket task `at` has named its pairs file, before its marker
    from lemur.data.dedup import stage as dedup_stage
    original_bucket = dedup_stage.bucket_task
    def bucket(*args):
        original_bucket(*args)
        if args[-1] == at:  # the rank
            os.kill(os.getpid(), signal.SIGKILL)
    dedup_stage.bucket_task = bucket
if stage == "buckets-mid":  # die inside bucket task `at`: its pairs still a temp file
    from lemur.data.dedup import buckets
    original_counts = buckets.atomic_write_bytes
    def counts(path, data):
        if path.name == f"{at:05d}.json":
            os.kill(os.getpid(), signal.SIGKILL)
        original_counts(path, data)
    buckets.atomic_write_bytes = counts
if stage == "cluster":  # die inside the cluster task, once it wrote task `at`'s removals
    from lemur.data.dedup import cluster
    original_removed = cluster.atomic_write_bytes
    def removed(path, data):
        original_removed(path, data)
        if path.name == f"{at:05d}.removed":
            os.kill(os.getpid(), signal.SIGKILL)
    cluster.atomic_write_bytes = removed
build(load_recipe(sys.argv[1]), report=report)
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("src")
    (root / "code").mkdir()
    for p in real_python_files(60):
        (root / "code" / p.name).write_bytes(p.read_bytes())
    paragraphs = []
    for d in real_text_docs(79):
        for k, para in enumerate(d["text"].split("\n\n")):
            if len(para.split()) >= 60:
                paragraphs.append({"id": f"{d['id']}/{k}", "text": para})
    write_jsonl(root / "text.jsonl", paragraphs)
    return root


def recipe(src: Path, out: Path, **kw) -> dict:
    raw = {
        "output": str(out),
        "seed": 3,
        "val_fraction": 0.02,
        "shard_tokens": 20_000,
        "tokenizer": {"train": {"vocab_size": 600, "sample_bytes": 300_000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "executor": {"tasks": 4, "workers": 1},
        # help-topic prose: the reference (web-tuned) C4 rules would drop it all
        "filters": {"text": DEMO_TEXT_FILTERS},
        "sources": [
            {"name": "py", "domain": "code", "format": "files", "paths": [str(src / "code")]},
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(src / "text.jsonl")],
            },
        ],
    }
    raw.update(kw)
    return raw


def shard_bytes(out: Path) -> dict[str, bytes]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {s["file"]: (out / s["file"]).read_bytes() for s in manifest["shards"]}


def mtimes(paths) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in paths}


@pytest.fixture(scope="module")
def clean(sources, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("clean") / "out"
    build(recipe_from_dict(recipe(sources, out)))
    return out


def killed_build(sources: Path, tmp_path: Path, stage: str, at: int) -> Path:
    """Run a build in a child process that KILLER SIGKILLs at (`stage`, `at`); its output."""
    out = tmp_path / "out"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(sources, out)))
    log = tmp_path / "killed.log"
    with open(log, "w") as fh:
        res = subprocess.run(
            [sys.executable, "-c", KILLER, str(path), stage, str(at)], stdout=fh, stderr=fh
        )
    assert res.returncode == -9, log.read_text()[-2000:]
    assert not (out / "manifest.json").exists()
    return out


@pytest.mark.parametrize("stage, at", [("task", 2), ("scatter", 1), ("gather", 2)])
def test_sigkill_then_rerun_equals_clean_build(sources, clean, tmp_path, stage, at):
    out = killed_build(sources, tmp_path, stage, at)
    done_tasks = sorted(out.glob(".work/tokens-*/logs/completions/*"))
    outputs = [p.parents[2] / "tokens" / f"{p.name}.bin" for p in done_tasks]
    done_shards = sorted(out.glob(".work/shuffle-*/done/*.json"))
    scattered = sorted(out.glob(".work/shuffle-*/scatter/logs/completions/*"))
    scattered += [p.parents[3] / "buckets" / f"scatter-{p.name}.bin" for p in scattered]
    entries = [json.loads(p.read_text()) for p in done_shards]
    written = [out / e["file"] for e in entries if not e.get("empty")]
    before = mtimes(done_tasks + outputs + written)
    before_scatter = mtimes(scattered)
    if stage == "task":
        assert len(done_tasks) == 2  # tasks 0 and 1; task 2 died before its marker
    if stage == "scatter":  # scatter task 1 died before its marker: only task 0 is done
        assert len(scattered) == 2 and not done_shards
    if stage == "gather":  # task 2 died after its shard, before its marker: rerun keeps it
        assert len(done_shards) == 3 and len(scattered) == 8
    stages, seen = [], {}

    def report(s: str, done: int, total: int) -> None:
        stages.append(s)
        if s == "shuffle: write" and done == total and not seen:  # before the work is removed
            seen.update(mtimes(Path(p) for p in before_scatter))

    build(recipe_from_dict(recipe(sources, out)), report=report)
    assert shard_bytes(out) == shard_bytes(clean)
    assert seen == before_scatter  # finished scatter tasks were not redone
    # finished work was not redone: completed tasks and shards kept their files
    assert mtimes([Path(p) for p in before]) == before
    assert not list(out.glob(".work/shuffle-*"))  # cleaned up after the manifest


@pytest.mark.parametrize("stage, at", [("buckets", 3), ("buckets-mid", 10), ("cluster", 2)])
def test_sigkill_in_dedup_then_rerun_equals_clean_build(sources, clean, tmp_path, stage, at):
    out = killed_build(sources, tmp_path, stage, at)
    (ddir,) = out.glob(".work/tokens-*/dedup-*")
    pair_dir, cluster_out = ddir / "buckets" / "pairs", ddir / "cluster" / "out"
    n_buckets = len(bucket_tasks(DedupConfig()))  # the recipe's dedup: defaults, near on
    pairs = sorted(pair_dir.glob("*.pairs"))
    marked = list((ddir / "buckets" / "logs" / "completions").glob("*"))
    tokens = sorted(out.glob(".work/tokens-*/tokens/*[0-9].bin"))  # token files
    assert len(tokens) == 4 and not list(out.glob(".work/shuffle-*"))
    if stage == "buckets":  # tasks run in rank order: task `at` named its pairs, no marker
        assert len(marked) == at and len(pairs) == at + 1
    if stage == "buckets-mid":  # task `at` died with its pairs in a temp file
        assert len(marked) == at and len(pairs) == at
        assert list(pair_dir.glob(f".{at:05d}.pairs.tmp-*"))
    if stage == "cluster":  # every bucket task done; the cluster task died half-way
        assert len(marked) == len(pairs) == n_buckets
        assert len(list(cluster_out.glob("*.removed"))) == at + 1
        assert not (cluster_out / SUMMARY).exists()
    before = mtimes(pairs + tokens)
    build(recipe_from_dict(recipe(sources, out)))
    assert shard_bytes(out) == shard_bytes(clean)
    assert mtimes([Path(p) for p in before]) == before  # finished work was not redone
    assert len(list(pair_dir.glob("*.pairs"))) == n_buckets and (cluster_out / SUMMARY).is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == json.loads((clean / "manifest.json").read_text())["counts"]


def test_achieved_mix_within_one_percent_with_shares_and_repeats(sources, tmp_path):
    raw = recipe(
        sources,
        tmp_path / "out",
        mix={"ratio": {"code": 4, "text": 1}, "max_repeats": 4, "total_tokens": 500_000},
    )
    m = build(recipe_from_dict(raw))
    tokens = m["mix"]["tokens"]
    assert abs(tokens["code"] / tokens["text"] / 4 - 1) < 0.01
    assert abs(sum(tokens.values()) / 500_000 - 1) < 0.01
    langs = m["mix"]["languages"]
    for d in langs:
        for u in langs[d].values():
            assert abs(u["tokens"] - u["budget"]) <= 0.01 * u["budget"]
    text = m["mix"]["sources"]["docs"]
    assert text["rate"] > 1 and text["copies"] > text["documents"]  # text is repeated
    # copies of a document are spread by the shuffle, not placed side by side
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(s["tokens"] for s in manifest["shards"] if s["split"] == "train") == sum(
        tokens.values()
    )


def test_infeasible_mix_is_a_clear_error(sources, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump(
            recipe(
                sources,
                tmp_path / "out",
                mix={"ratio": {"code": 1, "text": 1}, "total_tokens": 10_000_000},
            )
        )
    )
    res = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)], capture_output=True, text=True
    )
    assert res.returncode == 2
    err = res.stderr.strip().splitlines()[-1]
    assert err.startswith("lemur-data: error: mix infeasible: total_tokens 1e+07 needs")
    assert "Nearest feasible plan: total_tokens" in err and "Traceback" not in res.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_plan_only_writes_no_shards(sources, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(sources, tmp_path / "out")))
    res = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path), "--plan-only"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert res.returncode == 0, res.stderr
    assert "mix plan:" in res.stdout and "code / Python" in res.stdout
    # the expected peak of each pack stage, for the input at hand
    for stage in ("plan", "histograms (per task)", "scatter (per task)", "gather (per shard)"):
        assert stage in res.stdout
    assert "dedup buckets (per task)" in res.stdout and "dedup cluster" in res.stdout
    assert not (tmp_path / "out" / "manifest.json").exists() and not list(
        (tmp_path / "out").glob("train/*")
    )


def test_shared_work_dir_reuses_the_tokenize_work_across_outputs(sources, clean, tmp_path):
    """docs/recipe.md `work_dir`: builds of one recipe into other outputs, with another mix
    (a 0 weight included), tokenize once; where the work lives changes no shard."""
    work = tmp_path / "work"
    build(recipe_from_dict(recipe(sources, tmp_path / "a", work_dir=str(work))))
    runs = list(work.glob("tokens-*"))
    assert len(runs) == 1
    before = mtimes([*runs[0].glob("tokens/*"), *runs[0].glob("logs/completions/*")])
    code_only = {"ratio": {"code": 1, "text": 0}}
    b = build(recipe_from_dict(recipe(sources, tmp_path / "b", work_dir=str(work), mix=code_only)))
    assert list(work.glob("tokens-*")) == runs
    assert mtimes([Path(p) for p in before]) == before  # the second build tokenized nothing
    assert shard_bytes(tmp_path / "a") == shard_bytes(clean)
    assert not (tmp_path / "a" / ".work").exists() and not (tmp_path / "b" / ".work").exists()
    assert not list(work.glob("shuffle-*"))  # commit() cleared the finished shuffles there
    assert b["mix"]["tokens"]["text"] == 0 and b["mix"]["tokens"]["code"] > 0
    # a 0-weight domain still has its held-out shards: the same as any mix's
    val = lambda m: {s["domain"]: s["sha256"] for s in m["shards"] if s["split"] == "val"}  # noqa: E731
    assert val(b) == val(json.loads((clean / "manifest.json").read_text())) != {}

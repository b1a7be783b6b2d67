"""Benchmark: peak memory and wall time of each global stage of a build, from 1M to 16M documents.

Synthetic tokenize-stage outputs (as the tokenize step writes them: per task `{rank}.bin`
tokens, `{rank}.docs.npy` records, `{rank}.json` language table, and the exact-dedup sorted
runs the signer writes; 2% of the documents planted as exact copies of others) are packed
by the real stages, each stage in its own subprocess running its tasks one after the other,
so the peak RSS it reports is the largest single task (plus the interpreter):

  dedup buckets -> dedup cluster -> pack histograms -> plan -> scatter -> gather

Near-dup signing and verification are measured by tools/bench_dedup.py; here dedup is the
exact channel (the bucket and cluster tasks' shape is the same).

`--old DIR` also runs the previous single-process pack stage (val split, mix plan, shuffle
and shard writing in the build process) from a checkout of it, on the same inputs and the
same dedup decisions: `git worktree add /tmp/oldpack c0e72b6` (the parent of the commit
that made the pack stage tasks; its tokenize outputs and dedup files are these).

    python tools/bench_scale.py --docs 1000000 4000000 16000000 --tasks 64 --old /tmp/oldpack
    python tools/bench_scale.py --docs 16000000 --tasks 1024 --bucket-tasks 400
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORK = Path("/tmp/lemur-bench-scale")
STAGES = ("dedup buckets", "dedup cluster", "pack histograms", "plan", "scatter", "gather")
LANGUAGES = ["Python", "C", "SQL", "en"]


def make_recipe(out: Path):
    """A two-domain recipe (10:1, SQL share) over no real files (paths are not read)."""
    from lemur.data.recipe_loader import recipe_from_dict

    raw = {
        "output": str(out),
        "seed": 1,
        "tokenizer": {"train": {"vocab_size": 32000}},
        "val_fraction": 0.005,
        "shard_tokens": 1 << 24,
        # BENCH_SCALE_BUCKET_TASKS: dedup.bucket_tasks (the exact channel gets
        # ceil(bucket_tasks / bands) key ranges); read here so every stage's subprocess sees it
        "dedup": {"exact": True, "near": False, "bucket_tasks": bucket_tasks()},
        "mix": {"ratio": {"code": 10, "text": 1}, "shares": {"code": {"SQL": 0.1}}},
        "sources": [
            {"name": "code", "domain": "code", "format": "files", "paths": [str(out)]},
            {"name": "text", "domain": "text", "format": "jsonl", "paths": [str(out)]},
        ],
    }
    return recipe_from_dict(raw, check_paths=False)


def bucket_tasks() -> int | None:
    """`--bucket-tasks`, passed to the stages' subprocesses in the environment."""
    value = os.environ.get("BENCH_SCALE_BUCKET_TASKS")
    return int(value) if value else None


def generate(root: Path, n_docs: int, n_tasks: int) -> None:
    """Write the synthetic tokenize outputs of `n_docs` documents over `n_tasks` tasks."""
    from lemur.data.dedup.runs import write_runs
    from lemur.data.runs.format import DOC_RECORD

    tok = root / "tokens"
    tok.mkdir(parents=True)
    rng = np.random.default_rng(0)
    config = make_recipe(root).dedup
    hashes = rng.integers(0, 2**63, n_docs, dtype=np.uint64)
    planted = rng.random(n_docs) < 0.02  # exact copies of a random earlier-listed document
    hashes[planted] = hashes[rng.integers(0, n_docs, int(planted.sum()))]
    for rank, idx in enumerate(np.array_split(np.arange(n_docs), n_tasks)):
        n = len(idx)
        rec = np.zeros(n, DOC_RECORD)
        rec["source"] = rng.random(n) < 0.25  # a quarter text
        rec["language"] = np.where(rec["source"] == 1, 3, rng.choice(3, n, p=[0.8, 0.12, 0.08]))
        rec["tokens"] = 2 + rng.geometric(1 / 60, n)
        rec["id_hash"] = rng.integers(0, 2**63, n, dtype=np.uint64)
        rec["end"] = np.cumsum(rec["tokens"], dtype=np.uint64)
        np.save(tok / f"{rank:05d}.docs.npy", rec)
        (tok / f"{rank:05d}.json").write_text(json.dumps({"languages": LANGUAGES}))
        rng.integers(3, 32000, int(rec["end"][-1]), dtype=np.uint16).tofile(tok / f"{rank:05d}.bin")
        dom = rec["source"].astype(np.uint16)
        write_runs(tok, rank, hashes[idx], np.zeros((n, 0), np.uint32), dom, config)


def run_stage(root: Path, stage: str, n_tasks: int) -> None:
    """Run every task of one stage in this process (the child of `measure`)."""
    from lemur.data.corpus import corpus_of
    from lemur.data.dedup.stage import dedup_dir, dedup_stages
    from lemur.data.pack.plan import make_plan
    from lemur.data.pack.select import Groups
    from lemur.data.pack.write import PackStages
    from lemur.shards.format import token_dtype

    recipe = make_recipe(root)
    tok, ddir = root / "tokens", dedup_dir(root, recipe.dedup)
    if stage.startswith("dedup"):
        steps = list(dedup_stages(recipe.dedup, tok, n_tasks, ddir))
        _, step, tasks = steps[0 if stage == "dedup buckets" else 1]
        return _run(step, tasks)
    stages = PackStages(
        recipe, corpus_of(recipe), tok, n_tasks, token_dtype(32000), dedup_dir=ddir, prefix="b"
    )
    if stage == "pack histograms":
        from lemur.data.pack.steps import PackPrep

        return _run(
            PackPrep(tok, ddir, stages.shuffle_dir / "hist", Groups.of(recipe, corpus_of(recipe))),
            n_tasks,
        )
    if stage == "plan":
        plan = make_plan(recipe, corpus_of(recipe), stages.shuffle_dir / "hist", n_tasks, 2)
        (root / "plan.pkl").write_bytes(pickle.dumps(plan))
        return None
    plan = pickle.loads((root / "plan.pkl").read_bytes())
    from lemur.data.pack.steps import PackGather, PackScatter

    settings = stages.settings(plan)  # the steps are configured as a build configures them
    if stage == "scatter":
        return _run(PackScatter(tok, ddir, stages.shuffle_dir, settings), n_tasks)
    shards = [(f"b/{rel}", split, d) for rel, split, d in plan.buckets()]
    return _run(
        PackGather(stages.shuffle_dir, n_tasks, root / "out", shards, settings), len(shards)
    )


def peak_kib() -> int:
    """This process's peak resident set (VmHWM) in KiB.

    Not `getrusage().ru_maxrss`: Linux carries it over fork and exec, so a child reports
    at least its parent's RSS at the fork (here, the generator's arrays).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def _run(step, tasks: int) -> None:
    for rank in range(tasks):
        for _ in step.run(None, rank, tasks):
            pass


def run_old_pack(root: Path, n_tasks: int) -> None:
    """The previous pack stage, in this process (sys.path starts with its checkout)."""
    from lemur.data.dedup.stage import dedup_dir
    from lemur.data.pack.write import Packer

    recipe = make_recipe(root)
    ddir = dedup_dir(root, recipe.dedup)
    packer = Packer(recipe, root / "tokens", root / "old-out", n_tasks, 32000, "b", None, ddir)
    packer.pack(packer.plan())


def measure(root: Path, stage: str, n_tasks: int, old: Path | None = None) -> dict:
    """Wall time and peak RSS of one stage run in a fresh subprocess (`old`: the old pack)."""
    run = (
        f"bench_scale.run_old_pack(Path({str(root)!r}), {n_tasks})\n"
        if old
        else f"bench_scale.run_stage(Path({str(root)!r}), {stage!r}, {n_tasks})\n"
    )
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        + (f"sys.path.insert(0, {str(old)!r})\n" if old else "")
        + "import bench_scale\n"
        + run
        + "print(bench_scale.peak_kib())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(old)} if old else None
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{stage}: {res.stderr[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(int(res.stdout.split()[-1]) / 1024, 1)}


def baseline() -> float:
    """Peak RSS (MiB) of a subprocess that only imports the pack stage (the floor)."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import bench_scale, lemur.data.pack.write, lemur.data.dedup.stage\n"
        "print(bench_scale.peak_kib())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(int(out.stdout.split()[-1]) / 1024, 1)


def main() -> None:
    """Generate each size, run every stage, print one JSON line per size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--bucket-tasks", type=int, help="dedup.bucket_tasks (default: one per band)")
    ap.add_argument("--old", type=Path, help="a checkout of the previous pack stage (c0e72b6)")
    args = ap.parse_args()
    if args.bucket_tasks:
        os.environ["BENCH_SCALE_BUCKET_TASKS"] = str(args.bucket_tasks)
    floor = baseline()
    for n in args.docs:
        root = WORK / f"{n}-{args.tasks}"
        subprocess.run(["rm", "-rf", str(root)], check=True)
        generate(root, n, args.tasks)
        tokens = sum(np.load(p)["tokens"].sum() for p in (root / "tokens").glob("*.docs.npy"))
        result = {
            "docs": n,
            "tasks": args.tasks,
            "bucket_tasks": args.bucket_tasks,
            "tokens": int(tokens),
            "import_rss_mib": floor,
        }
        for stage in STAGES:
            result[stage] = measure(root, stage, args.tasks)
        plan = pickle.loads((root / "plan.pkl").read_bytes())
        if args.old:
            result["old pack (one process)"] = measure(root, "old pack", args.tasks, args.old)
        du = subprocess.run(["du", "-sm", str(root)], capture_output=True, text=True, check=True)
        result["disk_mib"] = int(du.stdout.split()[0])
        result["train_shards"] = plan.train_shards
        # what `lemur-data build --plan-only` prints for these inputs (dedup, then pack)
        from lemur.data.dedup.stage import dedup_dir, expected_memory

        config = make_recipe(root).dedup
        expected = {**expected_memory(config, dedup_dir(root, config)), **plan.memory}
        result["expected_peak_mib"] = {k: round(v / 2**20, 1) for k, v in expected.items()}
        print(json.dumps(result), flush=True)
        subprocess.run(["rm", "-rf", str(root)], check=True)


if __name__ == "__main__":
    main()

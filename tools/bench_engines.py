"""Benchmark: the same small build on the local executor, a 2-node Ray cluster and a
one-node Slurm, in one run; the shards must be byte-identical.

- local: `executor: {kind: local, tasks: 2, workers: 2}`;
- ray: a 2-node, 1-CPU-per-node cluster started here on localhost (tools/localcluster.py;
  its start-up is not counted), joined with `executor.address`;
- slurm: the one-node Slurm of `.ci/slurm-up` (as root; the engine is skipped without it).

Each build runs as its own `lemur-data` process into a fresh output. For Slurm it also
measures Slurm's own latency for the same work shape: one no-op array per stage, with the
stage's tasks and workers (`sbatch --wait --wrap true`), one after the other; the goal is
slurm <= 2 x local + that latency.

    python tools/bench_engines.py                 # 60 stdlib modules + 80 pydoc topics
    python tools/bench_engines.py --files 200 --docs 300 --engines local,slurm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from localcluster import RayCluster, slurm_partition, slurm_problem  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/lemur-bench-engines")

# A build that reports each stage's task count (the Slurm latency probe mirrors them).
DRIVER = """
import json, sys
from lemur import process_setup
from lemur.data.build import build
from lemur.data.recipe_loader import load_recipe
process_setup.install("lemur-data")  # the console of `lemur-data build`
TASK_STAGES = ("tokenize", "dedup", "pack: histograms", "shuffle: scatter", "shuffle: write")
stages = {}
def report(stage, done, total):
    if stage == "tokenize" or stage.startswith(TASK_STAGES[1:]):
        stages[stage] = total
build(load_recipe(sys.argv[1]), report=report)
print(json.dumps(stages))
"""


def corpus(files: int, docs: int) -> Path:
    """Real code (stdlib modules) and text (pydoc topics) under WORK/src."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import real_python_files, real_text_docs, write_jsonl

    src = WORK / f"src-{files}-{docs}"
    if not (src / "text.jsonl").is_file():
        (src / "code").mkdir(parents=True, exist_ok=True)
        for p in real_python_files(files):
            shutil.copy(p, src / "code" / p.name)
        write_jsonl(src / "text.jsonl", real_text_docs(docs))
    return src


def recipe(src: Path, out: Path, executor: dict) -> Path:
    """The small build's recipe for `executor` (near-duplicate dedup off: one dedup task)."""
    path = out.with_suffix(".yaml")
    path.write_text(
        yaml.safe_dump(
            {
                "output": str(out),
                "seed": 5,
                "val_fraction": 0.05,
                "shard_tokens": 30_000,
                "tokenizer": {"train": {"vocab_size": 500, "sample_bytes": 200_000}},
                "mix": {"ratio": {"code": 10, "text": 1}},
                "dedup": {"near": False},
                "executor": {"tasks": 2, "workers": 2, **executor},
                "sources": [
                    {
                        "name": "py",
                        "domain": "code",
                        "format": "files",
                        "paths": [str(src / "code")],
                    },
                    {
                        "name": "docs",
                        "domain": "text",
                        "format": "jsonl",
                        "paths": [str(src / "text.jsonl")],
                    },
                ],
            }
        )
    )
    return path


def run(path: Path, env: dict) -> tuple[float, dict[str, int]]:
    """Wall seconds of one build process, and its stages' task counts."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{path.name}: build failed:\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def shards(out: Path) -> list[bytes]:
    """The build's shard files, in manifest order."""
    manifest = json.loads((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def slurm_latency(stages: dict[str, int], workers: int, partition: str) -> float:
    """Seconds for no-op arrays shaped like the build's task stages, one after the other."""
    t0 = time.perf_counter()
    for tasks in stages.values():
        subprocess.run(
            [
                "sbatch",
                "--wait",
                "--quiet",
                f"--partition={partition}",
                "--output=/dev/null",
                "--cpus-per-task=1",
                "--mem-per-cpu=512M",
                "--job-name=lemur-bench-latency",
                f"--array=0-{tasks - 1}%{workers}",
                "--wrap",
                "true",
            ],
            check=True,
            timeout=600,
        )
    return time.perf_counter() - t0


def build_once(engine: str, out: Path, src: Path, env: dict, cluster: RayCluster | None):
    """(wall s, stages) of one build on `engine` into a fresh `out`."""
    shutil.rmtree(out, ignore_errors=True)
    if engine == "local":
        return run(recipe(src, out, {"kind": "local"}), env)
    if engine == "ray":
        ray_env = {**env, "RAY_TMPDIR": cluster.env["RAY_TMPDIR"], "RAY_AUTH_MODE": "disabled"}
        return run(recipe(src, out, {"kind": "ray", "address": cluster.address}), ray_env)
    executor = {
        "kind": "slurm",
        "partition": slurm_partition(),
        "time": "00:30:00",
        "mem_per_cpu_gb": 0.5,
    }
    return run(recipe(src, out, executor), env)


def main() -> None:
    """Run the engines asked for, `--rounds` times interleaved, and print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=60, help="stdlib modules (code)")
    ap.add_argument("--docs", type=int, default=80, help="pydoc topics (text)")
    ap.add_argument("--engines", default="local,ray,slurm")
    ap.add_argument("--rounds", type=int, default=2, help="best of this many builds each")
    args = ap.parse_args()
    engines = args.engines.split(",")
    if "slurm" in engines and slurm_problem():
        print(f"slurm: skipped: {slurm_problem()}")
        engines.remove("slurm")
    src = corpus(args.files, args.docs)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["HF_HUB_OFFLINE"] = "1"
    cluster = RayCluster(2, env={"PYTHONPATH": env["PYTHONPATH"]}) if "ray" in engines else None
    walls: dict[str, list[float]] = {e: [] for e in engines}
    stages, outs = {}, {}
    try:
        if cluster:
            cluster.start()
        for _ in range(args.rounds):  # interleaved: a slow spell of the machine hits all
            for engine in engines:
                out = WORK / f"out-{engine}"
                wall, stages = build_once(engine, out, src, env, cluster)
                walls[engine].append(wall)
                outs[engine] = shards(out)
    finally:
        if cluster:
            cluster.stop()
    report(args, walls, stages, outs)


def report(args: argparse.Namespace, walls: dict, stages: dict, outs: dict) -> None:
    """Print the table, Slurm's latency and the goal, and whether the shards agree."""
    best = {e: min(w) for e, w in walls.items()}
    base = best.get("local")
    print(
        f"\nsmall build: {args.files} stdlib modules + {args.docs} pydoc topics, 2 tasks x 2 workers"
    )
    print("task stages (tasks): " + ", ".join(f"{k} ({v})" for k, v in stages.items()))
    print(f"\n| engine | wall s (best of {args.rounds}) | all runs | / local |\n|---|---|---|---|")
    for engine, wall in best.items():
        ratio = f"{wall / base:.2f}" if base else "-"
        runs = ", ".join(f"{w:.1f}" for w in walls[engine])
        print(f"| {engine} | {wall:.1f} | {runs} | {ratio} |")
    if "slurm" in best:
        latency = slurm_latency(stages, 2, slurm_partition())
        print(f"\nslurm's own latency for the same stages (no-op arrays): {latency:.1f} s")
        if base:
            goal = 2 * base + latency
            met = "met" if best["slurm"] <= goal else "NOT met"
            print(f"goal slurm <= 2 x local + latency = {goal:.1f} s: {met}")
    same = len({tuple(s) for s in outs.values()}) == 1
    print(f"shards byte-identical across {', '.join(outs)}: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()

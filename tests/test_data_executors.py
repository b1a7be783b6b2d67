"""Executors: Ray gives the same shards as local; Slurm generates the expected sbatch script."""

from __future__ import annotations

import json
import os
import stat
import sys
from functools import partial
from pathlib import Path

import pytest
from conftest import real_python_files, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.dedup.stage import bucket_tasks, dedup_stages
from lemur.data.load import recipe_from_dict
from lemur.data.recipe import DedupConfig, RecipeError
from lemur.data.run.executors import make_executor


def recipe(tmp: Path, out: str, executor: dict) -> dict:
    code = tmp / "code"
    if not code.is_dir():
        code.mkdir()
        for p in real_python_files(20):
            (code / p.name).write_bytes(p.read_bytes())
        write_jsonl(tmp / "text.jsonl", real_text_docs(40))
    return {
        "output": str(tmp / out),
        "seed": 5,
        "val_fraction": 0.05,
        "shard_tokens": 30_000,
        "tokenizer": {"train": {"vocab_size": 500, "sample_bytes": 200_000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "executor": executor,
        "sources": [
            {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp / "text.jsonl")],
            },
        ],
    }


def test_ray_build_equals_local_build(tmp_path):
    ray = pytest.importorskip("ray")
    local = build(
        recipe_from_dict(recipe(tmp_path, "local", {"kind": "local", "tasks": 4, "workers": 2}))
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ran: dict[str, dict] = {}
    try:
        remote = build(
            recipe_from_dict(recipe(tmp_path, "ray", {"kind": "ray", "tasks": 4, "workers": 2})),
            report=partial(record_global_stages, tmp_path / "ray", ran),
        )
    finally:
        ray.shutdown()
    assert [s["sha256"] for s in remote["shards"]] == [s["sha256"] for s in local["shards"]]
    for a, b in zip(local["shards"], remote["shards"], strict=True):  # byte for byte
        assert (tmp_path / "local" / a["file"]).read_bytes() == (
            tmp_path / "ray" / b["file"]
        ).read_bytes()
    assert remote["counts"]["read"] == local["counts"]["read"]
    # every global stage's tasks (dedup buckets and cluster, histograms, scatter, gather) ran
    # on Ray: its executor logged every task
    n_shards = len([s for s in remote["shards"] if s["split"] == "train"])
    assert set(ran) == {"buckets", "cluster", "prep", "scatter", "gather"}
    for stage, seen in ran.items():
        assert "nodes_per_task" in seen["executor"], stage  # a RayPipelineExecutor
        assert seen["executor"]["world_size"] == seen["completed"] == seen["task_logs"], stage
    assert ran["buckets"]["completed"] == len(bucket_tasks(DedupConfig())) == 26  # near on
    assert ran["cluster"]["completed"] == 1
    assert ran["prep"]["completed"] == ran["scatter"]["completed"] == 4
    assert ran["gather"]["completed"] >= n_shards
    assert remote["counts"]["dedup"] == local["counts"]["dedup"]


def record_global_stages(out: Path, ran: dict, stage: str, done: int, total: int) -> None:
    """At the end of the gather stage (before its work folder is removed), note for every
    dedup and pack stage its executor, finished tasks and task logs."""
    if stage != "shuffle: write" or done < total or ran:
        return
    stages = [*out.glob(".work/tokens-*/dedup-*/*/logs"), *out.glob(".work/shuffle-*/*/logs")]
    for folder in stages:
        ran[folder.parent.name] = {
            "executor": json.loads((folder / "executor.json").read_text()),
            "completed": len(list((folder / "completions").iterdir())),
            "task_logs": len(list((folder / "logs").glob("task_*.log"))),
        }


def stand_in_sbatch(tmp_path: Path, monkeypatch) -> None:
    """Put on PATH an `sbatch` that keeps the script it was given and answers like Slurm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        f"#!{sys.executable}\nimport glob, shutil, sys\n"
        f"n = len(glob.glob({str(tmp_path / 'submitted-*.sh')!r}))\n"
        f"shutil.copy(sys.argv[-1], {str(tmp_path)!r} + f'/submitted-{{n}}.sh')\n"
        "print(f'Submitted batch job {4242 + n}')\n"
    )
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


SLURM = {
    "kind": "slurm",
    "tasks": 64,
    "workers": 16,
    "partition": "cpu",
    "time": "04:00:00",
    "cpus_per_task": 2,
    "mem_per_cpu_gb": 3,
    "job_name": "lemur-test",
    "venv_path": "/opt/venv",
    "sbatch_args": {"account": "proj42"},
}


def test_slurm_generates_an_array_job(tmp_path, monkeypatch):
    stand_in_sbatch(tmp_path, monkeypatch)
    r = recipe_from_dict(recipe(tmp_path, "slurm", SLURM))
    executor = make_executor(
        r.executor, [lambda data, rank, world_size: None], 64, tmp_path / "logs"
    )
    executor.run()
    script = (tmp_path / "submitted-0.sh").read_text()  # the array job (then a stats merge job)
    for line in (
        "#SBATCH --partition=cpu",
        "#SBATCH --time=04:00:00",
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --mem-per-cpu=3G",
        "#SBATCH --job-name=lemur-test",
        "#SBATCH --array=0-63%16",
        "#SBATCH --account=proj42",
        "source /opt/venv/bin/activate",
    ):
        assert line in script, line
    assert executor.job_id == "4242"
    assert (
        tmp_path / "logs" / "executor.pik"
    ).is_file()  # what every array task unpickles and runs
    assert json.loads((tmp_path / "logs" / "executor.json").read_text())["world_size"] == 64


def test_slurm_runs_every_global_stage_as_array_jobs(tmp_path, monkeypatch):
    import dill

    from lemur.data.pack.select import Groups
    from lemur.data.pack.steps import PackGather, PackPrep, PackScatter

    stand_in_sbatch(tmp_path, monkeypatch)
    r = recipe_from_dict(recipe(tmp_path, "slurm", SLURM))
    groups = Groups.of(r)
    cfg = {"groups": groups, "val_cut": {"code": 5}, "units": {}, "train_shards": 3}
    # the dedup stages as the build makes them: near on, bucket tasks per channel and range
    stages = {
        name: (step, tasks)
        for name, step, tasks in dedup_stages(r.dedup, Path("tok"), 64, Path("dd"))
    }
    stages |= {
        "prep": (PackPrep("tok", None, "hist", groups), 64),
        "scatter": (PackScatter("tok", None, "work", cfg), 64),
        "gather": (PackGather("work", 64, "out", [("train/00000", "train", "mixed")] * 3, cfg), 3),
    }
    assert list(stages) == ["buckets", "cluster", "prep", "scatter", "gather"]
    assert [tasks for _, tasks in stages.values()][:2] == [26, 1]
    for n, (name, (step, tasks)) in enumerate(stages.items()):
        executor = make_executor(r.executor, [step], tasks, tmp_path / name / "logs")
        executor.run()
        script = (tmp_path / f"submitted-{2 * n}.sh").read_text()  # (then a stats merge job)
        assert f"#SBATCH --array=0-{tasks - 1}%16" in script
        assert "#SBATCH --mem-per-cpu=3G" in script and "source /opt/venv/bin/activate" in script
        # what every array task of the stage unpickles and runs: this step, as configured
        with open(tmp_path / name / "logs" / "executor.pik", "rb") as fh:
            pickled = dill.load(fh).pipeline[0]
        assert type(pickled) is type(step) and configured(pickled) == configured(step)


def configured(step) -> tuple:
    """What a global stage's step was configured with (the pack steps keep it in `args`)."""
    if hasattr(step, "args"):
        return step.args
    keys = ("config", "tok_dir", "n_tasks", "pair_dir", "out_dir")
    return tuple(getattr(step, k, None) for k in keys)


def test_slurm_needs_partition_and_time(tmp_path):
    with pytest.raises(RecipeError, match="slurm needs executor.partition and executor.time"):
        recipe_from_dict(recipe(tmp_path, "s", {"kind": "slurm", "tasks": 2}))


def test_waiting_for_slurm_fails_when_the_array_stops_short(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from lemur.data.build import BuildError, wait_for_slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f"#!{sys.executable}\n")  # the job is no longer queued: prints nothing
    squeue.chmod(squeue.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    done = tmp_path / "logs" / "completions"
    done.mkdir(parents=True)
    (done / "00000").touch()
    job = SimpleNamespace(job_id="77")
    with pytest.raises(BuildError, match="slurm job 77 ended with 1 of 2 tasks unfinished"):
        wait_for_slurm(job, tmp_path, 2, lambda *a: None, poll=0)
    (done / "00001").touch()
    wait_for_slurm(job, tmp_path, 2, lambda *a: None, poll=0)  # all done: returns

"""Executors: Ray gives the same shards as local; Slurm generates the expected sbatch script."""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import sys
from functools import partial
from pathlib import Path

import pytest
from conftest import real_python_files, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.corpus import corpus_of
from lemur.data.dedup.stage import bucket_tasks, dedup_stages
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.recipe.recipe import DedupConfig
from lemur.data.recipe_loader import recipe_from_dict
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
    from loguru import logger

    ray = pytest.importorskip("ray")
    local = build(
        recipe_from_dict(recipe(tmp_path, "local", {"kind": "local", "tasks": 4, "workers": 2}))
    )
    ran: dict[str, dict] = {}
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        # `address: local`: a private instance, whatever Ray cluster this machine runs
        executor = {"kind": "ray", "tasks": 4, "workers": 2, "address": "local"}
        remote = build(
            recipe_from_dict(recipe(tmp_path, "ray", executor)),
            report=partial(record_global_stages, tmp_path / "ray", ran),
        )
    finally:
        logger.remove(sink)
    assert not ray.is_initialized()  # the build closed the instance it started
    # one host, a local output: no warning (datatrove's was printed once per stage)
    assert [w for w in warnings if "filesystem" in w] == []
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
        assert seen["executor"]["retries"] == 1, stage  # our Ray executor
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
        "#SBATCH --mem-per-cpu=3072M",
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
    from lemur.data.pack.settings import PackSettings
    from lemur.data.pack.steps import PackGather, PackPrep, PackScatter

    stand_in_sbatch(tmp_path, monkeypatch)
    r = recipe_from_dict(recipe(tmp_path, "slurm", SLURM))
    groups = Groups.of(r, corpus_of(r))
    cfg = PackSettings(groups, {"code": 5}, (("code", "Python", 1, b"\x80"),), 3, {}, "<u2", False)
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
        script = (tmp_path / f"submitted-{n}.sh").read_text()  # one job per stage
        assert f"#SBATCH --array=0-{tasks - 1}%16" in script
        assert "#SBATCH --mem-per-cpu=3072M" in script and "source /opt/venv/bin/activate" in script
        # what every array task of the stage unpickles and runs: this step, as configured
        with open(tmp_path / name / "logs" / "executor.pik", "rb") as fh:
            pickled = dill.load(fh).pipeline[0]
        assert type(pickled) is type(step) and configured(pickled) == configured(step)


def configured(step) -> tuple:
    """What a global stage's step was configured with (its named constructor arguments)."""
    keys = ("config", "tok_dir", "n_tasks", "pair_dir", "out_dir", "dedup_dir", "groups")
    keys += ("duplicates", "work", "settings", "out", "shards")
    return tuple(getattr(step, k, None) for k in keys)


def test_slurm_needs_partition_and_time(tmp_path):
    with pytest.raises(RecipeError, match="slurm needs executor.partition and executor.time"):
        recipe_from_dict(recipe(tmp_path, "s", {"kind": "slurm", "tasks": 2}))


def stand_in(tmp_path: Path, monkeypatch, name: str, body: str) -> Path:
    """Put on PATH a command `name` running the Python `body`; it appends its argv to
    `<name>.calls` (one JSON list a line)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / f"{name}.calls"
    cmd = bin_dir / name
    cmd.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n{body}\n"
    )
    cmd.chmod(cmd.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def ticks():
    """A clock that moves one second each time it is read."""
    return itertools.count(step=1.0).__next__


SLURM_SMALL = ExecutorConfig(kind="slurm", partition="cpu", time="10")


def submitted_job(logs: Path, job: str):
    """A Slurm executor logging under `logs` that has submitted the array job `job`."""
    executor = make_executor(SLURM_SMALL, [lambda data, rank, world_size: None], 2, logs)
    executor.job_ids.append(job)
    executor.job_id = job
    return executor


def test_waiting_for_slurm_fails_when_the_array_stops_short(tmp_path, monkeypatch):
    from lemur.data.run.task import StageError

    stand_in(tmp_path, monkeypatch, "squeue", "")  # the job is no longer queued: no output
    logs = tmp_path / "logs"
    (logs / "completions").mkdir(parents=True)
    (logs / "completions" / "00000").touch()
    (logs / "ranks_to_run.json").write_text("[0, 1]")
    (logs / "slurm_logs").mkdir()
    (logs / "slurm_logs" / "77_1.out").write_text(  # what srun -l printed for a dead task
        "Starting data processing job lemur-data\n+ export PYTHONUNBUFFERED=TRUE\n"
        "+ srun -l -n 1 launch_pickled_pipeline /x/executor.pik\n"
        "0: WARNING: a harmless warning\n"
        "slurmstepd: error: execve(): launch_pickled_pipeline: No such file or directory\n"
        "srun: error: localhost: task 0: Exited with exit code 2\n"
    )
    job = submitted_job(logs, "77")
    assert job.slurm_logs_folder == str(logs / "slurm_logs")
    with pytest.raises(StageError) as e:
        job.wait(tmp_path, 2, lambda *a: None, sleep=lambda s: None, clock=ticks())
    assert str(e.value) == (
        "tokenize stage: slurm job 77 ended with 1 of 2 tasks unfinished; task 1: "
        "slurmstepd: error: execve(): launch_pickled_pipeline: No such file or directory "
        f"({logs / 'slurm_logs' / '77_1.out'}); rerun to resubmit only those"
    )
    (logs / "completions" / "00001").touch()
    job.wait(tmp_path, 2, lambda *a: None, sleep=lambda s: None, clock=ticks())  # all done


def test_waiting_for_slurm_sees_a_finished_stage_at_once_and_backs_off_squeue(
    tmp_path, monkeypatch
):
    """Virtual time: the stage's markers appear at t=2 s and the job leaves the queue at
    t=600 s. The wait must end by t=2.5 s (it polled every 30 s), and a 600 s stage must
    cost a few dozen squeue calls, not one per marker look."""
    now = [0.0]
    state = tmp_path / "queued"
    state.write_text("1")
    calls = stand_in(
        tmp_path,
        monkeypatch,
        "squeue",
        f"print('77_0' if open({str(state)!r}).read() == '1' else '')",
    )
    logs = tmp_path / "logs" / "completions"
    logs.mkdir(parents=True)

    def sleep(seconds: float, finish_at: float) -> None:
        now[0] += seconds
        if now[0] >= finish_at:
            for rank in range(2):
                (logs / f"{rank:05d}").touch()
            state.write_text("0")

    job = submitted_job(tmp_path / "logs", "77")
    job.wait(tmp_path, 2, lambda *a: None, sleep=lambda s: sleep(s, 2.0), clock=lambda: now[0])
    assert now[0] <= 2.5
    for marker in logs.iterdir():
        marker.unlink()
    state.write_text("1")
    calls.write_text("")
    now[0] = 0.0
    job.wait(tmp_path, 2, lambda *a: None, sleep=lambda s: sleep(s, 600.0), clock=lambda: now[0])
    assert len(calls.read_text().splitlines()) <= 30


def test_a_slurm_executor_cancels_every_job_it_submitted(tmp_path, monkeypatch):
    calls = stand_in(tmp_path, monkeypatch, "scancel", "")
    job = submitted_job(tmp_path / "logs", "77")
    job.job_ids.append("78")  # a second array (over max_array_size tasks)
    job.cancel()
    assert [json.loads(line) for line in calls.read_text().splitlines()] == [["77", "78"]]
    calls.write_text("")
    fresh = make_executor(SLURM_SMALL, [lambda data, rank, world_size: None], 2, tmp_path)
    fresh.cancel()  # nothing submitted: nothing to cancel
    assert calls.read_text() == ""


def test_the_datatrove_privates_we_rely_on_are_there(tmp_path):
    """The two private members of datatrove's executors that lemur.data.run.datatrove_private
    wraps, pinned: a datatrove that renames or changes them fails here, not in a build."""
    import inspect

    from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
    from datatrove.executor.base import PipelineExecutor

    params = list(inspect.signature(PipelineExecutor._run_for_rank).parameters)
    assert params == ["self", "rank", "local_rank", "node_rank"]
    # datatrove's own runs call it: our override is what a Slurm array task runs
    assert "self._run_for_rank(rank, node_rank=node_rank)" in inspect.getsource(
        SlurmPipelineExecutor.run
    )
    plain = LocalPipelineExecutor(pipeline=[], tasks=1, logging_dir=str(tmp_path / "plain"))
    assert plain._launched is False  # set by run(); a dependent executor reads it:
    assert "if not self.depends._launched" in inspect.getsource(LocalPipelineExecutor.run)
    ran = []
    ours = make_executor(
        ExecutorConfig(workers=1), [lambda data, rank, world_size: ran.append(rank)], 2, tmp_path
    )
    ours.run()
    assert ran == [0, 1] and ours._launched is True
    assert sorted(p.name for p in (tmp_path / "completions").iterdir()) == ["00000", "00001"]


def test_slurm_memory_in_megabytes_and_the_recipes_qos(tmp_path, monkeypatch):
    stand_in_sbatch(tmp_path, monkeypatch)
    settings = {**SLURM, "mem_per_cpu_gb": 0.5, "sbatch_args": {"qos": "high", "account": "p"}}
    r = recipe_from_dict(recipe(tmp_path, "slurm", settings))
    make_executor(r.executor, [lambda data, rank, world_size: None], 4, tmp_path / "logs").run()
    script = (tmp_path / "submitted-0.sh").read_text()
    assert "#SBATCH --mem-per-cpu=512M" in script  # was --mem-per-cpu=0G: the whole node
    assert "#SBATCH --qos=high" in script and "--qos=normal" not in script
    assert not (tmp_path / "submitted-1.sh").exists()  # no merge_stats job left to hang


def test_slurm_tasks_run_the_interpreter_running_the_build(tmp_path, monkeypatch):
    stand_in_sbatch(tmp_path, monkeypatch)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    settings = {k: v for k, v in SLURM.items() if k != "venv_path"}
    r = recipe_from_dict(recipe(tmp_path, "slurm", settings))
    make_executor(r.executor, [lambda data, rank, world_size: None], 4, tmp_path / "logs").run()
    script = (tmp_path / "submitted-0.sh").read_text()
    # the venv running pytest (no `activate` in a plain interpreter: its bin/ on PATH)
    activate = Path(sys.prefix) / "bin" / "activate"
    line = (
        f"source {activate}"
        if activate.is_file()
        else f'export PATH={Path(sys.executable).parent}:"$PATH"'
    )
    assert line in script
    assert (Path(sys.prefix) / "bin" / "launch_pickled_pipeline").is_file()


def test_ray_warns_only_for_other_hosts_writing_to_a_node_local_path(tmp_path):
    from lemur.data.run.ray_cluster import filesystem_type, node_local_problem

    out = tmp_path / "out"
    assert node_local_problem({"10.0.0.1"}, "10.0.0.1", out, "ext4") == ""  # one host
    assert node_local_problem({"10.0.0.1", "10.0.0.2"}, "10.0.0.1", out, "nfs4") == ""
    warning = node_local_problem({"10.0.0.1", "10.0.0.2"}, "10.0.0.1", out, "ext4")
    assert warning.startswith(f"ray: {out} is on a node-local filesystem (ext4)")
    assert "10.0.0.2" in warning and "\n" not in warning
    assert filesystem_type(Path("/proc/self")) == "proc"


@pytest.mark.parametrize(
    "executor, message",
    [
        ({"kind": "local", "address": "auto"}, "executor.address is for kind ray, not local"),
        ({"kind": "ray", "address": "ray cluster"}, "is not `local`, `auto` or host:port"),
        ({"kind": "ray", "retries": -1}, "executor.retries must be >= 0"),
        ({"kind": "ray", "time": "1 hour"}, "executor.time '1 hour' is not a Slurm time"),
        (
            {"kind": "slurm", "partition": "p", "time": "1:00:00", "mem_per_cpu_gb": 0},
            "mem_per_cpu_gb > 0",
        ),
    ],
)
def test_bad_executor_settings_are_named(tmp_path, executor, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        recipe_from_dict(recipe(tmp_path, "bad", executor))


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), ("10:05", 605), ("04:00:00", 14400), ("1-2", 93600), ("1-02:30:05", 95405)],
)
def test_slurm_time_formats(text, seconds):
    from lemur.data.recipe.executor import time_seconds

    assert time_seconds(text) == seconds

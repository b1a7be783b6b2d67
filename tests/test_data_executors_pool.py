"""One pool of worker processes for a whole local build (`executors.build_pool`).

Each stage used to spawn workers of its own, which imported lemur and datatrove again; the
build's stages now run in the same workers, a task that kills its worker still fails its
stage (and the next stage gets a fresh pool), and a task sees the build's environment as it
is when its stage starts. That a killed build leaves no worker: tests/test_process_guard.py.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_data_executors import recipe

from lemur.data.build import build
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.run.stage import executor_session, run_tasks
from lemur.data.run.task import StageError

LOCAL = ExecutorConfig(kind="local", tasks=2, workers=2)
LAUNCH = re.compile(r"Launching pipeline for rank=(\d+) on .*, pid (\d+)")


def task_pids(logs: Path) -> dict[int, int]:
    """rank -> pid of the process that ran it, from the task logs under `logs`."""
    found = {}
    for log in logs.glob("**/logs/task_*.log"):
        for rank, pid in LAUNCH.findall(log.read_text()):
            found[int(rank)] = int(pid)
    return found


def noop(data, rank: int, world_size: int) -> None:
    """A task that does nothing (its log still names its process)."""


def exit_on_rank_1(data, rank: int, world_size: int) -> None:
    """A task that kills its worker, as the OOM killer would, on rank 1."""
    if rank == 1:
        os._exit(9)


class ReadEnv:
    """A task step writing the variable `name` as its process sees it to `folder/<rank>`."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name, self.folder = name, folder

    def __call__(self, data, rank: int, world_size: int) -> None:
        """Write the variable's value (or `-` when unset)."""
        (self.folder / str(rank)).write_text(os.environ.get(self.name, "-"))


def stage(tmp: Path, name: str, step) -> dict[int, int]:
    """Run 2 tasks of `step` as stage `name`; rank -> pid from its task logs."""
    run_tasks(LOCAL, [step], tmp / name, 2, name, lambda *a: None)
    return task_pids(tmp / name / "logs")


def test_a_builds_stages_run_in_the_same_two_worker_processes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    seen: dict[str, set[int]] = {}

    def report(stage: str, done: int, total: int) -> None:
        # work folders go once a build no longer needs them: read their task logs now
        for logs in out.glob(".work/**/logs/logs"):
            seen.setdefault(str(logs.parent.parent), set()).update(task_pids(logs.parent).values())

    executor = {"kind": "local", "tasks": 4, "workers": 2}
    build(recipe_from_dict(recipe(tmp_path, "out", executor)), report=report)
    in_workers = {folder: pids for folder, pids in seen.items() if pids - {os.getpid()}}
    assert len(in_workers) >= 4, seen  # tokenize, dedup, histograms, scatter, gather
    workers = set().union(*in_workers.values()) - {os.getpid()}
    assert len(workers) == 2, seen  # was 2 new processes for each stage


def test_a_task_that_kills_its_worker_fails_its_stage_and_the_pool_is_replaced(
    tmp_path: Path,
) -> None:
    with executor_session(LOCAL):
        first = stage(tmp_path, "first", noop)
        with pytest.raises(StageError) as failed:
            stage(tmp_path, "crash", exit_on_rank_1)
        after = stage(tmp_path, "after", noop)
        again = stage(tmp_path, "again", noop)
    assert str(failed.value) == (
        "crash stage failed: A process in the process pool was terminated abruptly while the "
        f"future was running or pending. (task logs: {tmp_path / 'crash' / 'logs'})"
    )
    assert set(first.values()) & set(after.values()) == set()  # a fresh pool after the crash
    assert len({*after.values(), *again.values()}) <= 2  # which the next stage reuses
    assert os.getpid() not in {*first.values(), *after.values()}


def test_a_task_sees_the_environment_its_stage_starts_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMUR_TEST_GONE", "before")
    monkeypatch.delenv("LEMUR_TEST_SET", raising=False)
    seen = tmp_path / "seen"
    seen.mkdir()
    with executor_session(LOCAL):
        first = stage(tmp_path, "first", noop)  # the workers start with the environment then
        monkeypatch.setenv("LEMUR_TEST_SET", "exported mid-build")  # as a recipe's secrets are
        monkeypatch.delenv("LEMUR_TEST_GONE")
        (seen / "set").mkdir()
        (seen / "gone").mkdir()
        set_pids = stage(tmp_path, "set", ReadEnv("LEMUR_TEST_SET", seen / "set"))
        gone_pids = stage(tmp_path, "gone", ReadEnv("LEMUR_TEST_GONE", seen / "gone"))
    assert len({*first.values(), *set_pids.values(), *gone_pids.values()}) <= 2  # 2 workers
    assert [(seen / "set" / r).read_text() for r in "01"] == ["exported mid-build"] * 2
    assert [(seen / "gone" / r).read_text() for r in "01"] == ["-", "-"]


def test_ctrl_c_ends_the_idle_workers_quietly_and_the_next_stage_has_new_ones(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    with executor_session(LOCAL):
        first = set(stage(tmp_path, "first", noop).values())
        capfd.readouterr()
        for pid in first:  # what a terminal's Ctrl-C sends them between two stages
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in first):
            assert time.monotonic() < deadline, "a worker outlived SIGINT"
            time.sleep(0.05)
        after = set(stage(tmp_path, "after", noop).values())
    assert "Traceback" not in capfd.readouterr().err  # was KeyboardInterrupt's, per worker
    assert first & after == set()

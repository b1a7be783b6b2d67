"""Slurm: datatrove's array jobs as a build needs them, waiting for them or cancelling them,
and explaining failures.

What we change in datatrove's `SlurmPipelineExecutor`, and why:
- memory in megabytes (`--mem-per-cpu=512M`): datatrove writes whole gigabytes, so
  `mem_per_cpu_gb: 0.5` became `--mem-per-cpu=0G`, which Slurm reads as "all of the node";
- the recipe's `sbatch_args.qos` is kept (datatrove always wrote `--qos=normal` over it);
  without one, no `--qos` line: the account's default QOS applies;
- no `merge_stats` job: we never read its `stats.json`, and it waited on `afterok`, so a
  failed stage left it pending forever (`DependencyNeverSatisfied`);
- every submitted job id is kept, so that a failed or interrupted stage cancels them
  (`cancel`), and waiting for the stage (`wait`) watches them in the queue;
- array tasks run the interpreter that runs `lemur-data` when neither `executor.venv_path`
  nor `$VIRTUAL_ENV` says otherwise (without it, `launch_pickled_pipeline` was not found).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from datatrove.executor import SlurmPipelineExecutor

from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.datatrove_private import LemurExecutor
from lemur.data.run.task import Reporter, StageError, tasks_done

MARKERS_EVERY = 0.25  # s between looks at the completion markers (a directory listing)
FIRST_QUEUE_CHECK, LAST_QUEUE_CHECK = 1.0, 30.0  # squeue: 1 s, doubling up to 30 s
# The line of a task's output that says what went wrong: an exception, an error from srun,
# slurmstepd or our task logger, a kill or a cancel.
ERROR_LINE = re.compile(
    r"\w+(Error|Exception)\b|\b(ERROR|error):|\bKilled\b|CANCELLED|OUT_OF_MEMORY|oom[-_]kill"
)


def _keep_job_id(ids: list[str], sbatch_output: str) -> str:
    """datatrove's job id retriever, also noting every id submitted."""
    job = sbatch_output.split()[-1]
    ids.append(job)
    return job


def task_environment(config: ExecutorConfig) -> tuple[str | None, str | None]:
    """(activate script, command) that give array tasks the build's Python environment:
    `env_command`, else `venv_path` or $VIRTUAL_ENV, else the interpreter running this."""
    if config.env_command:
        return None, config.env_command
    venv = config.venv_path or os.environ.get("VIRTUAL_ENV")
    if venv:
        return f"{venv}/bin/activate", None
    activate = Path(sys.prefix) / "bin" / "activate"
    if activate.is_file():
        return str(activate), None
    return None, f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"'


class LemurSlurmExecutor(LemurExecutor, SlurmPipelineExecutor):
    """datatrove's Slurm executor with the changes of the module docstring."""

    def __init__(self, config: ExecutorConfig, pipeline: list, tasks: int, logging_dir: str):
        self.job_ids: list[str] = []
        venv, env_command = task_environment(config)
        super().__init__(
            pipeline=pipeline,
            tasks=tasks,
            workers=config.workers,
            logging_dir=logging_dir,
            time=config.time,
            partition=config.partition,
            cpus_per_task=config.cpus_per_task,
            mem_per_cpu_gb=config.mem_per_cpu_gb,
            job_name=config.job_name,
            qos=None,
            sbatch_args=dict(config.sbatch_args or {}),
            venv_path=venv,
            env_command=env_command,
            condaenv=None,
            job_id_retriever=partial(_keep_job_id, self.job_ids),
        )

    def get_sbatch_args(self, max_array: int = 1) -> dict:
        """datatrove's directives, with the memory in megabytes (unless sbatch_args sets it)."""
        args = super().get_sbatch_args(max_array)
        if "mem-per-cpu" not in self._sbatch_args:
            args["mem-per-cpu"] = f"{math.ceil(self.mem_per_cpu_gb * 1024)}M"
        return args

    def launch_merge_stats(self) -> None:
        """No stats-merge job (see the module docstring)."""

    def submitted(self) -> list[str]:
        """The ids of every job this executor submitted (none before `run`)."""
        if self.job_ids:
            return list(self.job_ids)
        return [str(self.job_id)] if self.job_id not in (None, -1) else []

    def wait(
        self,
        work: Path,
        n_tasks: int,
        report: Reporter,
        stage: str = "tokenize",
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Wait until the stage's arrays finish every task; raise StageError if they stop short.

        Completion markers are looked at every 0.25 s, so a stage that is done is seen at
        once; squeue (is anything of ours still queued?) at 1 s, then doubling up to 30 s.
        """
        ids = self.submitted()
        interval = FIRST_QUEUE_CHECK
        next_check = clock() + interval
        while True:
            done = tasks_done(work)
            report(stage, done, n_tasks)
            if done >= n_tasks:
                return
            if clock() >= next_check:
                if ids and not still_queued(ids) and tasks_done(work) < n_tasks:
                    left = n_tasks - tasks_done(work)
                    detail = failed_task(self, work)
                    raise StageError(
                        f"{stage} stage: slurm job {ids[-1]} ended with {left} of {n_tasks} "
                        f"tasks unfinished; {detail or 'logs: ' + str(work / 'logs')}; "
                        "rerun to resubmit only those"
                    )
                interval = min(2 * interval, LAST_QUEUE_CHECK)
                next_check = clock() + interval
            sleep(MARKERS_EVERY)

    def cancel(self) -> None:
        """scancel every job this executor submitted (Slurm ignores those already finished)."""
        ids = self.submitted()
        if ids:
            try:
                subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                pass


def still_queued(job_ids: list[str]) -> bool:
    """Whether any of the jobs is pending or running; True when squeue cannot tell."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return True  # squeue unavailable for now: keep waiting on the completion markers
    if out.returncode != 0:  # jobs long gone are purged: "Invalid job id specified"
        return "invalid job id" not in out.stderr.lower()
    return bool(out.stdout.strip())


def first_error_line(path: Path) -> str:
    """The first line of a task's output that says what went wrong (else its last line)."""
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f.read(4 << 20).splitlines()]
    lines = [line for line in lines if line and not line.startswith("+ ")]  # `set -x` echo
    for line in lines:
        if ERROR_LINE.search(line) and "Traceback" not in line:
            return line
    return lines[-1] if lines else "(empty)"


def failed_task(executor: LemurSlurmExecutor, work: Path) -> str:
    """'task R: LINE (PATH)' for the first unfinished task that left an output file."""
    logs = work / "logs"
    try:
        ranks = json.loads((logs / "ranks_to_run.json").read_text())
    except (OSError, ValueError):
        return ""
    done = {p.name for p in (logs / "completions").glob("*")}
    ids = executor.submitted() or [str(executor.job_id)]
    size = max(1, executor.max_array_size)
    first = ""
    for i, rank in enumerate(ranks):
        if f"{rank:05d}" in done:
            continue
        job = ids[min(i // size, len(ids) - 1)]
        out = Path(executor.slurm_logs_folder) / f"{job}_{i % size}.out"
        if out.is_file():
            return f"task {rank}: {first_error_line(out)} ({out})"
        first = first or f"task {rank} left no output ({out})"
    return first

"""The recipe's `executor` section and its checks: each key's range, and the keys each engine
reads.

Kept apart from the executors so that checking a recipe imports neither datatrove nor Ray;
lemur.data.recipe.recipe takes the section from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lemur.data.recipe.errors import RecipeError

EXECUTORS = ("local", "ray", "slurm")

# `local`, `auto`, or host:port (a name, an IPv4 address or a bracketed IPv6 one)
_ADDRESS = re.compile(r"^(local|auto|(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):\d{1,5})$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the stages' tasks run: `local` (tasks x workers), `ray` or `slurm`.

    Every key, with an example per engine, is in docs/scale.md.
    """

    kind: str = "local"
    tasks: int = 4
    workers: int = 2
    cpus_per_task: int = 1
    mem_per_cpu_gb: float = 2.0
    # Ray: `local` (a private instance), `auto` or `host:port`; unset: $RAY_ADDRESS, else local.
    address: str | None = None
    # Ray: a task whose process or node is lost is run again this many times, then fails.
    retries: int = 1
    partition: str | None = None
    # Slurm's time limit of an array task; Ray: a task still running after it fails.
    time: str | None = None
    job_name: str = "lemur-data"
    sbatch_args: dict[str, str] | None = None
    venv_path: str | None = None
    env_command: str | None = None
    # Inputs bigger than this are read as several parts (lemur/data/read/split.py); 0: never.
    split_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        check_executor(self)


def time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit ("30", "MM:SS", "HH:MM:SS", "D-HH[:MM[:SS]]"); None for
    "infinite"/"unlimited"; ValueError for anything else."""
    if text.strip().lower() in ("infinite", "unlimited"):
        return None
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(text)
    days, a, b, c = m.groups()
    if days is None:  # minutes | minutes:seconds | hours:minutes:seconds
        parts = [int(x) for x in (a, b, c) if x is not None]
        h, mi, s = {1: (0, *parts, 0), 2: (0, *parts), 3: tuple(parts)}[len(parts)]
    else:  # days-hours | days-hours:minutes | days-hours:minutes:seconds
        h, mi, s = int(a), int(b or 0), int(c or 0)
    return ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s


def check_executor(ex: ExecutorConfig) -> None:
    """Raise RecipeError (one line, naming the key) for a bad `executor` section."""
    if ex.kind not in EXECUTORS:
        raise RecipeError(f"recipe: executor.kind {ex.kind!r} is not one of {', '.join(EXECUTORS)}")
    if ex.tasks < 1 or ex.workers < 1:
        raise RecipeError("recipe: executor.tasks and executor.workers must be >= 1")
    if ex.split_bytes < 0:
        raise RecipeError(
            f"recipe: executor.split_bytes must be >= 0 (0: never split), got {ex.split_bytes}"
        )
    if ex.cpus_per_task < 1 or not ex.mem_per_cpu_gb > 0:
        raise RecipeError("recipe: executor.cpus_per_task must be >= 1 and mem_per_cpu_gb > 0")
    if ex.retries < 0:
        raise RecipeError(f"recipe: executor.retries must be >= 0, got {ex.retries}")
    if ex.address is not None and ex.kind != "ray":
        raise RecipeError(f"recipe: executor.address is for kind ray, not {ex.kind}")
    if ex.address is not None and not _ADDRESS.match(ex.address):
        raise RecipeError(
            f"recipe: executor.address {ex.address!r} is not `local`, `auto` or host:port"
        )
    if ex.kind == "slurm" and (not ex.partition or not ex.time):
        raise RecipeError("recipe: executor.kind slurm needs executor.partition and executor.time")
    if ex.time is not None:
        try:
            time_seconds(ex.time)
        except ValueError:
            raise RecipeError(
                f"recipe: executor.time {ex.time!r} is not a Slurm time "
                "(MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
            ) from None

"""Ray: which instance a build uses, and an executor whose lost tasks fail or rerun in bounded time.

Which instance: `executor.address` (`local`: always a private instance started for this
build; `auto`: the cluster this node belongs to; `host:port`), else `$RAY_ADDRESS`, else
`local`. A private instance gets `workers x cpus_per_task` CPUs; a cluster's own resources
are used as they are (Ray refuses `num_cpus` when joining one).

Why our own executor rather than datatrove's `RayPipelineExecutor`: its `RankWorker` runs
each rank in a `multiprocess` pool inside the Ray worker, and when that child dies (the OOM
killer) the pool's `starmap` never returns, so the build hangs forever. Here a task runs in
the Ray worker process itself: when it dies, Ray fails the task (`WorkerCrashedError`,
`NodeDiedError`, `OutOfMemoryError`) within seconds and we run it again up to
`executor.retries` times, then fail the stage naming the task; `executor.time` bounds a
task that hangs. Finished tasks keep their completion markers, so a rerun resumes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from datatrove.executor.base import DistributedEnvVars, PipelineExecutor
from loguru import logger

from lemur.data.recipe.executor import ExecutorConfig, time_seconds
from lemur.data.run.datatrove_private import LemurExecutor

# Ray's errors for a task whose process, node or result was lost (not one that raised)
LOST = ("WorkerCrashedError", "NodeDiedError", "OutOfMemoryError", "LocalRayletDiedError")
LOST_RESULT = "ObjectLostError"  # and its subclasses (OwnerDiedError, ...)


class TaskFailed(RuntimeError):
    """A task of a stage failed or was lost for good (the message names it and why)."""


def ray_address(config: ExecutorConfig) -> str:
    """The address a build passes to `ray.init`: the recipe's, else $RAY_ADDRESS, else local."""
    return config.address or os.environ.get("RAY_ADDRESS") or "local"


def connect(config: ExecutorConfig, output: Path) -> None:
    """Join the recipe's Ray instance (see the module docstring) unless connected already;
    on joining, warn once when nodes on other hosts would write to a node-local `output`."""
    import ray

    if ray.is_initialized():
        return
    address = ray_address(config)
    private = {"num_cpus": config.workers * config.cpus_per_task, "include_dashboard": False}
    ray.init(address=address, log_to_driver=False, **(private if address == "local" else {}))
    hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    problem = node_local_problem(hosts, ray.util.get_node_ip_address(), output)
    if problem:
        logger.warning(problem)


@contextmanager
def ray_session() -> Iterator[None]:
    """Disconnect at the end of a build from the instance its first Ray stage joined (a
    caller's own connection, made before, stays theirs)."""
    import ray

    ours = not ray.is_initialized()
    try:
        yield
    finally:
        if ours and ray.is_initialized():
            ray.shutdown()


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding `path` (longest mount point in /proc/mounts)."""
    path = path.resolve()
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == Path(point) or Path(point) in path.parents
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


# Filesystems that live on one machine; anything else (nfs, lustre, gpfs, cephfs, fuse
# mounts of buckets, ...) may be shared, and an unknown type gets the benefit of the doubt.
NODE_LOCAL = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "f2fs", "ramfs", "vfat"}


def node_local_problem(hosts: set[str], here: str, output: Path, fs: str | None = None) -> str:
    """The one-line warning for a cluster with nodes on other hosts than `here` writing to
    `output` on a node-local filesystem; "" when that is not the case."""
    others = sorted(h for h in hosts if h != here)
    fs = fs or filesystem_type(output)
    if not others or fs not in NODE_LOCAL:
        return ""
    return (
        f"ray: {output} is on a node-local filesystem ({fs}) but the cluster has nodes on "
        f"{len(others)} other host(s) ({', '.join(others[:3])}): their tasks cannot see it; "
        "put the output on storage every node mounts (NFS, Lustre, ...)"
    )


def _run_rank(executor: LemurRayExecutor, rank: int) -> None:
    """A Ray task: run one rank in this worker process (its death is the task's)."""
    executor.run_task(rank)


def _lost(error: BaseException) -> str | None:
    """Why a task's process/node/result was lost (first line of Ray's message), else None."""
    names = {c.__name__ for c in type(error).__mro__}
    if not names & {*LOST, LOST_RESULT}:
        return None
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"{type(error).__name__}: {first[:200]}"


def _raised(error: BaseException) -> str:
    """One line for a task that raised: the exception's type and first line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0][:200] if text else ''}".rstrip(": ")


class LemurRayExecutor(LemurExecutor, PipelineExecutor):
    """Runs a stage's incomplete ranks as Ray tasks, `workers` at a time, spread over nodes."""

    def __init__(
        self,
        pipeline: list,
        tasks: int,
        workers: int,
        logging_dir: str,
        stage: str = "stage",
        cpus_per_task: int = 1,
        mem_per_cpu_gb: float = 2.0,
        retries: int = 1,
        time_limit: str | None = None,
    ) -> None:
        super().__init__(pipeline, logging_dir, skip_completed=True)
        self.tasks, self.workers, self.stage = tasks, workers, stage
        self.cpus_per_task, self.mem_per_cpu_gb = cpus_per_task, mem_per_cpu_gb
        self.retries, self.time_limit = retries, time_limit

    @property
    def world_size(self) -> int:
        """The stage's number of tasks."""
        return self.tasks

    def get_distributed_env(self, node_rank: int = -1) -> DistributedEnvVars:
        """datatrove's per-task environment (one node per task here)."""
        return DistributedEnvVars(
            datatrove_node_ips="",
            datatrove_cpus_per_task=str(self.cpus_per_task),
            datatrove_mem_per_cpu=str(self.mem_per_cpu_gb),
            datatrove_gpus_on_node="0",
            datatrove_executor="RAY",
        )

    def run(self) -> None:
        """Run every incomplete rank; raise TaskFailed at the first task that fails for good."""
        import ray

        ranks = self.get_incomplete_ranks()
        if not ranks:
            return
        self.save_executor_as_json()
        me = ray.put(self)
        task = ray.remote(_run_rank).options(
            num_cpus=self.cpus_per_task,
            memory=int(self.mem_per_cpu_gb * self.cpus_per_task * 2**30),
            max_retries=0,  # we retry lost tasks ourselves, saying so
            scheduling_strategy="SPREAD",
        )
        limit = time_seconds(self.time_limit) if self.time_limit else None
        queue = deque((rank, 0) for rank in ranks)
        running: dict[Any, tuple[int, int, float]] = {}  # ref -> (rank, attempt, submitted)
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    rank, attempt = queue.popleft()
                    running[task.remote(me, rank)] = (rank, attempt, time.monotonic())
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in done:
                    rank, attempt, _ = running.pop(ref)
                    self._settle(ref, rank, attempt, queue)
                self._check_time(running, limit)
        finally:
            for ref in running:  # a failure elsewhere, or Ctrl-C: stop what still runs
                ray.cancel(ref, force=True)

    def _settle(self, ref: Any, rank: int, attempt: int, queue: deque) -> None:
        """Take a finished task's outcome: done, rerun (lost, retries left), or TaskFailed."""
        import ray

        try:
            ray.get(ref)
            return
        except Exception as e:  # noqa: BLE001 - sorted below into lost and raised
            lost = _lost(e)
            if lost is None:
                raise TaskFailed(f"task {rank} failed: {_raised(e)}") from None
        if attempt < self.retries:
            logger.warning(
                f"ray: {self.stage} task {rank} lost ({lost}); running it again "
                f"({attempt + 1} of executor.retries {self.retries})"
            )
            queue.append((rank, attempt + 1))
            return
        raise TaskFailed(
            f"task {rank} lost ({lost}) after {attempt} of executor.retries {self.retries}; "
            "rerun to resume"
        )

    def _check_time(self, running: dict, limit: int | None) -> None:
        """Fail a task still running `executor.time` after it was handed to Ray."""
        if limit is None:
            return
        now = time.monotonic()
        for rank, _, submitted in running.values():
            if now - submitted > limit:
                raise TaskFailed(
                    f"task {rank} still running after executor.time {self.time_limit}; "
                    "stopped it (rerun to resume, or raise executor.time)"
                )

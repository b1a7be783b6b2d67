"""Builds on real clusters started on this host: a 2-node Ray cluster and a one-node Slurm.

Marked `cluster` (deselect with `-m "not cluster"` for a quick loop). The Ray cluster is
started here and stopped by its process groups at the end (tools/localcluster.py); Slurm
is the one `.ci/slurm-up` starts (as root): without it the Slurm tests skip, saying why.
Every build runs as a `lemur-data` process, without an activated virtualenv (as a plain
`.venv/bin/lemur-data` runs), and every wait is bounded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import real_python_files, real_text_docs, slurm_executor, write_jsonl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from localcluster import RayCluster  # noqa: E402

pytestmark = pytest.mark.cluster
BUILD_TIMEOUT = 300  # s: a small build takes well under a minute on any engine

# A build whose tokenize task `at` stops, on its first run only, until it is killed: it
# writes the pid of the process running it to <pause>/pid. The step's class is defined in
# __main__, so Ray (cloudpickle) and Slurm (dill) ship it by value to their workers; dill
# leaves out __main__'s globals, hence the imports inside and the class attributes.
PAUSER = """
import sys
from lemur.data.stages import reading as reading_stage
from lemur.data.cli import main
from lemur.data.encode.step import TokenizeWriter

class PausingWriter(TokenizeWriter):
    pause, at = sys.argv[2], int(sys.argv[3])

    def run(self, data, rank=0, world_size=1):
        import os, time
        from pathlib import Path

        pid = Path(self.pause) / "pid"
        if rank == self.at and not pid.exists():
            pid.with_suffix(".tmp").write_text(str(os.getpid()))
            pid.with_suffix(".tmp").rename(pid)
            time.sleep(600)
        yield from super().run(data, rank, world_size)

reading_stage.TokenizeWriter = PausingWriter
sys.exit(main(["build", sys.argv[1]]))
"""


STARTED: list[subprocess.Popen] = []  # build processes a test started in the background


@pytest.fixture(autouse=True, scope="module")
def no_leftover_builds():
    """Kill any background build a failed test left running (its Slurm jobs are cancelled
    by the `slurm` fixture, its Ray tasks die with it)."""
    yield
    for proc in STARTED:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def environment() -> dict[str, str]:
    """This environment without an activated virtualenv, Ray address or venv on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "RAY_ADDRESS")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["HF_HUB_OFFLINE"] = "1"
    return env


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Sources, and the shards of their build on the local executor."""
    root = tmp_path_factory.mktemp("corpus")
    code = root / "code"
    code.mkdir()
    for p in real_python_files(20):
        (code / p.name).write_bytes(p.read_bytes())
    write_jsonl(root / "text.jsonl", real_text_docs(40))
    out = root / "local"
    done = run_build(write_recipe(root, out, {"kind": "local", "tasks": 2, "workers": 2}), root)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"root": root, "shards": shard_bytes(out)}


def write_recipe(root: Path, out: Path, executor: dict) -> Path:
    """A small two-source recipe (near-dup off: one dedup task) for `executor`."""
    recipe = {
        "output": str(out),
        "seed": 5,
        "val_fraction": 0.05,
        "shard_tokens": 30_000,
        "tokenizer": {"train": {"vocab_size": 500, "sample_bytes": 200_000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "dedup": {"near": False},
        "executor": executor,
        "sources": [
            {"name": "py", "domain": "code", "format": "files", "paths": [str(root / "code")]},
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(root / "text.jsonl")],
            },
        ],
    }
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_build(recipe: Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`lemur-data build RECIPE` in a process of its own, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(recipe)],
        cwd=cwd,
        env=env or environment(),
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
    )


def shard_bytes(out: Path) -> list[bytes]:
    """Every shard file of a finished build, in manifest order."""
    manifest = yaml.safe_load((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def start_paused(recipe: Path, pause: Path, at: int, env: dict) -> tuple[subprocess.Popen, int]:
    """Start the PAUSER build; (the process, pid of the process running task `at`)."""
    pause.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSER, str(recipe), str(pause), str(at)],
        cwd=pause,
        env=env,
        stdout=open(pause / "stdout", "w"),
        stderr=open(pause / "stderr", "w"),
    )
    STARTED.append(proc)
    deadline = time.monotonic() + BUILD_TIMEOUT
    while not (pause / "pid").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"task {at} never started: {(pause / 'stderr').read_text()[-3000:]}")
        time.sleep(0.2)
    return proc, int((pause / "pid").read_text())


def finish(proc: subprocess.Popen, within: float) -> int:
    """The exit status of `proc`; fails the test (killing it) if it runs past `within` s."""
    try:
        return proc.wait(within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the build was still running {within:.0f} s later: it hangs")


def alive(pid: int) -> bool:
    """Whether process `pid` runs (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ----------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A 2-node Ray cluster on localhost (nodes `lemur_node0`, `lemur_node1`), started
    while the local reference build runs, and stopped by its process groups."""
    pytest.importorskip("ray")
    cluster = RayCluster(nodes=2, env={"PYTHONPATH": environment()["PYTHONPATH"]})
    failed: list[BaseException] = []

    def start() -> None:
        try:
            cluster.start()
        except BaseException as e:  # noqa: BLE001 - reported in the test's thread
            failed.append(e)

    starting = threading.Thread(target=start)
    starting.start()
    try:
        request.getfixturevalue("corpus")
    finally:
        starting.join(400)  # RayCluster.start gives up after 2 x 180 s
    try:
        if failed or starting.is_alive():
            pytest.fail(f"the Ray cluster did not start: {failed[0] if failed else 'timeout'}")
        nodes = cluster.node_ids()
        assert sorted(nodes.values()) == ["lemur_node0", "lemur_node1"], nodes
        yield cluster, nodes
    finally:
        cluster.stop()


def ray_env(cluster: RayCluster) -> dict[str, str]:
    """A build's environment on this host where `cluster` is the recorded Ray cluster."""
    return {**environment(), "RAY_TMPDIR": cluster.env["RAY_TMPDIR"], "RAY_AUTH_MODE": "disabled"}


def task_nodes(out: Path) -> set[str]:
    """The Ray nodes that ran the build's tokenize and dedup tasks, from their task logs."""
    found = set()
    for log in out.glob(".work/tokens-*/**/logs/task_*.log"):
        found |= set(re.findall(r"ray node ([0-9a-f]+), pid", log.read_text()))
    return found


def test_a_killed_ray_task_fails_its_stage_then_the_rerun_completes(ray_cluster, corpus):
    cluster, nodes = ray_cluster
    root = corpus["root"]
    out = root / "ray"
    executor = {"kind": "ray", "tasks": 2, "workers": 2, "address": cluster.address, "retries": 0}
    recipe = write_recipe(root, out, executor)
    proc, pid = start_paused(recipe, root / "ray-pause", 1, ray_env(cluster))
    os.kill(pid, signal.SIGKILL)  # what the OOM killer does to the task's process
    assert finish(proc, within=120) == 1  # it used to hang here forever
    err = (root / "ray-pause" / "stderr").read_text()
    message = [line for line in err.splitlines() if line.startswith("lemur-data: error:")]
    assert len(message) == 1, err[-3000:]
    assert message[0].startswith("lemur-data: error: tokenize stage failed: task 1 lost (")
    assert "after 0 of executor.retries 0; rerun to resume" in message[0]
    assert "Logging directory points to a local filesystem" not in err

    rerun = run_build(recipe, root, ray_env(cluster))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert shard_bytes(out) == corpus["shards"]
    assert task_nodes(out) == set(nodes)  # tasks ran on both nodes of the cluster


RETRIED = """
import os, sys, time
from pathlib import Path
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.executors import make_executor

address, pause = sys.argv[1], Path(sys.argv[2])

def step(data, rank, world_size):  # stops on its first run only, until killed
    if not (pause / "pid").exists():
        (pause / "pid.tmp").write_text(str(os.getpid()))
        (pause / "pid.tmp").rename(pause / "pid")
        time.sleep(600)
    return None

config = ExecutorConfig(kind="ray", address=address, workers=1, retries=1)
make_executor(config, [step], 1, pause / "logs", "demo").run()
print("finished:", sorted(p.name for p in (pause / "logs" / "completions").iterdir()))
"""


def test_a_lost_ray_task_is_run_again_saying_so(ray_cluster, tmp_path):
    cluster, _ = ray_cluster
    pause = tmp_path / "pause"
    pause.mkdir()
    env = ray_env(cluster)
    proc = subprocess.Popen(
        [sys.executable, "-c", RETRIED, cluster.address, str(pause)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    STARTED.append(proc)
    deadline = time.monotonic() + 120
    while not (pause / "pid").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (pause / "pid").exists(), proc.stderr.read() if proc.poll() is not None else ""
    os.kill(int((pause / "pid").read_text()), signal.SIGKILL)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the lost task was neither run again nor failed within 120 s")
    assert proc.returncode == 0, stderr[-3000:]
    assert "finished: ['00000']" in stdout
    warnings = [line for line in stderr.splitlines() if "demo task 0 lost" in line]
    assert len(warnings) == 1 and "running it again (1 of executor.retries 1)" in warnings[0]


NODE = """
import pathlib, ray
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.executors import make_executor
make_executor(ExecutorConfig(kind="ray", workers=1), [], 1, pathlib.Path("logs"))
print(ray.get_runtime_context().get_node_id())
"""


def test_ray_without_an_address_is_private_and_ray_address_joins(ray_cluster, tmp_path):
    cluster, nodes = ray_cluster
    env = ray_env(cluster)  # `ray start` recorded the cluster: a bare ray.init() would join it

    def node(extra: dict) -> str:
        done = subprocess.run(
            [sys.executable, "-c", NODE],
            cwd=tmp_path,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:]  # was: ValueError (num_cpus given)
        return done.stdout.split()[-1]

    assert node({}) not in nodes  # a private local instance
    assert node({"RAY_ADDRESS": cluster.address}) in nodes  # the fallback joins


# ----------------------------------------------------------------------------- Slurm


def queued(name: str, within: float = 30) -> list[str]:
    """Jobs of this name still in the queue `within` s from now (empty as soon as none)."""
    deadline = time.monotonic() + within
    while True:
        out = subprocess.run(
            ["squeue", "-h", "-n", name, "-o", "%i %T %r"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.split("\n")
        jobs = [line for line in out if line.strip()]
        if not jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(0.5)


def test_a_killed_slurm_task_fails_its_stage_and_only_it_is_resubmitted(slurm, corpus):
    partition, name = slurm
    root = corpus["root"]
    out = root / "slurm"
    recipe = write_recipe(root, out, slurm_executor(partition, name))
    proc, pid = start_paused(recipe, root / "slurm-pause", 1, environment())
    os.kill(pid, signal.SIGKILL)
    assert finish(proc, within=120) == 1
    err = (root / "slurm-pause" / "stderr").read_text()
    message = [line for line in err.splitlines() if line.startswith("lemur-data: error:")]
    assert len(message) == 1, err[-3000:]
    m = re.match(
        r"lemur-data: error: tokenize stage: slurm job (\d+) ended with 1 of 2 tasks "
        r"unfinished; task 1: (.+) \((\S+)\); rerun to resubmit only those$",
        message[0],
    )
    assert m, message[0]
    job, line, path = m.groups()
    assert path.endswith(f"logs/slurm_logs/{job}_1.out") and Path(path).is_file()
    assert "Killed" in line or "signal 9" in line, line
    assert queued(name) == []  # nothing left pending (datatrove's merge_stats waited forever)

    rerun = run_build(recipe, root)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert shard_bytes(out) == corpus["shards"]
    logs = next(out.glob(".work/tokens-*/logs"))
    assert yaml.safe_load((logs / "ranks_to_run.json").read_text()) == [1]  # only that task
    assert "#SBATCH --array=0-0%2" in (logs / "launch_script.slurm").read_text()
    assert "#SBATCH --mem-per-cpu=512M" in (logs / "launch_script.slurm").read_text()
    assert queued(name) == []


def test_ctrl_c_cancels_the_slurm_jobs_of_the_build(slurm, corpus):
    partition, name = slurm
    root = corpus["root"]
    recipe = write_recipe(root, root / "slurm-int", slurm_executor(partition, name))
    proc, pid = start_paused(recipe, root / "slurm-int-pause", 1, environment())
    proc.send_signal(signal.SIGINT)
    assert finish(proc, within=60) == 130
    assert queued(name) == []  # the running array was cancelled
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(pid)  # and its paused task is gone

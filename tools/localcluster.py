"""Real clusters on this host, for the cluster tests and tools/bench_engines.py.

- `RayCluster`: a Ray cluster of N nodes on localhost (`ray start --head`, then `ray start
  --address`), one CPU and one custom resource (`lemur_node0`, `lemur_node1`, ...) per node. Each
  `ray start` runs in its own session, so that every process it starts (GCS, raylet,
  workers, agents) is in one process group, stopped by that group id, never by name (other
  Ray instances on the machine are left alone). Its temp dir is `<root>/ray`, so it
  records itself in `<root>/ray/ray_current_cluster`: processes given `RAY_TMPDIR=<root>`
  see it as "the cluster this node belongs to", others do not. Token authentication is
  off (`RAY_AUTH_MODE=disabled`): the cluster listens on localhost only; give its drivers
  `cluster.env`.
- `slurm_problem()`: why the one-node Slurm of `.ci/slurm-up` cannot be used, or "".

`python tools/localcluster.py stop-all` stops every Ray cluster these helpers started that
is still running (their group ids are kept in `<tmp>/lemur-ray-*/pgids`); `.ci/run` calls it
on exit, in case a test run was killed before its own clean-up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT_PREFIX = "lemur-ray-"
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs (zombies waiting to be reaped do not)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            return True
    return False


def kill_groups(pgids: list[int], timeout: float = 20.0) -> None:
    """SIGKILL each process group and wait (bounded) until it is gone."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(_group_alive(p) for p in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)


class RayCluster:
    """A Ray cluster of `nodes` one-CPU nodes on localhost (see the module docstring)."""

    def __init__(self, nodes: int = 2, env: dict[str, str] | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=ROOT_PREFIX))  # short: Ray's socket paths
        self.nodes, self.port = nodes, free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Token auth off, stated: Ray 2.60's `ray start --head` turns it on when a
        # ~/.ray/auth_token exists (any earlier local `ray.init()` writes one), but
        # `ray start --address` does not, and then cannot join (InvalidAuthToken).
        self.env = {
            **os.environ,
            **(env or {}),
            "RAY_TMPDIR": str(self.root),
            "RAY_AUTH_MODE": "disabled",
        }
        self.env.pop("RAY_ADDRESS", None)
        self.pgids: list[int] = []

    def _ray_start(self, args: list[str], timeout: float) -> None:
        log = open(self.root / f"start-{len(self.pgids)}.log", "w")
        proc = subprocess.Popen(
            [str(BIN / "ray"), "start", *args, "--disable-usage-stats"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: ours to kill
        )
        self.pgids.append(proc.pid)
        (self.root / "pgids").write_text("".join(f"{p}\n" for p in self.pgids))
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = f"still running after {timeout:.0f} s"
        if rc != 0:
            tail = (self.root / f"start-{len(self.pgids) - 1}.log").read_text()[-2000:]
            raise RuntimeError(f"ray start {' '.join(args[:2])}: {rc}\n{tail}")

    def start(self, timeout: float = 180.0) -> RayCluster:
        """Start the head, then the other nodes; raise (after stopping all) on failure."""
        try:
            self._ray_start(
                [
                    "--head",
                    f"--port={self.port}",
                    "--num-cpus=1",
                    "--include-dashboard=false",
                    f"--temp-dir={self.root / 'ray'}",
                    f"--resources={json.dumps({'lemur_node0': 1})}",
                ],
                timeout,
            )
            for i in range(1, self.nodes):
                self._ray_start(
                    [
                        f"--address={self.address}",
                        "--num-cpus=1",
                        f"--resources={json.dumps({f'lemur_node{i}': 1})}",
                    ],
                    timeout,
                )
        except BaseException:
            self.stop()
            raise
        return self

    def node_ids(self, timeout: float = 120.0) -> dict[str, str]:
        """{Ray node id: `lemur_nodeK`} of the live nodes, asked from a separate driver."""
        code = (
            "import json, ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False)\n"
            "print(json.dumps({n['NodeID']: [r for r in n['Resources']"
            " if r.startswith('lemur_node')] for n in ray.nodes() if n['Alive']}))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
        found = json.loads(out.stdout.strip().splitlines()[-1])
        return {node: names[0] for node, names in found.items() if names}

    def stop(self) -> None:
        """Kill every process the cluster started (by group) and remove its directory."""
        kill_groups(self.pgids)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all() -> int:
    """Stop the Ray clusters of every `<tmp>/lemur-ray-*` left behind; how many groups."""
    pgids = []
    for root in Path(tempfile.gettempdir()).glob(f"{ROOT_PREFIX}*"):
        try:
            pgids += [int(x) for x in (root / "pgids").read_text().split()]
        except (OSError, ValueError):
            pass
        shutil.rmtree(root, ignore_errors=True)
    alive = [p for p in pgids if _group_alive(p)]
    kill_groups(alive)
    return len(alive)


def slurm_partition() -> str:
    """The default partition of the local Slurm ("" when sinfo cannot say)."""
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for name in out.stdout.split():
        if name.endswith("*"):
            return name[:-1]
    return out.stdout.split()[0] if out.stdout.split() else ""


def slurm_problem() -> str:
    """Why the local Slurm cannot run our array jobs ("" when it can)."""
    missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        return (
            f"no {', '.join(missing)} on PATH: Slurm is not installed "
            "(.ci/slurm-up installs it, as root)"
        )
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 30 s: slurmctld is not responding"
    if out.returncode != 0:
        said = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return f"Slurm is not running (sinfo: {said}); .ci/slurm-up starts it, as root"
    states = set(out.stdout.split())
    if not states & {"idle", "mix", "alloc"}:
        return f"no Slurm node is up (states: {', '.join(sorted(states)) or 'none'})"
    return ""


if __name__ == "__main__":
    if sys.argv[1:] == ["stop-all"]:
        print(f"localcluster: stopped {stop_all()} leftover Ray process group(s)")
    else:
        sys.exit("usage: python tools/localcluster.py stop-all")

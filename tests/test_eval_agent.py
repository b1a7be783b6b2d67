"""The agent loop with scripted replies: feedback per mode, success accounting, the sandbox
outcomes (wrong then right, never right, no code, a hang, an early exit), resume."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import write_jsonl

from lemur.eval import agent, agent_report, agent_tasks, sandbox
from lemur.eval.humaneval import humaneval_tasks

needs_network = pytest.mark.skipif(
    not sandbox.probe().network, reason="no network namespaces: the sandbox refuses"
)
LIMITS = sandbox.Limits(timeout_s=1.5, cpu_s=2)
MBPP = [  # MBPP's shape: text, test_list, optional test_setup_code
    {"task_id": "fix", "text": "Add two numbers.", "test_list": ["assert add(2, 3) == 5"]},
    {
        "task_id": "never",
        "text": "Double a number.",
        "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
    },
    {
        "task_id": "nocode",
        "text": "Scale by the factor.",
        "test_setup_code": "FACTOR = 3",
        "test_list": ["assert scale(2) == 6"],
    },
    {"task_id": "hang", "text": "Return one.", "test_list": ["assert one() == 1"]},
]


def block(code: str) -> str:
    return f"Here you go:\n```python\n{code}\n```\nDone."


HE0 = humaneval_tasks()[0]
SCRIPT = {  # replies per task, turn by turn
    HE0.task_id: [block(HE0.prompt + HE0.canonical_solution)],
    "fix": [block("def add(a, b):\n    return a - b"), block("def add(a, b):\n    return a + b")],
    "never": [block("def double(x):\n    return x")] * 3,
    "nocode": [
        "I would scale it.",
        '```json\n{"scale": 3}\n```',
        block("def scale(x):\n    return FACTOR * x"),
    ],
    "hang": [
        block("def one():\n    while True:\n        pass\none()"),
        block("import sys\nsys.exit(0)"),
        block("import os\nos._exit(0)"),
    ],
}


class Scripted:
    """Canned replies per task and turn; records what it was asked."""

    def __init__(self, capacity: int = 2) -> None:
        self.capacity = capacity
        self.asked: list[tuple[str, int]] = []
        self.live: set[str] = set()

    def reply(self, conversations: Sequence[agent.Conversation]) -> list[agent.Reply]:
        assert len(conversations) <= self.capacity
        out = []
        for c in conversations:
            turn = len(c.turns)
            self.asked.append((c.task.task_id, turn + 1))
            self.live.add(c.task.task_id)
            out.append(agent.Reply(SCRIPT[c.task.task_id][turn], "stop", tokens=10))
        return out

    def release(self, task_id: str) -> None:
        self.live.remove(task_id)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> list[agent_tasks.AgentTask]:
    path = write_jsonl(tmp_path_factory.mktemp("tasks") / "mbpp.jsonl", MBPP)
    return [agent_tasks.from_humaneval(HE0), *agent_tasks.load_agent_tasks(str(path))]


def run(tasks, out: Path, feedback: str = "exec", source: Scripted | None = None) -> list[dict]:
    config = agent.AgentConfig(turns=3, feedback=feedback, limits=LIMITS)
    return agent.run_agent(tasks, source or Scripted(), config, out)


def strip_times(records: list[dict]) -> list[dict]:
    for r in records:
        for t in r["turn_records"]:
            t.pop("exec_s"), t.pop("generate_s")
    return records


@needs_network
def test_outcomes_and_success_by_turn(tasks, tmp_path: Path) -> None:
    source = Scripted()
    records = run(tasks, tmp_path, source=source)
    statuses = {r["task_id"]: [t["status"] for t in r["turn_records"]] for r in records}
    assert statuses == {
        HE0.task_id: ["passed"],
        "fix": ["failed", "passed"],
        "never": ["failed", "failed", "failed"],
        "nocode": ["no_code", "no_code", "passed"],
        "hang": ["timeout", "ended_early", "ended_early"],
    }
    assert [(r["solved_at"], r["ended"]) for r in records] == [
        (1, "solved"),
        (2, "solved"),
        (None, "out_of_turns"),
        (3, "solved"),
        (None, "out_of_turns"),
    ]
    summary = agent_report.summarize(records, 3)
    assert summary["success_rate_by_turn"] == [0.2, 0.4, 0.6]
    assert summary["mean_turns_to_success"] == 2.0 and summary["solved"] == 3
    assert summary["ended"] == {"out_of_turns": 2, "solved": 3}
    assert not source.live  # every conversation released
    fix = records[1]
    assert [m["role"] for m in fix["messages"]] == ["user", "assistant", "user", "assistant"]
    assert fix["turn_records"][0]["code"] == "def add(a, b):\n    return a - b\n"
    observation = fix["messages"][2]["content"]
    assert observation == fix["turn_records"][0]["observation"]
    assert observation.startswith("The tests failed.\nError output (last lines):\n```\n")
    assert observation.endswith(
        "    assert add(2, 3) == 5\nAssertionError\n```\n" + agent_tasks.RETRY
    )
    hang = records[4]["turn_records"]
    assert hang[0]["observation"] == f"Execution timed out after 1.5 s.\n{agent_tasks.RETRY}"
    assert hang[1]["observation"] == (
        "The program exited (status 0) before the tests finished.\n" + agent_tasks.RETRY
    )
    nocode = records[3]["turn_records"][0]["observation"]
    assert nocode == f"Your reply has no ```python code block.\n{agent_tasks.RETRY}"


@needs_network
@pytest.mark.parametrize(
    "mode, text",
    [
        ("binary", f"Your answer is wrong.\n{agent_tasks.RETRY}"),
        ("none", agent_tasks.RETRY),
    ],
)
def test_binary_and_none_feedback_say_only_that(tasks, tmp_path: Path, mode, text) -> None:
    records = run(tasks[1:3], tmp_path, feedback=mode)
    sent = [m["content"] for r in records for m in r["messages"][1:] if m["role"] == "user"]
    assert sent == [text] * 3  # fix: one retry; never: two


@needs_network
def test_resume_redoes_only_unfinished_tasks(tasks, tmp_path: Path) -> None:
    full = strip_times(run(tasks, tmp_path / "full"))
    lines = (tmp_path / "full" / "transcripts.jsonl").read_text().splitlines(keepends=True)
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    (crashed / "run.json").write_text((tmp_path / "full" / "run.json").read_text())
    (crashed / "transcripts.jsonl").write_text("".join(lines[:2]) + lines[2][:40])  # torn
    done = {json.loads(line)["task_id"] for line in lines[:2]}
    source = Scripted()
    resumed = strip_times(run(tasks, crashed, source=source))
    assert {t for t, _ in source.asked} == {t.task_id for t in tasks} - done
    assert resumed == full
    assert len((crashed / "transcripts.jsonl").read_text().splitlines()) == len(tasks)
    with pytest.raises(ValueError, match=r"other settings \(feedback\)"):
        run(tasks, crashed, feedback="binary")


def test_code_extraction() -> None:
    two = "```python\nfirst\n```\ntext\n```py\nsecond\n```"
    assert agent_tasks.extract_code(two) == "second\n"
    assert agent_tasks.extract_code("see:\n```python\ncut by the length") == "cut by the length"
    assert agent_tasks.extract_code("```\nbare\n```") == "bare\n"
    assert agent_tasks.extract_code("```json\n{}\n```") is None
    assert agent_tasks.extract_code("no code") is None


@pytest.mark.parametrize(
    "row, error",
    [
        ('{"text": "t", "test_list": []}', "test_list must be a non-empty list"),
        ('{"text": "t", "test_list": ["x = 1"]}', "calls no function"),
        ('{"prompt": "p", "test": "t"}', "no string entry_point"),
        ("[1]", "not a JSON object"),
        ("{oops", "not JSON"),
    ],
)
def test_bad_task_files_name_the_line(tmp_path: Path, row: str, error: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(MBPP[0]) + "\n" + row + "\n")
    with pytest.raises(ValueError, match=f"^{path}:2: .*{error}"):
        agent_tasks.load_agent_tasks(str(path))


def test_plot_one_line_per_feedback_mode(tmp_path: Path) -> None:
    for mode, rates in (("exec", [0.2, 0.4]), ("binary", [0.2, 0.3])):
        (tmp_path / mode).mkdir()
        agent_report.write_summary(
            tmp_path / mode, {"feedback": mode, "success_rate_by_turn": rates}
        )
    png = agent_report.plot([tmp_path / "exec", tmp_path / "binary"], tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="not an agent run summary"):
        agent_report.plot([tmp_path / "p.png"], tmp_path / "q.png")

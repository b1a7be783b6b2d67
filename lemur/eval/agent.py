"""Multi-turn agent evaluation with execution feedback (MINT-style), resumable.

Each task is a conversation: the task statement is the user turn, the model replies, the
last fenced Python block of the reply runs with the task's tests in the sandbox
(lemur.eval.agent_tasks), and while it fails and turns remain, the feedback goes back as
the next turn (`exec`: what went wrong; `binary`: only that it is wrong; `none`: only a
retry request). Up to `batch_size` conversations run at once: every round each live
conversation gets its next reply (`Replies.reply`, one batched call), their code runs in
parallel, and finished conversations leave and free their place for the next task.

Where replies come from is a `Replies`: `ModelReplies` decodes with the KV cache kept per
conversation across turns (lemur.eval.agent_decode); tests script replies.

Every finished conversation is one line of `transcripts.jsonl` (each message, the code
run, the observation, timings), appended as it finishes, so a rerun with the same
settings (`run.json`) skips the tasks already there; `summary.json` is rewritten from all
lines at the end (lemur.eval.agent_report).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from lemur.atomic_files import atomic_write_text
from lemur.cli_common import UserError
from lemur.eval import sandbox
from lemur.eval.agent_tasks import (
    FEEDBACK_MODES,
    AgentTask,
    Execution,
    execute,
    extract_code,
    feedback,
)
from lemur.eval.chat_prompt import ChatPrompt, chat_prompt_ids
from lemur.eval.decoding import GenerationConfig
from lemur.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Turn budget, feedback, roles and the sandbox of one agent run."""

    turns: int = 5
    feedback: str = "exec"
    observation_role: str = "user"  # the role feedback turns take (`tool`: an observation)
    system: str | None = None
    limits: sandbox.Limits = sandbox.Limits(timeout_s=10.0, cpu_s=10)
    allow_network: bool = False
    workers: int | None = None
    record_ids: bool = False  # each turn's prompt ids in the transcript

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns}")
        if self.feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {', '.join(FEEDBACK_MODES)}")
        if self.observation_role not in ("user", "tool"):
            raise ValueError("observation_role must be user or tool")

    def settings(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues."""
        return {
            "turns": self.turns,
            "feedback": self.feedback,
            "observation_role": self.observation_role,
            "system": self.system,
            "timeout_s": self.limits.timeout_s,
        }


@dataclasses.dataclass
class Reply:
    """One generated reply and what it cost."""

    text: str
    finish: str  # stop, eos, length, or context (no room left in max_seq_len: not generated)
    tokens: int = 0
    prompt_tokens: int = 0
    prefilled: int = 0  # prompt tokens run through the model this turn (the rest was cached)
    prompt_ids: list[int] | None = None


@dataclasses.dataclass
class Conversation:
    """A task's conversation so far."""

    task: AgentTask
    messages: list[dict[str, str]]
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    solved_at: int | None = None
    ended: str | None = None  # solved, out_of_turns, context_full

    def record(self) -> dict[str, Any]:
        """The transcript line of a finished conversation."""
        return {
            "task_id": self.task.task_id,
            "solved": self.solved_at is not None,
            "solved_at": self.solved_at,
            "ended": self.ended,
            "turns": len(self.turns),
            "messages": self.messages,
            "turn_records": self.turns,
        }


class Replies(Protocol):
    """Where replies come from: a batch of conversations in, one reply each out."""

    capacity: int

    def reply(self, conversations: Sequence[Conversation]) -> list[Reply]:
        """The next assistant reply of each conversation."""
        ...

    def release(self, task_id: str) -> None:
        """The conversation is over (its cache row can go to the next one)."""
        ...


def prompt_ids(tokenizer: Tokenizer, messages: ChatPrompt) -> list[int]:
    """The model's prompt for the conversation so far, ending where the reply starts.

    The one place a conversation becomes ids: ChatML (`generate.chat_prompt_ids`, the ids
    the chat build trains on and the to-hf template gives) for lemur's SentencePiece chat
    models; the model's own template belongs here for tokenizer.json models.
    """
    return chat_prompt_ids(tokenizer, messages)


class ModelReplies:
    """Replies from a lemur model, each conversation's KV cache kept across its turns."""

    def __init__(
        self,
        params: Any,
        config: Any,
        tokenizer: Tokenizer,
        gen: GenerationConfig,
        *,
        reuse: bool = True,
        record_ids: bool = False,
    ) -> None:
        from lemur.chatml import IM_END
        from lemur.eval.agent_decode import TurnDecoder

        gen = dataclasses.replace(gen, stop=(*gen.stop, IM_END))
        self.decoder = TurnDecoder(params, config, gen, tokenizer=tokenizer, reuse=reuse)
        self.tokenizer, self.capacity, self.record_ids = tokenizer, gen.batch_size, record_ids

    def reply(self, conversations: Sequence[Conversation]) -> list[Reply]:
        """Prompt ids of each conversation, decoded together."""
        prompts = [prompt_ids(self.tokenizer, c.messages) for c in conversations]
        out: list[Reply | None] = [None] * len(prompts)
        fits = [i for i, p in enumerate(prompts) if self.decoder.fits(len(p))]
        requests = [(conversations[i].task.task_id, prompts[i]) for i in fits]
        turns = self.decoder.reply(requests) if requests else []
        for i, t in zip(fits, turns, strict=True):
            c = t.completion
            ids = t.prompt_ids if self.record_ids else None
            out[i] = Reply(c.text, c.finish, len(c.tokens), c.prompt_tokens, t.prefilled, ids)
        return [
            r or Reply("", "context", prompt_tokens=len(p))
            for r, p in zip(out, prompts, strict=True)
        ]

    def release(self, task_id: str) -> None:
        """Free the conversation's cache row (it may never have had one)."""
        if task_id in self.decoder.rows:
            self.decoder.release(task_id)


def start(task: AgentTask, config: AgentConfig) -> Conversation:
    """A new conversation: the optional system message and the task statement."""
    head = [{"role": "system", "content": config.system}] if config.system else []
    return Conversation(task, [*head, {"role": "user", "content": task.statement}])


def _run_code(
    conversations: Sequence[Conversation], replies: Sequence[Reply], config: AgentConfig
) -> list[tuple[str | None, Execution]]:
    """(code, execution) of every reply, the sandbox runs in parallel."""
    isolation = sandbox.probe()
    codes = [extract_code(r.text) for r in replies]

    def run(i: int) -> Execution:
        if codes[i] is None:
            return Execution("no_code")
        return execute(
            conversations[i].task,
            codes[i],
            config.limits,
            isolation,
            allow_network=config.allow_network,
        )

    with sandbox.run_pool(config.workers or len(replies) or 1) as pool:  # SIGTERM stops runs
        return list(zip(codes, pool.map(run, range(len(replies))), strict=True))


def step(
    conversation: Conversation,
    reply: Reply,
    code: str | None,
    execution: Execution,
    config: AgentConfig,
    generate_s: float,
) -> None:
    """Record one turn; end the conversation, or add the feedback turn."""
    turn = len(conversation.turns) + 1
    conversation.messages.append({"role": "assistant", "content": reply.text})
    record: dict[str, Any] = {
        "turn": turn,
        "finish": reply.finish,
        "prompt_tokens": reply.prompt_tokens,
        "prefilled_tokens": reply.prefilled,
        "reply_tokens": reply.tokens,
        "code": code,
        "status": "context_full" if reply.finish == "context" else execution.status,
        "exec_s": execution.seconds,
        "generate_s": round(generate_s, 3),
    }
    if reply.prompt_ids is not None:
        record["prompt_ids"] = reply.prompt_ids
    conversation.turns.append(record)
    if reply.finish == "context":
        conversation.messages.pop()  # nothing was generated
        conversation.ended = "context_full"
    elif execution.passed:
        conversation.solved_at, conversation.ended = turn, "solved"
    elif turn >= config.turns:
        conversation.ended = "out_of_turns"
    else:
        text = feedback(config.feedback, execution, config.limits)
        record["observation"] = text
        conversation.messages.append({"role": config.observation_role, "content": text})


def finished_tasks(out_dir: Path) -> list[dict[str, Any]]:
    """The transcript lines already written (a torn last line is dropped: it is redone)."""
    path = out_dir / "transcripts.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    records = []
    for i, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1 or line.endswith("\n"):
                raise UserError(f"{path}:{i + 1}: not a transcript line") from None
            atomic_write_text(path, "".join(lines[:-1]))  # torn by a crash
    return records


def _check_settings(out_dir: Path, settings: dict[str, Any]) -> None:
    """Write run.json, or check that a resumed run has the same settings."""
    path = out_dir / "run.json"
    if path.exists():
        before = json.loads(path.read_text())
        changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
        if changed:
            raise UserError(
                f"{out_dir}: holds a run with other settings ({', '.join(changed)}); "
                "use another --out to start a new run"
            )
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(settings, indent=2) + "\n")


def run_agent(
    tasks: Sequence[AgentTask],
    replies: Replies,
    config: AgentConfig,
    out_dir: str | Path,
    *,
    settings: dict[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every task not already in `out_dir`'s transcripts; the tasks' transcript lines."""
    out = Path(out_dir)
    _check_settings(out, {**config.settings(), **(settings or {})})
    records = finished_tasks(out)
    done = {r["task_id"] for r in records}
    pending = [t for t in tasks if t.task_id not in done]
    live: list[Conversation] = []
    if progress is not None:
        progress(len(records), len(records) + len(pending))
    with open(out / "transcripts.jsonl", "a", encoding="utf-8") as f:
        while pending or live:
            while pending and len(live) < replies.capacity:
                live.append(start(pending.pop(0), config))
            began = time.perf_counter()
            answers = replies.reply(live)
            generate_s = time.perf_counter() - began
            runs = _run_code(live, answers, config)
            for c, r, (code, e) in zip(live, answers, runs, strict=True):
                step(c, r, code, e, config, generate_s)
                if c.ended is not None:
                    replies.release(c.task.task_id)
                    records.append(c.record())
                    f.write(json.dumps(records[-1]) + "\n")
                    f.flush()  # a line per finished task: what a rerun skips
            live = [c for c in live if c.ended is None]
            if progress is not None:
                progress(len(records), len(records) + len(pending) + len(live))
    by_id = {r["task_id"]: r for r in records}
    return [by_id[t.task_id] for t in tasks]  # in task order, earlier runs' lines included

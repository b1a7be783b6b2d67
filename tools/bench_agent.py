"""Benchmark: a K-turn agent run with each conversation's KV cache kept across turns,
against the same run prefilling every turn's whole prompt, in one process.

Both runs are `lemur.eval.agent.run_agent` over the same tasks with `exec` feedback and
greedy decoding (so both produce the same transcripts, which is checked), one batch
holding every conversation, so round k is turn k of every task. Only the model's reply
calls are timed (the sandbox is the same in both); turn k's latency is the wall time of
round k (wall time, and the process's CPU time: all its threads, steadier on a shared
machine). A first, untimed run of each mode compiles every shape the timed run meets.

    python tools/bench_agent.py out/chat-demo-hf --tasks 8 --turns 5 --json bench_agent.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lemur.eval import agent, agent_tasks, sandbox  # noqa: E402
from lemur.eval.decoding import GenerationConfig  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.model.decode import split_layers  # noqa: E402


class Timed:
    """A Replies that times each batched reply call (one per round)."""

    def __init__(self, inner: agent.ModelReplies) -> None:
        self.inner, self.capacity = inner, inner.capacity
        self.rounds: list[dict[str, Any]] = []

    def reply(self, conversations: Sequence[agent.Conversation]) -> list[agent.Reply]:
        """The inner replies, timed."""
        began, cpu = time.perf_counter(), time.process_time()
        out = self.inner.reply(conversations)
        self.rounds.append(
            {
                "seconds": time.perf_counter() - began,
                "cpu_seconds": time.process_time() - cpu,
                "conversations": len(out),
                "prompt_tokens": sum(r.prompt_tokens for r in out),
                "prefilled_tokens": sum(r.prefilled for r in out),
                "generated_tokens": sum(r.tokens for r in out),
            }
        )
        return out

    def release(self, task_id: str) -> None:
        """Pass on."""
        self.inner.release(task_id)


def run(model: Any, tasks: list, args: argparse.Namespace, reuse: bool) -> tuple[Timed, list]:
    """One agent run; its timed rounds and transcripts."""
    gen = GenerationConfig(max_new_tokens=args.max_new_tokens, batch_size=len(tasks))
    replies = Timed(
        agent.ModelReplies(model.params, model.config, model.tokenizer, gen, reuse=reuse)
    )
    config = agent.AgentConfig(turns=args.turns, feedback="exec", limits=sandbox.Limits(5.0, 5))
    with tempfile.TemporaryDirectory() as out:
        records = agent.run_agent(tasks, replies, config, out)
    for r in records:
        for t in r["turn_records"]:
            t.pop("generate_s"), t.pop("exec_s"), t.pop("prefilled_tokens")
    return replies, records


def main() -> None:
    """Run both modes and print (and optionally write) the figures."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a chat model (e.g. out/chat-demo-hf)")
    p.add_argument("--tasks", type=int, default=8, help="the first N HumanEval problems")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=4096, help="context (past training's)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    model = load_model(args.checkpoint)
    # The demo model trained on 256 positions; conversations run past them (timing only).
    model.config = dataclasses.replace(model.config, max_seq_len=args.max_seq_len)
    model.params = split_layers(model.params, consume=True)
    tasks = agent_tasks.load_agent_tasks("humaneval")[: args.tasks]
    results = {}
    for name, reuse in (("reuse", True), ("reprefill", False)):
        run(model, tasks, args, reuse)  # compiles every shape the timed run meets
        results[name] = run(model, tasks, args, reuse)
    (reuse, rec_reuse), (base, rec_base) = results["reuse"], results["reprefill"]
    total = {k: sum(r["seconds"] for r in t.rounds) for k, t in (("reuse", reuse), ("re", base))}
    cpu = {k: sum(r["cpu_seconds"] for r in t.rounds) for k, t in (("reuse", reuse), ("re", base))}
    report = {
        "model": str(model.source),
        "tasks": len(tasks),
        "turns": args.turns,
        "max_new_tokens": args.max_new_tokens,
        "same_transcripts": rec_reuse == rec_base,
        "reuse_rounds": reuse.rounds,
        "reprefill_rounds": base.rounds,
        "reuse_s": round(total["reuse"], 3),
        "reprefill_s": round(total["re"], 3),
        "speedup": round(total["re"] / total["reuse"], 2),
        "reuse_cpu_s": round(cpu["reuse"], 3),
        "reprefill_cpu_s": round(cpu["re"], 3),
        "cpu_speedup": round(cpu["re"] / cpu["reuse"], 2),
    }
    print(
        f"{'turn':>4} {'prefill':>8} {'reuse s':>8} {'cpu s':>6} {'prefill':>8} {'re s':>6} {'cpu s':>6}"
    )
    for k, (a, b) in enumerate(zip(reuse.rounds, base.rounds, strict=False), start=1):
        print(
            f"{k:>4} {a['prefilled_tokens']:8d} {a['seconds']:8.3f} {a['cpu_seconds']:6.2f} "
            f"{b['prefilled_tokens']:8d} {b['seconds']:6.3f} {b['cpu_seconds']:6.2f}"
        )
    print(
        f"total {report['reuse_s']} s vs {report['reprefill_s']} s: {report['speedup']}x wall, "
        f"{report['cpu_speedup']}x CPU; same transcripts: {report['same_transcripts']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()

"""`lemur-eval agent` and `lemur-eval plot`: the agent evaluation's commands.

    lemur-eval agent CHECKPOINT --tasks humaneval|FILE --turns K --feedback exec|binary|none
    lemur-eval plot RUN_DIR... --out success.png

See lemur.eval.agent and docs/eval.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lemur.cli_common import die, positive_int, user_input, writing
from lemur.eval import cli_args
from lemur.progress import Progress


def add_parsers(sub: Any) -> None:
    """The `agent` and `plot` subcommands (model, sampling, sandbox and `--limit` options
    as the others')."""
    ag = sub.add_parser("agent", help="multi-turn tasks with execution feedback (MINT-style)")
    cli_args.model_args(ag)
    ag.add_argument("--tasks", default="humaneval", help="humaneval, or a JSONL file of tasks")
    ag.add_argument("--turns", type=positive_int, default=5, help="turn budget K per task")
    ag.add_argument("--feedback", choices=["exec", "binary", "none"], default="exec")
    cli_args.limit_arg(ag)
    ag.add_argument("--system", default=None, help="a system message before each task")
    ag.add_argument(
        "--observation-role",
        choices=["user", "tool"],
        default="user",
        help="the role of feedback turns (user, as MINT; tool, as CodeAct data)",
    )
    cli_args.sandbox_args(ag, "code run")
    ag.add_argument(
        "--no-cache-reuse",
        action="store_true",
        help="prefill every turn's whole prompt (the slow baseline)",
    )
    ag.add_argument(
        "--record-ids", action="store_true", help="each turn's prompt ids in transcripts"
    )
    cli_args.context_args(ag)
    ag.add_argument("--out", default=None, help="run directory (default agent-FEEDBACK)")
    cli_args.gen_args(ag, 512)
    pl = sub.add_parser("plot", help="success rate by turn of agent runs, one line each")
    pl.add_argument("runs", nargs="+", metavar="RUN", help="agent run directories or summaries")
    pl.add_argument("--out", default="agent-success.png", help="the PNG to write")


def _agent_config(args: argparse.Namespace) -> Any:
    """The AgentConfig the command line asks for."""
    from lemur.eval import agent

    with user_input(ValueError):  # the settings check the arguments
        return agent.AgentConfig(
            turns=args.turns,
            feedback=args.feedback,
            observation_role=args.observation_role,
            system=args.system,
            limits=cli_args.sandbox_limits(args),
            allow_network=args.allow_network,
            workers=args.workers,
            record_ids=args.record_ids,
        )


def _check_first_prompts(tasks: list[Any], config: Any, model: Any, max_new: int) -> None:
    """Refuse tasks whose first turn leaves no room for a reply within the context: they
    would end `context_full` before the model said anything, and a success rate over them
    would measure nothing."""
    from lemur.eval import agent

    context = model.config.max_seq_len
    lengths = [
        len(agent.prompt_ids(model.tokenizer, agent.start(t, config).messages)) for t in tasks
    ]
    over = [i for i, n in enumerate(lengths) if n + max_new > context]
    if over:
        first = over[0]
        die(
            f"{tasks[first].task_id}: its first prompt ({lengths[first]} tokens) and "
            f"--max-new-tokens {max_new} exceed the context of {context} tokens "
            f"({len(over)} of {len(tasks)} tasks): the model could not reply; lower "
            "--max-new-tokens or raise --max-seq-len"
        )


def cmd_agent(args: argparse.Namespace) -> int:
    """Run (or resume) the agent evaluation; write transcripts, summary and plot."""
    from lemur.eval import agent, agent_report, agent_tasks

    with user_input(ValueError):  # the --tasks file
        tasks = agent_tasks.load_agent_tasks(args.tasks)[: args.limit]  # None: every task
    cli_args.probe_sandbox(args)
    config = _agent_config(args)
    model = cli_args.load_checkpoint(args, for_decoding=True)
    cli_args.need_tokenizer(args, model)
    cli_args.set_context(args, model)
    if args.turns > model.config.max_seq_len:  # each turn adds a token at least
        die(
            f"--turns {args.turns}: more than the context holds ({model.config.max_seq_len} tokens)"
        )
    _check_first_prompts(tasks, config, model, args.max_new_tokens)
    gen = cli_args.sampling(args)
    replies = agent.ModelReplies(
        model.params,
        model.config,
        model.tokenizer,
        gen,
        reuse=not args.no_cache_reuse,
        record_ids=args.record_ids,
    )
    settings = {"model": str(model.source), "tasks_source": args.tasks}
    settings |= {k: getattr(args, k) for k in ("max_new_tokens", "temperature", "top_k")}
    # The context decides which conversations end `context_full`: a rerun under another
    # must not reuse their transcripts.
    settings |= {"top_p": args.top_p, "seed": args.seed, "max_seq_len": model.config.max_seq_len}
    out = Path(args.out or f"agent-{args.feedback}")
    with writing(out):  # refused now, not after the first tasks ran
        out.mkdir(parents=True, exist_ok=True)
    with Progress("lemur-eval", unit="tasks") as progress:
        records = agent.run_agent(
            tasks,
            replies,
            config,
            out,
            settings=settings,
            progress=lambda done, n: progress("agent", done, n),
        )
    summary = {**agent_report.summarize(records, args.turns), **config.settings(), **settings}
    path = agent_report.write_summary(out, summary)
    png = agent_report.plot([out], out / "success_by_turn.png")
    rates = " ".join(f"{r:.3f}" for r in summary["success_rate_by_turn"])
    print(
        f"success rate by turn {rates} over {summary['tasks']} tasks "
        f"({args.feedback} feedback); {out / 'transcripts.jsonl'}, {path}, {png}"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """One PNG of several agent runs' success rate by turn."""
    from lemur.eval import agent_report

    with user_input(ValueError):  # each run named must hold an agent run's summary
        for run in args.runs:
            agent_report.read_summary(run)
    with writing(args.out):
        print(agent_report.plot(args.runs, args.out))
    return 0

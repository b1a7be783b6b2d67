"""`lemur-eval harness`: lm-evaluation-harness tasks on a lemur model, in process.

    lemur-eval harness CHECKPOINT --tasks T1,T2 [--include-path DIR] [--num-fewshot N]
                       [--limit N] [--batch-size N] [--output PATH] [--log-samples] [--seed N]

Runs `lm_eval.simple_evaluate` with lemur.model.harness_lm's model (JAX, batched, KV-cache
generation), then writes lm-eval's own results JSON (what `lm-eval run --output_path`
writes, under the name given) and, with --log-samples, its per-sample JSONL files beside
it (`<stem>_samples_<task>.jsonl`), and prints lm-eval's table. The flags mean what
lm-eval's do; `--seed N` sets lm-eval's four seeds (python, numpy, torch, few-shot) and
the sampling key to N (default: lm-eval's 0,1234,1234,1234). See docs/eval.md#harness.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from lemur.atomic_files import scratch_path
from lemur.cli_common import die, positive_int, writing
from lemur.eval import cli_args
from lemur.progress import Progress

DEFAULT_OUTPUT = "harness-results.json"


def _limit(text: str) -> int | float:
    """lm-eval's --limit: a number of documents per task, or a fraction below 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value if value < 1 else int(value)


def _non_negative(text: str) -> int:
    """An int >= 0 (few-shot examples)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_parser(sub: Any) -> None:
    """The `harness` subcommand."""
    p = sub.add_parser(
        "harness", help="lm-evaluation-harness tasks, in process (lm-eval's results JSON)"
    )
    cli_args.model_args(p)
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task or group names")
    p.add_argument("--include-path", default=None, help="a folder of task YAMLs to add")
    p.add_argument("--num-fewshot", type=_non_negative, default=None, help="few-shot examples")
    p.add_argument("--limit", type=_limit, default=None, help="documents per task (or a fraction)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="sequences per call")
    p.add_argument("--max-gen-toks", type=positive_int, default=256, help="when a task sets none")
    p.add_argument("--output", default=DEFAULT_OUTPUT, help="lm-eval's results JSON")
    p.add_argument("--log-samples", action="store_true", help="also write per-sample JSONL")
    p.add_argument("--seed", type=cli_args.seed_int, default=None, help="every seed (see above)")


def task_names(tasks: str, include_path: str | None) -> tuple[list[str], Any]:
    """The task names and lm-eval's TaskManager over its tasks plus `include_path`; one line
    (die) for a missing folder or an unknown name."""
    from lemur.model.harness_lm import HarnessMissing, lm_eval_module

    try:
        lm_eval_module()
    except HarnessMissing as e:
        die(str(e))
    from lm_eval.tasks import TaskManager

    if include_path is not None and not Path(include_path).is_dir():
        die(f"--include-path {include_path}: no such directory")
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        die("--tasks: no task names given")
    manager = TaskManager(include_path=include_path)
    unknown = [n for n in names if not manager.match_tasks([n])]
    if unknown:
        where = f" (lm-eval's tasks plus {include_path})" if include_path else ""
        die(
            f"--tasks: unknown task {', '.join(unknown)}{where}; "
            "`lm-eval ls tasks` lists them, --include-path adds a folder of YAMLs"
        )
    return names, manager


def seeds(seed: int | None) -> dict[str, int]:
    """simple_evaluate's seed arguments: lm-eval's defaults, or all four set to `seed`."""
    if seed is None:
        return {}
    names = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
    return dict.fromkeys(names, seed)


def write_outputs(
    output: str, results: dict[str, Any], tracker: Any, log_samples: bool
) -> list[Path]:
    """lm-eval's results JSON at `output` and (log_samples) `<stem>_samples_<task>.jsonl`
    beside it, written by lm-eval's tracker into scratch, each renamed into place whole."""
    out = Path(output)
    samples = results.pop("samples", None) if log_samples else None
    written = []
    with writing(out.parent), scratch_path(out) as staging:
        tracker.output_path = str(staging / "results.json")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"] if samples else ():
            tracker.save_results_samples(task_name=task, samples=samples[task])
        made = {p.name: p for p in staging.glob("*.json*")}
        aggregated = [p for n, p in made.items() if n.startswith("results_")]
        if len(aggregated) != 1:  # the tracker only logs a warning when it fails
            die(f"{out}: lm-eval's tracker wrote no results file (see the log above)", 1)
        for name, path in sorted(made.items()):
            if name.startswith("samples_"):
                task = name[len("samples_") :].rsplit("_", 1)[0]
                dst = out.with_name(f"{out.stem}_samples_{task}.jsonl")
            else:
                dst = out
            os.replace(path, dst)  # the same directory: a whole file or none
            written.append(dst)
    return written


def cmd_harness(args: argparse.Namespace) -> int:
    """Run the tasks on the model, write lm-eval's files, print its table."""
    names, manager = task_names(args.tasks, args.include_path)
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import make_table

    from lemur.model.harness_lm import harness_lm

    model = cli_args.load_checkpoint(args)
    cli_args.need_tokenizer(args, model)
    with Progress("lemur-eval", unit="requests") as progress:
        lm = harness_lm(
            model.config,
            model.params,
            model.tokenizer,
            batch_size=args.batch_size,
            max_gen_toks=args.max_gen_toks,
            seed=args.seed or 0,
            progress=progress,
            # An HF folder's own tokenizer.json is what lm-eval's HF backend reads there.
            tokenizer_json=None if args.tokenizer else model.hf_tokenizer.get("tokenizer.json"),
        )
        tracker = EvaluationTracker()
        results = simple_evaluate(
            model=lm,
            tasks=names,
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            log_samples=args.log_samples,
            evaluation_tracker=tracker,
            task_manager=manager,
            **seeds(args.seed),
        )
    if results is None:
        die("lm-eval returned no results", 1)
    results["config"]["model_args"] = {"checkpoint": model.source, "dtype": model.config.dtype}
    table = make_table(results)
    groups = make_table(results, "groups") if "groups" in results else ""
    written = write_outputs(args.output, results, tracker, args.log_samples)
    print(table + groups)
    print(f"results: {', '.join(str(p) for p in written)}")
    return 0

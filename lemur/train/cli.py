"""`lemur-train`: train a compact JAX Llama directly off lemur shards.

    lemur-train CONFIG [--set KEY=VALUE ...] [--dry-run]
    lemur-train plot RUN_DIR [--out DIR]
    lemur-train plan CONFIG [--topology NAME] [--slices N] [--set ...] [--mfu X] [--fit] [--json]

CONFIG is a YAML file or the name of a shipped config (tiny, demo, lemur-70b, ...).
Exit codes: 0 done, already done, or stopped by a signal with a checkpoint saved;
1 training diverged; 2 bad config, data, run directory or checkpoints, or `steps` below
the latest checkpoint (a one-line message; `--debug` or LEMUR_DEBUG=1 shows the
traceback instead); 130 (SIGINT) or 143 (SIGTERM) before training started (nothing
half-written).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from lemur.cli_common import (
    OneLineParser,
    add_debug_option,
    add_set_option,
    debug_wanted,
    die,
    run_main,
)
from lemur.progress import format_duration

if TYPE_CHECKING:
    from lemur.model.config import LlamaConfig
    from lemur.train.config import TrainConfig
    from lemur.train.setup import RunSummary

USAGE = (
    "lemur-train CONFIG [--set KEY=VALUE ...] [--dry-run] [--debug] | lemur-train plot RUN_DIR"
    " | lemur-train plan CONFIG --topology NAME"
)


def train_parser() -> argparse.ArgumentParser:
    """Arguments of a training run."""
    p = OneLineParser(
        prog="lemur-train",
        usage=USAGE,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="config YAML, or a shipped config name (tiny, lemur-70b, ...)")
    add_set_option(p, "steps=200")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the resolved config and the derived sizes, then exit",
    )
    add_debug_option(p)
    return p


def plot_parser() -> argparse.ArgumentParser:
    """Arguments of `lemur-train plot`."""
    p = OneLineParser(prog="lemur-train plot", description="write PNG curves of a run's metrics")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="where to write the PNGs (default RUN_DIR/plots)")
    add_debug_option(p)
    return p


def dry_run_summary(config: TrainConfig) -> str:
    """Derived sizes of a config as YAML comments (the vocab, the steps of `epochs` and the
    model of `init_from` from the data and the checkpoint when they are readable): the
    model the run would train, padded embedding rows of `init_from` included."""
    from lemur.model.config import flops_per_token, param_count
    from lemur.train.config import ConfigError
    from lemur.train.errors import RunError
    from lemur.train.setup import DataDirs, resolve_config

    lines: list[str] = []
    try:  # dry runs must work without the data or the checkpoint present
        config, notes = resolve_config(config, DataDirs())
        lines += [note.removeprefix("lemur-train: ") for note in notes]
    except (RunError, ConfigError) as e:
        lines.append(f"not resolved now: {str(e).removeprefix('lemur-train: ')}")
    tokens = config.tokens_per_step
    lines.append(
        f"tokens per step: {tokens:,} ({config.batch.size} x {config.batch.seq_len}, "
        f"{config.batch.microbatches} microbatch(es))"
    )
    if config.steps is not None:
        lines.append(f"total tokens: {tokens * config.steps:,} over {config.steps:,} steps")
    if config.model.complete:
        model, source = _dry_run_model(config)
        lines += [
            f"model: {model}",
            f"vocab_size {model.vocab_size} from {source}",
            f"parameters: {param_count(model):,}",
            f"training FLOPs per token: {flops_per_token(model, config.batch.seq_len):.3e}",
        ]
    lines.append(f"checkpoints: {config.checkpoint_dir}")
    return "".join(f"# {line}\n" for line in lines)


def _dry_run_model(config: TrainConfig) -> tuple[LlamaConfig, str]:
    """The model a run of `config` trains (as `resolve_model` makes it: an `init_from`
    checkpoint's padded vocabulary kept) and where its vocab_size comes from."""
    from lemur.train.errors import RunError
    from lemur.train.setup import DataDirs, resolve_model

    vocab, source = config.model.vocab_size, "model.vocab_size"
    if vocab is None:
        try:
            vocab = int(DataDirs()[config.data.dirs[0]].tokenizer["vocab_size"])
            source = f"{config.data.dirs[0]} tokenizer"
        except RunError:
            return config.model.llama(None), "the data (unreadable now: preset's vocab shown)"
    try:
        model = resolve_model(config, vocab, DataDirs())
    except RunError as e:
        return config.model.llama(vocab), f"{source} (not checked now: {e})"
    if model.vocab_size != vocab:
        source = (
            f"model.init_from {config.model.init_from} (its embedding rows; the "
            f"{source} has {vocab} ids)"
        )
    return model, source


def cmd_train(args: argparse.Namespace) -> int:
    """Run (or dry-run) a training config."""
    from lemur.train import interrupt

    # Before the slow imports (jax): from now until training starts, Ctrl-C exits 130
    # at once instead of raising KeyboardInterrupt in the middle of JAX or XLA.
    interrupt.arm()
    interrupt.guard_jax_cache_writes()  # JAX's cache writes are critical ones until training
    try:
        return _train(args)
    finally:
        interrupt.restore()  # main() may be called again in this process (tests)


def _train(args: argparse.Namespace) -> int:
    """Load the config, then dry-run or train it; the exit code."""
    from lemur.train.config import ConfigError, load_train_config

    started = time.monotonic()  # the closing line's wall time: set-up and compile too
    try:
        config = load_train_config(args.config, args.set)
    except ConfigError as e:
        die(str(e))
    if args.dry_run:
        print(config.to_yaml() + dry_run_summary(config), end="")
        return 0
    from lemur.train.errors import RunError, TrainingDiverged
    from lemur.train.loop import train

    try:
        summary = train(config)
    except (ConfigError, RunError) as e:
        die(str(e))
    except TrainingDiverged as e:
        die(str(e), 1)
    print(closing_line(summary, time.monotonic() - started), file=sys.stderr)
    return 0


def closing_line(summary: RunSummary, wall_s: float) -> str:
    """The run's last line: its step, that step's own loss (the step records show the mean
    over the steps since the previous record: another number for the same step), the
    latest eval losses and the command's wall time (`wall_s` seconds)."""
    parts = [f"step {summary.step}"]
    if summary.loss is not None:
        parts.append(f"last step's loss {summary.loss:.4f}")
    parts += [f"val {k} {v:.4f}" for k, v in summary.evals.items()]
    parts.append(f"in {format_duration(wall_s)}")
    return f"lemur-train: {'  '.join(parts)}  ({summary.run_dir})"


def cmd_plot(args: argparse.Namespace) -> int:
    """Write the PNG curves of a run."""
    from lemur.train.plot import plot_run

    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as e:
        die(str(e))
    for path in paths:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lemur-train`."""
    from lemur import process_setup

    process_setup.install("lemur-train")  # every process-wide change: see lemur.process_setup
    argv = sys.argv[1:] if argv is None else list(argv)
    sub = argv[0] if argv and argv[0] in ("plot", "plan") else None
    if sub == "plan":
        from lemur.train.plan_cli import cmd_plan, plan_parser

        args, command = plan_parser().parse_args(argv[1:]), cmd_plan
    elif sub == "plot":
        args, command = plot_parser().parse_args(argv[1:]), cmd_plot
    else:
        args, command = train_parser().parse_args(argv), cmd_train
    # Ctrl-C after training started, or with several processes: "interrupted", exit 130.
    return run_main(lambda: command(args), "lemur-train", debug=debug_wanted(args))


if __name__ == "__main__":
    sys.exit(main())

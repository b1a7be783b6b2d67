"""The options `lemur-eval`'s commands share, each defined once: the model to load, the
sampling, the sandbox and `--limit`. A count or a size must be >= 1 and a time > 0, checked
as the command line is parsed (one line, exit 2): 0 never stands for "all" or "the
default"; an option left out does."""

from __future__ import annotations

import argparse
from typing import Any

from lemur.cli_common import positive_float, positive_int


def model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """Arguments shared by every command that loads a model."""
    p.add_argument(
        "checkpoint",
        nargs=None if required else "?",
        help="run dir, orbax step, lemur checkpoint or HF Llama folder",
    )
    p.add_argument("--step", type=int, default=None, help="checkpoint step of a run dir")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="SentencePiece model, or a shard directory or model folder holding one "
        "(overrides the one found)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="compute dtype (auto: float32 on CPU, the checkpoint's elsewhere)",
    )


def gen_args(p: argparse.ArgumentParser, max_new: int) -> None:
    """Sampling arguments."""
    p.add_argument("--max-new-tokens", type=positive_int, default=max_new)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="1: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts decoded together")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sandbox_args(p: argparse.ArgumentParser, unit: str) -> None:
    """The options of a command that runs generated code in the sandbox (`unit`: one run)."""
    p.add_argument("--timeout", type=positive_float, default=10.0, help=f"seconds per {unit} (> 0)")
    p.add_argument(
        "--workers", type=positive_int, default=None, help=f"{unit}s at once (default: CPUs)"
    )
    p.add_argument(
        "--allow-network",
        action="store_true",
        help="run generated code even where the network cannot be isolated",
    )


def limit_arg(p: argparse.ArgumentParser) -> None:
    """`--limit N`: the first N tasks (N >= 1; left out: every task)."""
    p.add_argument(
        "--limit", type=positive_int, default=None, help="only the first N tasks (default all)"
    )


def sandbox_limits(args: argparse.Namespace) -> Any:
    """The sandbox.Limits of `--timeout`: that wall-clock time, and as much CPU time (whole
    seconds, at least 1)."""
    from lemur.eval import sandbox

    return sandbox.Limits(timeout_s=args.timeout, cpu_s=max(1, int(args.timeout)))

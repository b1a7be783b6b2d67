"""The options `lemur-eval`'s commands share, each defined once with what it makes: the
model to load (`load_checkpoint`, `need_tokenizer`), the sampling (`sampling`), the sandbox
(`probe_sandbox`, `sandbox_limits`) and `--limit`; both commands' modules (cli.py,
agent_cli.py) use them. A count or a size must be >= 1 and a time > 0, checked
as the command line is parsed (one line, exit 2): 0 never stands for "all" or "the
default"; an option left out does."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from lemur.cli_common import Terminated, die, positive_float, positive_int, user_input, writing
from lemur.eval.long_prompts import DOES

# The seeds JAX's random keys take: a signed 64-bit integer (more is an OverflowError).
SEED_RANGE = (-(2**63), 2**63 - 1)


def seed_int(text: str) -> int:
    """An argparse `type`: an integer a random key can be made of (SEED_RANGE)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise argparse.ArgumentTypeError(f"must be a 64-bit integer, got {value}")
    return value


def timeout_seconds(text: str) -> float:
    """An argparse `type`: a time > 0 that a wait and RLIMIT_CPU can hold (beyond
    threading.TIMEOUT_MAX, some 292 years, the CPU limit overflows inside every run, which
    then fails as if the code had)."""
    value = positive_float(text)
    if value > threading.TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"must be at most {threading.TIMEOUT_MAX:.0f} seconds, got {text}"
        )
    return value


def model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
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
    p.add_argument("--seed", type=seed_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=8, help="prompts decoded together")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sandbox_args(p: argparse.ArgumentParser, unit: str) -> None:
    """The options of a command that runs generated code in the sandbox (`unit`: one run)."""
    p.add_argument(
        "--timeout", type=timeout_seconds, default=10.0, help=f"seconds per {unit} (> 0)"
    )
    p.add_argument(
        "--workers", type=positive_int, default=None, help=f"{unit}s at once (default: CPUs)"
    )
    p.add_argument(
        "--allow-network",
        action="store_true",
        help="run generated code even where the network cannot be isolated",
    )


def context_args(p: argparse.ArgumentParser, long_prompts: tuple[str, ...] = ()) -> None:
    """`--max-seq-len` (the context a prompt and its reply must fit) and, with policies
    besides `refuse`, `--long-prompts` (lemur.eval.long_prompts)."""
    p.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=None,
        help="context length (default the model's; longer runs positions it never trained on)",
    )
    if long_prompts:
        p.add_argument(
            "--long-prompts",
            choices=["refuse", *long_prompts],
            default="refuse",
            help="a task prompt longer than the context: refuse (one line, exit 2), "
            + ", ".join(f"{a} ({DOES[a]})" for a in long_prompts)
            + "; counted in summary.json",
        )


def set_context(args: argparse.Namespace, model: Any) -> None:
    """The model's context becomes `--max-seq-len`, when given."""
    if args.max_seq_len is not None:
        model.config = dataclasses.replace(model.config, max_seq_len=args.max_seq_len)


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


@contextlib.contextmanager
def written_if_stopped(
    out: str, total: int, notes: dict[str, Any], records: Callable[[], list[dict[str, Any]]]
) -> Iterator[None]:
    """Inside, SIGTERM or Ctrl-C (the sandbox's runs in flight are stopped: `run_pool`)
    first writes the samples checked so far, `records()`, to `out`: samples.jsonl, and a
    summary.json that says the run was interrupted and has no pass@k (it would not be over
    the tasks asked for). Then the command exits 143 or 130 as usual."""
    try:
        yield
    except (Terminated, KeyboardInterrupt) as e:
        done = records()
        if done:
            from lemur.eval.humaneval import write_results

            why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted (Ctrl-C)"
            summary = {"interrupted": why, "samples_checked": len(done), "samples": total}
            with writing(out):
                write_results(out, done, summary | notes)
        raise


def say(message: str) -> None:
    """One line on stderr, prefixed `lemur-eval:` (progress and what was loaded)."""
    print(f"lemur-eval: {message}", file=sys.stderr, flush=True)


def probe_sandbox(args: argparse.Namespace) -> Any:
    """Probe the sandbox, say what it isolates, refuse without network isolation unless
    --allow-network; the probe's Isolation."""
    from lemur.eval import sandbox

    isolation = sandbox.probe()
    for line in isolation.describe():
        say(f"sandbox {line}")
    if not isolation.network and not args.allow_network:
        die(
            "refusing to run generated code: this machine cannot isolate the "
            "network (no network namespaces); pass --allow-network to run anyway"
        )
    return isolation


def load_checkpoint(args: argparse.Namespace, *, for_decoding: bool = False) -> Any:
    """The model named on the command line (per-layer weights when it will decode)."""
    from lemur.eval.load import load_model
    from lemur.model.decode import split_layers

    model = load_model(args.checkpoint, step=args.step, tokenizer=args.tokenizer, dtype=args.dtype)
    if for_decoding:
        model.params = split_layers(model.params, consume=True)
    from lemur.model.config import param_count

    say(
        f"{model.kind} model from {model.source}: {param_count(model.config):,} parameters, "
        f"{model.config.n_layers} layers, compute {model.config.dtype}"
    )
    return model


def sampling(args: argparse.Namespace, stop: tuple[str, ...] = ()) -> Any:
    """The GenerationConfig of the sampling arguments."""
    from lemur.eval.decoding import GenerationConfig
    from lemur.eval.sampling import Sampling

    with user_input(ValueError):  # the settings check the arguments
        return GenerationConfig(
            max_new_tokens=args.max_new_tokens,
            sampling=Sampling(args.temperature, args.top_k, args.top_p),
            stop=(*stop, *args.stop),
            seed=args.seed,
            batch_size=args.batch_size,
        )


def need_tokenizer(args: argparse.Namespace, model: Any) -> None:
    """Refuse, saying why, a model that came without a tokenizer."""
    if model.tokenizer is None:
        why = f" ({model.tokenizer_problem})" if model.tokenizer_problem else ""
        die(f"{args.checkpoint}: no tokenizer found{why}; give --tokenizer")

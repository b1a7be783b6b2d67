"""`lemur-train plan CONFIG [--topology NAME] [--slices N] [--set ...] [--mfu X] [--fit]
[--json]`: compile a run's steps for a TPU pod on this host and say whether they fit.

Exit codes: 0 fits (with --fit: a setting that fits was found); 1 does not fit (one line
with the compiler's figures); 2 a bad config, topology name or --mfu, or no libtpu.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from lemur.cli_common import OneLineParser, add_debug_option, add_set_option, die

if TYPE_CHECKING:
    from lemur.train.config import TrainConfig
    from lemur.train.plan import Plan
    from lemur.train.plan_targets import Target


def plan_parser() -> argparse.ArgumentParser:
    """Arguments of `lemur-train plan`."""
    p = OneLineParser(
        prog="lemur-train plan",
        description="compile a config's train and eval steps for a TPU topology on this "
        "host (no TPU needed) and report per-chip memory, fit, and predicted time",
    )
    p.add_argument("config", help="config YAML, or a shipped config name (lemur-70b, ...)")
    p.add_argument(
        "--topology",
        default=None,
        help="Cloud TPU accelerator type (v4-512, v5e-256, v5p-1024, v6e-256) or h100-N / "
        "h200-N (estimated); default: the config's plan.topology",
    )
    p.add_argument("--slices", type=int, default=None, help="TPU slices over DCN (default 1)")
    add_set_option(p, "batch.microbatches=4")
    p.add_argument(
        "--mfu", type=float, default=None, help="MFU for the time estimates (default per chip)"
    )
    p.add_argument(
        "--fit",
        action="store_true",
        help="search remat and microbatches for the fastest setting that fits",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_debug_option(p)
    return p


def _quiet_libtpu(topology: str) -> None:
    """Environment for compiling without a TPU: JAX's backend stays the CPU (libtpu is only
    the compiler here), and libtpu is told the machine so that it does not print warnings
    about TPU metadata it cannot find; a second process may load it meanwhile."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", topology)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan (or --fit) a config on a topology; the exit code.

    Ctrl-C and SIGTERM end it at once with one line (lemur.train.interrupt): left to
    Python, a KeyboardInterrupt raised inside a JAX garbage-collection callback during the
    compile was swallowed (2 Ctrl-Cs in 10), and the plan ran on to exit 0."""
    from lemur.train import interrupt

    interrupt.arm(messages={signal.SIGINT: "interrupted", signal.SIGTERM: "terminated (SIGTERM)"})
    interrupt.guard_jax_cache_writes()
    try:
        return _plan(args)
    finally:
        interrupt.restore()  # main() may be called again in this process (tests)


def _plan(args: argparse.Namespace) -> int:
    """`cmd_plan` with the signals armed."""
    from lemur.cli_common import UserError
    from lemur.train.config import ConfigError, load_train_config
    from lemur.train.plan_targets import libtpu_problem, parse_target

    try:
        config = load_train_config(args.config, args.set)
    except ConfigError as e:
        die(str(e))
    topology = args.topology or config.plan.topology
    if topology is None:
        die(f"{args.config}: no --topology given and no plan.topology in the config")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        die(f"--mfu: must be in (0, 1], got {args.mfu}")
    # `--slices 0` is refused, not taken for "the config's" (it planned one slice).
    slices = config.plan.slices if args.slices is None else args.slices
    target = parse_target(topology, slices)
    if target.is_gpu:
        from lemur.train.plan_estimate import NOT_COMPILED

        print(f"lemur-train plan: {NOT_COMPILED}", file=sys.stderr)
        return _report_fit(args, config, target) if args.fit else _report_gpu(args, config, target)
    problem = libtpu_problem()
    if problem:
        die(problem)
    _quiet_libtpu(topology)
    try:
        if args.fit:
            return _report_fit(args, config, target)
        from lemur.train.plan import plan_tpu

        with _compiling("compiling the train and eval steps", args, target):
            plan = plan_tpu(config, args.config, target, args.mfu)
        return _report(args, plan)
    except ConfigError as e:  # the mesh does not split the batch over this many chips
        raise UserError(str(e)) from None


def _compiling(what: str, args: argparse.Namespace, target: Target) -> Any:
    """A compile of minutes for a pod on a CPU host: a bar with its time on a terminal,
    else a line every interval naming what is compiled (lemur.progress.heartbeat)."""
    from lemur.progress import heartbeat

    return heartbeat(
        "lemur-train plan", f"{what} of {args.config} for {target.name} ({target.devices} chips)"
    )


def _report(args: argparse.Namespace, plan: Plan) -> int:
    """Print a plan (text or JSON); 0 if it fits, else 1 with its one line."""
    from lemur.train.plan import format_plan, refusal_line

    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    elif plan.memory.fits:
        print(format_plan(plan), end="")
    if not plan.memory.fits:
        die(refusal_line(plan), 1)
    return 0


def _report_gpu(args: argparse.Namespace, config: TrainConfig, target: Target) -> int:
    """The analytic estimate for a GPU target, said to be one."""
    from lemur.train.plan import plan_gpu

    return _report(args, plan_gpu(config, args.config, target, args.mfu))


def _report_fit(args: argparse.Namespace, config: TrainConfig, target: Target) -> int:
    """Search, print the fastest fit as --set flags and how long the search took."""
    from lemur.train.plan import format_plan, gib, set_flags
    from lemur.train.plan_fit import fit

    search = (
        contextlib.nullcontext()  # estimates take no time
        if target.is_gpu
        else _compiling("searching remat and microbatches", args, target)
    )
    with search:
        result = fit(config, args.config, target, args.mfu, lambda s: print(s, file=sys.stderr))
    kind = "estimates" if target.is_gpu else "compiles"
    compiles = f"{len(result.tried)} {kind} in {result.seconds:.0f} s"
    if args.json:
        out = {"plan": result.plan and result.plan.to_json(), "search_s": result.seconds}
        out["tried"] = [{**s, "fits": m.fits, "peak": m.peak} for s, m in result.tried]
        print(json.dumps(out, indent=2))
    if result.plan is None:
        low = min(m.peak for _, m in result.tried) if result.tried else float("nan")
        die(f"{args.config} on {target.name}: nothing fits ({compiles}; least {gib(low)})", 1)
    if not args.json:
        print(format_plan(result.plan), end="")
        fastest = {k: v for k, v in result.plan.settings.items() if k in result.tried[0][0]}
        print(f"fastest setting that fits: {set_flags(fastest)} (search: {compiles})")
    return 0

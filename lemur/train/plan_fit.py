"""`lemur-train plan --fit`: the fastest settings that fit, by compiling as few as it can.

Only settings that change memory and not the math are searched: the remat policy (in
order of recomputed FLOPs: none, dots, full) and batch.microbatches (gradient
accumulation: more passes, each smaller). For each policy in that order, the largest
microbatch count is compiled first (if even it does not fit, no count does and the next
policy is tried), then a binary search finds the fewest microbatches that fit (memory only
falls as they rise). The first policy with a fit wins: fewer recomputed FLOPs first, then
fewer microbatches. An out-of-HBM refusal compiles in seconds; a fit takes minutes for a
70B model on a CPU host (GPU targets: the analytic estimate of each, no compile).
scan_layers and the attention kernel stay as configured.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from lemur.train.config import TrainConfig
from lemur.train.plan import (
    Plan,
    chip_hbm,
    compile_memory,
    eval_memory_for,
    gib,
    make_plan,
    plan_model,
    with_slices,
)
from lemur.train.plan_estimate import estimate_memory, mesh_sizes
from lemur.train.plan_targets import Memory, Target, tpu_devices

REMAT_BY_COST = ("none", "dots", "full")  # fewest recomputed FLOPs first


@dataclasses.dataclass
class FitResult:
    """The search's outcome: the plan of the fastest fit (None: nothing fits), the
    compiles it took, and its seconds."""

    plan: Plan | None
    tried: list[tuple[dict[str, Any], Memory]]
    seconds: float


def microbatch_choices(config: TrainConfig, devices: int) -> list[int]:
    """Microbatch counts the config can take: they divide the batch, and each microbatch
    still splits evenly over the data x fsdp devices."""
    data, fsdp, _ = mesh_sizes(config, devices)
    size = config.batch.size
    return [m for m in range(1, size + 1) if size % m == 0 and (size // m) % (data * fsdp) == 0]


def with_settings(config: TrainConfig, remat: str, microbatches: int) -> TrainConfig:
    """The config with `remat` and `microbatches` set (the rest as it is)."""
    overrides = {**config.model.overrides, "remat": remat}
    model = dataclasses.replace(config.model, overrides=overrides)
    batch = dataclasses.replace(config.batch, microbatches=microbatches)
    return dataclasses.replace(config, model=model, batch=batch)


def fit(
    config: TrainConfig,
    name: str,
    target: Target,
    mfu: float | None,
    say: Callable[[str], None],
) -> FitResult:
    """Search remat x microbatches for the fastest setting of `config` that fits `target`."""
    start = time.perf_counter()
    config = with_slices(config, target)
    measure, eval_peak = _measures(target)
    choices = microbatch_choices(config, target.devices)
    tried: list[tuple[dict[str, Any], Memory]] = []

    def attempt(remat: str, microbatches: int) -> Memory:
        memory = measure(with_settings(config, remat, microbatches))
        settings = {"batch.microbatches": microbatches, "model.overrides.remat": remat}
        tried.append((settings, memory))
        verdict = "fits" if memory.fits else "does not fit"
        say(
            f"lemur-train plan --fit: remat {remat}, microbatches {microbatches}: {verdict}, "
            f"{gib(memory.peak)} of {gib(memory.hbm)} ({memory.compile_s:.0f} s)"
        )
        return memory

    for remat in REMAT_BY_COST:
        if not choices or not attempt(remat, choices[-1]).fits:
            continue
        lo, hi = 0, len(choices) - 1  # choices[hi] fits; find the smallest index that does
        while lo < hi:
            mid = (lo + hi) // 2
            if attempt(remat, choices[mid]).fits:
                hi = mid
            else:
                lo = mid + 1
        best = with_settings(config, remat, choices[hi])
        model = plan_model(best)
        memory = next(m for s, m in reversed(tried) if _same(s, remat, choices[hi]))
        memory.eval_peak = eval_peak(best)
        mesh = dict(zip(("data", "fsdp", "tensor"), mesh_sizes(best, target.devices), strict=True))
        plan = make_plan(best, name, target, memory, model, mfu, mesh)
        return FitResult(plan, tried, time.perf_counter() - start)
    return FitResult(None, tried, time.perf_counter() - start)


def _measures(
    target: Target,
) -> tuple[Callable[[TrainConfig], Memory], Callable[[TrainConfig], float | None]]:
    """How a candidate's train-step memory and eval-step peak are had on `target`: compiled
    for a TPU, estimated by formula for a GPU (no eval figure)."""
    if target.is_gpu:
        return lambda c: estimate_memory(c, plan_model(c), target), lambda c: None
    devices = tpu_devices(target)
    hbm = chip_hbm(target, devices)
    return (
        lambda c: compile_memory(c, plan_model(c), devices, hbm, with_eval=False),
        lambda c: eval_memory_for(c, plan_model(c), devices),
    )


def _same(settings: dict[str, Any], remat: str, microbatches: int) -> bool:
    """Whether a tried setting is (remat, microbatches)."""
    return settings == {"batch.microbatches": microbatches, "model.overrides.remat": remat}

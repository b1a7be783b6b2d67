"""What tools/gpu_check.py reports from its parts: the figures docs/benchmarks.md needs
and whether each goal of issue #39 is met. Pure functions over the parts' JSON."""

from __future__ import annotations

from typing import Any

LOSS_RTOL = 1e-2  # bf16 compute against fp32: METHOD.md's bf16 band is 1e-3..1e-2
WAIT_GOAL = 0.01  # the loader's wait under 1% of step time

SWEEP = ("train_b8_dots", "train_b4_none", "train_b16_full")


def ok_parts(parts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The parts that finished."""
    return {name: p for name, p in parts.items() if p.get("status") == "ok"}


def loss_check(parts: dict[str, Any]) -> dict[str, Any] | None:
    """Part 1's first losses (bf16) against the fp32 run's over the same batches."""
    ok = ok_parts(parts)
    if "train_b8_dots" not in ok or "train_fp32_check" not in ok:
        return None
    bf16, fp32 = ok["train_b8_dots"]["losses"][:3], ok["train_fp32_check"]["losses"][:3]
    rel = [abs(a - b) / abs(b) for a, b in zip(bf16, fp32, strict=False)]
    return {
        "bf16": bf16,
        "fp32": fp32,
        "max_rel_diff": max(rel),
        "rtol": LOSS_RTOL,
        "pass": max(rel) <= LOSS_RTOL,
    }


def summarize(parts: dict[str, Any]) -> dict[str, Any]:
    """The figures docs/benchmarks.md needs, and each goal met or not."""
    ok = ok_parts(parts)
    trains = {n: p for n, p in ok.items() if n.startswith("train_") and "mfu" in p}
    keys = (
        "tokens_per_s",
        "mfu",
        "step_s",
        "step_s_min",
        "step_s_max",
        "attention",
        "peak_bytes_in_use",
        "peak_over_estimate",
        "data_wait_frac",
        "batch",
        "seq_len",
    )
    out: dict[str, Any] = {"train": {n: {k: p.get(k) for k in keys} for n, p in trains.items()}}
    sweep = {n: trains[n] for n in SWEEP if n in trains}
    if sweep:
        best = max(sweep, key=lambda n: sweep[n]["tokens_per_s"])
        out["best_setting"] = {
            "part": best,
            "mfu": sweep[best]["mfu"],
            "mfu_goal_0.55": sweep[best]["mfu"] >= 0.55,
        }
    out["loss_check"] = loss_check(parts)
    # The fp32 check times no warm-up step: its first step includes the loader's start.
    waits = [p["data_wait_frac"] for n, p in trains.items() if n != "train_fp32_check"]
    if waits:
        out["loader"] = {"max_data_wait_frac": max(waits), "pass": max(waits) < WAIT_GOAL}
    if "decode" in ok:
        rows = ok["decode"]["rows"]
        out["decode"] = [
            {
                "batch": r["batch"],
                "decode_ratio": r["decode_ratio"],
                "goal": r["decode_ratio"] >= (1.0 if r["batch"] == 1 else 2.0),
                "greedy_equal_fp32": r["greedy_rows_equal_float32"],
                "greedy_equal_pass": r["greedy_rows_equal_float32"] == f"{r['batch']}/{r['batch']}",
            }
            for r in rows
        ]
    return out

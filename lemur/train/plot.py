"""`lemur-train plot RUN_DIR`: PNG curves of a run's metrics.jsonl."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lemur.plots import pyplot, save_figure
from lemur.train.metrics import read_records


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records that carry `key`."""
    pairs = [(r["step"], r[key]) for r in records if key in r]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write loss.png (train + each eval domain), lr.png and throughput.png; return paths."""
    plt = pyplot()

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics to plot")
    records = read_records(path)
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(*_series(records, "loss"), label="train", lw=1.2)
    eval_keys = sorted(
        {k for r in records for k in r if k.startswith("eval/") and k.endswith("/loss")}
    )
    for key in eval_keys:
        ax.plot(*_series(records, key), marker="o", label=f"val {key.split('/')[1]}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=f"{run_dir.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "loss.png"))

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*_series(records, "lr"))
    ax.set(xlabel="step", ylabel="learning rate", title=f"{run_dir.name}: schedule")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "lr.png"))

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(*_series(records, "tokens_per_s"), color="tab:blue")
    ax.set(xlabel="step", ylabel="tokens/s", title=f"{run_dir.name}: throughput")
    ax.grid(alpha=0.3)
    steps, mfu = _series(records, "mfu")
    twin = ax.twinx()
    twin.plot(steps, [100 * m for m in mfu], color="tab:orange", ls="--")
    twin.set_ylabel("MFU %", color="tab:orange")
    written.append(_save(fig, out / "throughput.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    """Lay out, save (whole or not at all) and close a figure."""
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)

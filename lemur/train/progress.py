"""What a run shows on the terminal: a progress bar (loss, tokens/s, MFU) and log lines."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def format_record(record: dict[str, Any]) -> str:
    """One line for a metrics record: train loss, throughput and MFU, or eval losses."""
    step = f"step {record['step']:>6}"
    if "loss" in record:
        return (
            f"{step}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
            f"gnorm {record['grad_norm']:.3f}  {record['tokens_per_s']:,.0f} tok/s  "
            f"MFU {100 * record['mfu']:.1f}%"
        )
    evals = [
        f"{k.split('/')[1]} {v:.4f}"
        for k, v in record.items()
        if k.startswith("eval/") and k.endswith("/loss")
    ]
    return f"{step}  eval loss  " + "  ".join(evals)


class Reporter:
    """Prints records (process 0 only) with a live progress bar when stderr is a terminal."""

    def __init__(self, total: int, start: int, *, enabled: bool = True, bar: bool = True) -> None:
        self.enabled = enabled
        self.console = Console(file=sys.stderr)
        self.progress: Progress | None = None
        # The live bar starts with the first step, not during set-up: an interrupted
        # set-up ends the process at once (lemur.train.interrupt), and must not leave the
        # terminal with a hidden cursor.
        self._bar = enabled and bar and self.console.is_terminal
        self._total = total

    def _start_bar(self, start: int) -> None:
        self._bar = False
        self.progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "loss {task.fields[loss]}  {task.fields[tps]} tok/s  MFU {task.fields[mfu]}"
            ),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(
            "train", total=self._total, completed=start, loss="-", tps="-", mfu="-"
        )
        self.progress.start()

    def message(self, text: str) -> None:
        """Print a line (above the bar)."""
        if self.enabled:
            self.console.print(text, highlight=False, soft_wrap=True)

    def step(self, step: int) -> None:
        """Advance the bar to `step` optimizer steps done (starting it the first time)."""
        if self._bar:
            self._start_bar(step)
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def record(self, record: dict[str, Any]) -> None:
        """Show a metrics record as a line, and in the bar's fields."""
        if not self.enabled:
            return
        self.message(format_record(record))
        if self.progress is not None and "loss" in record:
            self.progress.update(
                self.task,
                loss=f"{record['loss']:.4f}",
                tps=f"{record['tokens_per_s']:,.0f}",
                mfu=f"{100 * record['mfu']:.1f}%",
            )

    def close(self) -> None:
        """Stop the live bar."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

"""Progress of a long command, readable on a terminal and in a log file alike.

On a terminal, `Progress` draws rich bars (one per stage) on stderr. Without one (nohup,
Slurm, CI, `2> log`), a live bar shows nothing until the end, so it prints plain lines
instead, as datatrove's own logs do: one every `interval` seconds while a stage runs (tasks
done / total, elapsed, ETA) and, for a stage that ran that long, one when it ends with its
wall time; a stage that an earlier run did in part or whole says so at once:

    lemur-data: tokenize: 3 of 8 tasks already done, resuming
    lemur-data: tokenize: 5/8 tasks, 1m05s elapsed, ETA 2m10s
    lemur-data: tokenize: 8/8 tasks done in 2m53s

A stage shorter than the interval prints nothing (a log is not flooded by the many quick
ones, and a mistake found at once stays the one line on stderr). A stage of one step
(total 1: listing inputs, a compile) prints no counts. The interval is 30 s, or
`LEMUR_PROGRESS_INTERVAL` seconds from the environment. `heartbeat(prog, what)`
is the same for one step of unknown length. Every line goes to stderr, so that a command's
results on stdout (tables, JSON) stay apart from it; `Progress.results` is the console to
print results on while bars are shown.

    with Progress("lemur-eval", unit="tasks") as progress:
        for i, task in enumerate(tasks):
            progress("infill multi-line", i, len(tasks))
            ...
        progress("infill multi-line", len(tasks), len(tasks))
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

INTERVAL_ENV = "LEMUR_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 30.0


def progress_interval() -> float:
    """Seconds between plain progress lines: `LEMUR_PROGRESS_INTERVAL`, else 30."""
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_INTERVAL
    return value if math.isfinite(value) and value > 0 else DEFAULT_INTERVAL


def format_duration(seconds: float) -> str:
    """A duration as a log shows it: `45s`, `3m05s`, `2h03m`, `4d07h`."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def eta_seconds(
    done: float, total: float, elapsed: float, done_at_start: float = 0
) -> float | None:
    """Seconds left at the rate of the work done since the start (None before any): work
    an earlier run did (`done_at_start`) does not count towards the rate."""
    rate_done = done - done_at_start
    if rate_done <= 0 or elapsed <= 0 or done >= total:
        return None
    return (total - done) * elapsed / rate_done


@dataclass
class _Stage:
    """One stage as the plain lines see it."""

    total: int
    done: int
    done_at_start: int
    started: float = field(default_factory=time.monotonic)
    last_line: float = field(default_factory=time.monotonic)
    finished: bool = False
    shown: bool = False  # a plain line said it runs: its end is said too


class Progress:
    """Progress of a command's stages: rich bars on a terminal, plain lines otherwise.

    Call it as `progress(stage, done, total)` (the build's `Reporter` signature) each time a
    stage moves; `note(text)` prints a line between bars or log lines.
    """

    def __init__(
        self,
        prog: str,
        unit: str = "tasks",
        *,
        interval: float | None = None,
        stream: TextIO | None = None,
        terminal: bool | None = None,
    ) -> None:
        from rich.console import Console

        self.prog, self.unit = prog, unit
        self.interval = progress_interval() if interval is None else interval
        self.stream = stream or sys.stderr
        self.console = Console(file=self.stream)
        self.terminal = self.console.is_terminal if terminal is None else terminal
        self.stages: dict[str, _Stage] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None
        self.bars: Any = None  # rich's Progress, on a terminal
        self.bar_ids: dict[str, Any] = {}

    def __enter__(self) -> Progress:
        if self.terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bars

            self.bars = Bars(
                TextColumn("{task.description:<14}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                redirect_stdout=False,  # results on a redirected stdout stay there
            )
            self.bars.__enter__()
        else:
            # Stages that report rarely (a tokenizer trained in one step) still get a line
            # every interval, so that a log shows the command is alive.
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()
        if self.bars is not None:
            self.bars.__exit__(*exc)
            self.bars = None

    @property
    def results(self) -> Any:
        """The rich console for a command's results: stdout, or the bars' console while
        they are drawn on the same terminal (so that they do not tear each other)."""
        from rich.console import Console

        if self.bars is not None and sys.stdout.isatty():
            return self.console
        return Console()

    def note(self, text: str) -> None:
        """A line of its own: above the bars, or a plain `PROG: text` line."""
        if self.bars is not None:
            self.bars.console.print(text, highlight=False, soft_wrap=True)
        else:
            self._write(text)

    def __call__(self, stage: str, done: int, total: int) -> None:
        """Stage `stage` has `done` of `total` units done."""
        with self.lock:
            known = self.stages.get(stage)
            if known is None:
                known = self.stages[stage] = _Stage(total, done, done)
                self._started(stage, known)
            known.done, known.total = done, total
            if done >= total and not known.finished:
                known.finished = True
                if known.shown:
                    took = format_duration(time.monotonic() - known.started)
                    self._write(f"{self._where(stage, known)} done in {took}")
        if self.bars is not None:
            if stage not in self.bar_ids:
                self.bar_ids[stage] = self.bars.add_task(stage, total=total)
            self.bars.update(self.bar_ids[stage], completed=done, total=total)

    def _started(self, stage: str, s: _Stage) -> None:
        """The first report of a stage: what an earlier run did of it."""
        if s.done_at_start >= s.total:
            said = "already done" if s.total == 1 else f"all {s.total} {self.unit} already done"
            self._say(f"{stage}: {said}")
            s.finished = True
        elif s.done_at_start > 0:
            self._say(f"{stage}: {s.done_at_start} of {s.total} {self.unit} already done, resuming")
            s.shown = True

    def _say(self, text: str) -> None:
        """A line on both displays (what an earlier run left matters on a terminal too)."""
        if self.bars is not None:
            self.bars.console.print(text, highlight=False, soft_wrap=True)
        else:
            self._write(text)

    def _where(self, stage: str, s: _Stage) -> str:
        return stage if s.total == 1 else f"{stage}: {s.done}/{s.total} {self.unit}"

    def line(self, stage: str) -> str:
        """The plain progress line of `stage` now (counts, elapsed, ETA)."""
        s = self.stages[stage]
        elapsed = time.monotonic() - s.started
        text = f"{self._where(stage, s)}, {format_duration(elapsed)} elapsed"
        eta = eta_seconds(s.done, s.total, elapsed, s.done_at_start)
        return text if eta is None else f"{text}, ETA {format_duration(eta)}"

    def _tick(self) -> None:
        """The plain display's clock: a line for each running stage every interval."""
        while not self.stop.wait(min(self.interval, 1.0)):
            now = time.monotonic()
            with self.lock:
                for stage, s in self.stages.items():
                    if not s.finished and now - s.last_line >= self.interval:
                        self._write(self.line(stage))
                        s.last_line, s.shown = now, True

    def _write(self, text: str) -> None:
        if self.bars is not None:
            return
        print(f"{self.prog}: {text}", file=self.stream, flush=True)


@contextlib.contextmanager
def heartbeat(
    prog: str,
    what: str,
    *,
    interval: float | None = None,
    stream: TextIO | None = None,
    terminal: bool | None = None,
) -> Iterator[Progress]:
    """One step of unknown length (a compile): `what, 1m30s elapsed` every interval, then
    `what done in 2m03s` (a bar with its elapsed time on a terminal)."""
    with Progress(prog, interval=interval, stream=stream, terminal=terminal) as progress:
        progress(what, 0, 1)
        yield progress
        progress(what, 1, 1)

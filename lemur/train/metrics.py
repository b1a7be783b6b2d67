"""Metrics out of a run: JSONL records, TensorBoard when installed, the terminal (a progress
bar and log lines), peak FLOP/s for MFU, and the train records the loop makes of each step.

Records are flat dicts with a `step` key: train records (`loss`, `grad_norm`, `lr`,
`tokens_per_s`, `mfu`, ...) every `log.every` steps and eval records (`eval/<domain>/loss`)
every `eval.every` steps, appended to `RUN_DIR/metrics.jsonl` by process 0. `RunLog` sends
each record to every place it goes; `TrainRecords` is the loop's metrics hook.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from lemur.progress import eta_seconds, format_duration
from lemur.shards.format import atomic_write_bytes
from lemur.train.errors import RunError

# Dense bf16 peak TFLOP/s per JAX device, by a substring of `device.device_kind` (first
# match wins, so longer names come first). Vendor datasheets; MFU is quoted against bf16
# peak whatever the compute dtype, as MaxText and PaLM do.
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100", 989.0),
    ("H200", 989.0),
    ("H800", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("TPU v6 lite", 918.0),
    ("TPU v6e", 918.0),
    ("TPU v5 lite", 197.0),
    ("TPU v5e", 197.0),
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),
    ("TPU v4", 275.0),
)
_measured: dict[str, float] = {}


def measure_matmul_tflops(dtype: Any = jnp.float32, n: int = 1024, repeats: int = 5) -> float:
    """Best TFLOP/s of an n x n matmul on the default device (how CPU peak is estimated).

    A CPU has no datasheet figure JAX can see; the best a large matmul achieves on this
    machine is the practical ceiling of a train step, so CPU MFU is quoted against it.
    """
    key = f"{jnp.dtype(dtype).name}:{n}"
    if key not in _measured:
        a = jnp.ones((n, n), dtype)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best = math.inf
        for _ in range(repeats):
            t = time.perf_counter()
            f(a).block_until_ready()
            best = min(best, time.perf_counter() - t)
        _measured[key] = 2 * n**3 / best / 1e12
    return _measured[key]


def peak_tflops_per_device(override: float | None = None, dtype: Any = jnp.float32) -> float:
    """Peak TFLOP/s of one device: the override, the datasheet table, or a measured matmul.

    On CPU all emulated devices of a process share the host's cores, so the host's
    measured matmul rate is divided among them.
    """
    if override is not None:
        return float(override)
    tflops = datasheet_tflops(jax.local_devices()[0].device_kind)
    if tflops is not None:
        return tflops
    return measure_matmul_tflops(dtype) / jax.local_device_count()


def datasheet_tflops(device_kind: str) -> float | None:
    """Dense bf16 peak TFLOP/s of a device kind ("TPU v4", "NVIDIA H100 ..."), None if
    the table does not know it."""
    for name, tflops in PEAK_TFLOPS:
        if name.lower() in device_kind.lower():
            return tflops
    return None


class MetricsWriter:
    """Appends records to `metrics.jsonl` (and TensorBoard); a no-op off process 0.

    `tensorboard`: None writes events when a writer is installed, and leaves in `note` the
    line saying that none is; True requires one (RunError, one line, before any file);
    False writes none.
    """

    def __init__(
        self, run_dir: str | os.PathLike, *, enabled: bool = True, tensorboard: bool | None = None
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.note: str | None = None
        wanted = enabled and tensorboard is not False
        if wanted and not tensorboard_available():
            if tensorboard:
                raise RunError(
                    f"log.tensorboard: true, but {_NO_WRITER}: pip install tensorboardX, or set "
                    "log.tensorboard: false"
                )
            self.note = (
                f"lemur-train: no TensorBoard events ({_NO_WRITER}: pip install tensorboardX); "
                "metrics.jsonl holds every record"
            )
            wanted = False
        self._tb = _tensorboard_writer(Path(run_dir) / "tensorboard") if wanted else None

    def truncate_after(self, step: int) -> None:
        """Drop records past `step` and torn lines (a killed run's), rewriting atomically.

        A torn last line must go too: the next record would be appended to it, and both
        would be lost to every reader.
        """
        if not self.enabled or not self.path.exists():
            return
        raw = self.path.read_text(errors="replace")
        kept = []
        for line in raw.splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(line + "\n")
        text = "".join(kept)
        if text != raw:
            atomic_write_bytes(self.path, text.encode())

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (flushed at once: a killed run keeps what it logged)."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        """Flush and close the TensorBoard writer."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None


_NO_WRITER = "neither tensorboardX nor torch's tensorboard is installed"


def tensorboard_available() -> bool:
    """Whether a TensorBoard writer can be had: tensorboardX, or torch with tensorboard."""
    # Look before importing: importing torch only to find tensorboard missing costs seconds.
    find = importlib.util.find_spec
    return find("tensorboardX") is not None or (
        find("tensorboard") is not None and find("torch") is not None
    )


def _tensorboard_writer(directory: Path) -> Any:
    """A SummaryWriter from tensorboardX, or torch's when tensorboard is installed, else None."""
    if importlib.util.find_spec("tensorboardX") is not None:
        from tensorboardX import SummaryWriter

        return SummaryWriter(str(directory))
    if tensorboard_available():
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(directory))
    return None


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (a torn last line from a killed run is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class StepWindow:
    """Losses and tokens since the last log record, for averages and tokens/s."""

    def __init__(self, start: float, losses: list[float] | None = None) -> None:
        self.restart(start)
        self.losses.extend(losses or [])  # carried over from the checkpoint on resume

    def restart(self, start: float) -> None:
        """A new window: no losses, clock from `start`."""
        self.losses: list[float] = []
        self.restart_clock(start)

    def restart_clock(self, start: float) -> None:
        """Time from `start` (after an eval, which is not training time); keep the losses."""
        self.start, self.tokens, self.steps = start, 0, 0
        self.data_wait = 0.0
        self.put_time = 0.0

    def add(self, loss: float, tokens: int) -> None:
        """Count one step."""
        self.losses.append(loss)
        self.tokens += tokens
        self.steps += 1

    def mean_loss(self) -> float:
        """Mean loss of the window's steps."""
        return float(np.mean(self.losses)) if self.losses else math.nan


# ---------------------------------------------------------------------------- terminal


def format_record(record: dict[str, Any]) -> str:
    """One line for a metrics record: train loss (the mean over the steps since the previous
    record, so labelled), throughput and MFU, or eval losses."""
    step = f"step {record['step']:>6}"
    if "loss" in record:
        return (
            f"{step}  mean loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
            f"gnorm {record['grad_norm']:.3f}  {record['tokens_per_s']:,.0f} tok/s  "
            f"MFU {100 * record['mfu']:.1f}%"
        )
    harness = [
        f"{k.removeprefix('harness/')} {v:.4f}"
        for k, v in record.items()
        if k.startswith("harness/") and not k.endswith("_stderr")
    ]
    if harness:  # lemur.train.harness_hook's record: the task metrics
        return f"{step}  harness  " + "  ".join(harness)
    evals = [
        f"{k.split('/')[1]} {v:.4f}"
        for k, v in record.items()
        if k.startswith("eval/") and k.endswith("/loss")
    ]
    return f"{step}  eval loss  " + "  ".join(evals)


class Reporter:
    """Prints records (process 0 only) with a live progress bar when stderr is a terminal;
    train records say the time trained and the time left (ETA), read in a log file too."""

    def __init__(
        self,
        total: int,
        start: int,
        *,
        enabled: bool = True,
        bar: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.clock = clock
        self.began: tuple[int, float] | None = None  # (first step, when): this run's rate
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
                "mean loss {task.fields[loss]}  {task.fields[tps]} tok/s  MFU {task.fields[mfu]}"
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
        if self.began is None:
            self.began = (step, self.clock())
        if self._bar:
            self._start_bar(step)
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def record(self, record: dict[str, Any]) -> None:
        """Show a metrics record as a line, and in the bar's fields."""
        if not self.enabled:
            return
        self.message(format_record(record) + self._timing(record))
        if self.progress is not None and "loss" in record:
            self.progress.update(
                self.task,
                loss=f"{record['loss']:.4f}",
                tps=f"{record['tokens_per_s']:,.0f}",
                mfu=f"{100 * record['mfu']:.1f}%",
            )

    def _timing(self, record: dict[str, Any]) -> str:
        """`  1m05s elapsed  ETA 5m25s` for a train record (the ETA at this run's rate)."""
        if "loss" not in record or self.began is None:
            return ""
        first, since = self.began
        elapsed = self.clock() - since
        text = f"  {format_duration(elapsed)} elapsed"
        eta = eta_seconds(record["step"], self._total, elapsed, first)
        return text if eta is None else f"{text}  ETA {format_duration(eta)}"

    def close(self) -> None:
        """Stop the live bar."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ---------------------------------------------------------------------------- the run's log


class RunLog:
    """Where a run's records go: metrics.jsonl (and TensorBoard), the terminal, and the
    caller's `on_metrics`; process 0 only writes and prints."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        steps: int,
        *,
        enabled: bool,
        tensorboard: bool | None,
        bar: bool,
        on_metrics: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.writer = MetricsWriter(run_dir, enabled=enabled, tensorboard=tensorboard)
        self.reporter = Reporter(steps, 0, enabled=enabled, bar=bar)
        self.on_metrics = on_metrics

    def emit(self, record: dict[str, Any]) -> None:
        """One record to the file, the terminal and `on_metrics`."""
        self.writer.write(record)
        self.reporter.record(record)
        if self.on_metrics is not None:
            self.on_metrics(record)

    def message(self, text: str) -> None:
        """A log line (process 0)."""
        self.reporter.message(text)

    def close(self) -> None:
        """Stop the bar, close TensorBoard."""
        self.reporter.close()
        self.writer.close()


class TrainRecords:
    """The loop's metrics hook: each step's (checked) numbers averaged over the window, and a
    train record every `every` steps and at step `last`."""

    def __init__(
        self,
        log: RunLog,
        every: int,
        last: int,
        tokens_per_step: int,
        flops_per_token: float,
        peak_flops: float,
    ) -> None:
        self.log, self.every, self.last = log, every, last
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops  # of all devices: the MFU denominator

    def __call__(self, step: int, m: dict[str, float], window: StepWindow) -> None:
        """Count step `step` (its metrics `m`) in the window; a record when one is due."""
        window.add(m["loss"], self.tokens_per_step)
        self.log.reporter.step(step)
        if step % self.every and step != self.last:
            return
        now = time.perf_counter()
        elapsed = max(now - window.start, 1e-9)
        tps = window.tokens / elapsed
        self.log.emit(
            {
                "step": step,
                "loss": window.mean_loss(),
                "grad_norm": m["grad_norm"],
                "lr": m["lr"],
                "tokens_per_s": tps,
                "mfu": tps * self.flops_per_token / self.peak_flops,
                "step_s": (now - window.start) / max(window.steps, 1),
                "param_norm": m["param_norm"],
                "data_wait_frac": window.data_wait / elapsed,
                "batch_put_frac": window.put_time / elapsed,
                "tokens_seen": step * self.tokens_per_step,
                "valid_tokens": int(m["tokens"]),
            }
        )
        window.restart(now)

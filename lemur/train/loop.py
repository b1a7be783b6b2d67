"""The training run: set up, then step, calling the hooks (evals, checkpoints) that are due.

`Trainer.__init__` reads top to bottom: each part of the run is made by a function from
what came before it (lemur.train.setup: the plan, the data, the checkpointer;
lemur.train.state: the mesh and the state's layout; lemur.train.step: the optimizer and
the batches; lemur.train.metrics: the log). `run()` starts the state (the newest
checkpoint, a pretrained model or a fresh init), compiles the steps and loops.

The loop follows nanodo: the step is compiled ahead of time with explicit shardings and
a donated state, and step n+1 is dispatched before step n's metrics are read, so the
host never stalls the devices. A non-finite loss, gradient or parameter norm stops the
run before anything is saved from that step on: the last checkpoint stays intact. After
a step, the hooks due then run in order, as levanter's trainer hooks do: the evals (before
the save: a checkpoint implies its step's eval record), then the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lemur.model.config import flops_per_token, param_count
from lemur.shards.format import ShardFormatError
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.token_bytes import TokenBytes, bits_per_byte
from lemur.train import interrupt
from lemur.train import step as step_lib
from lemur.train.batch import Batch, BatchLayout
from lemur.train.config import TrainConfig, with_absolute_paths
from lemur.train.errors import RunError, TrainingDiverged
from lemur.train.harness_hook import HarnessHook
from lemur.train.loader import EvalStream
from lemur.train.metrics import RunLog, StepWindow, TrainRecords, peak_tflops_per_device
from lemur.train.setup import (
    DataDirs,
    RunSummary,
    StopSignal,
    check_writable_dir,
    open_checkpointer,
    open_eval_streams,
    open_loader,
    plan_run,
    prepare_run_dir,
)
from lemur.train.state import Start, initial_state, make_run_mesh, start_processes
from lemur.train.step import State, StateLayout


@dataclasses.dataclass
class StepInfo:
    """What a hook sees after a step: its number, the new state, the open log window."""

    step: int
    state: State
    window: StepWindow


@dataclasses.dataclass(frozen=True)
class Hook:
    """A function the loop calls after the steps it is due at: every `every` steps (0: not
    by count), at the last step, and at a stop (a signal) when `on_stop`."""

    run: Callable[[StepInfo], None]
    every: int
    _: dataclasses.KW_ONLY
    on_stop: bool = False
    # Its time is not training time: the window's clock restarts after it (evals).
    pauses_clock: bool = False

    def due(self, step: int, last: int, *, stop: bool) -> bool:
        """Whether it runs after step `step` of `last` (`stop`: the run stops there)."""
        by_count = bool(self.every and step % self.every == 0)
        return step == last or (stop and self.on_stop) or by_count


class Evaluator:
    """The eval hook: every val domain scored with the compiled eval step; one record of the
    loss, perplexity and bits per byte of each domain per call."""

    def __init__(
        self,
        streams: dict[str, EvalStream],
        eval_step: Any,
        batch: BatchLayout,
        token_bytes: TokenBytes,
        log: RunLog,
    ) -> None:
        self.streams, self.eval_step, self.batch = streams, eval_step, batch
        self.token_bytes, self.log = token_bytes, log
        self.last: dict[str, float] = {}  # each domain's mean loss, of the latest call

    def __call__(self, info: StepInfo) -> None:
        """Evaluate the params of `info.state` (the hook's entry)."""
        self.record(info.step, info.state["params"])

    def scores(self, params: Any) -> dict[str, tuple[float, float]]:
        """(mean loss per valid token, bits per byte) of each val domain."""
        results = {}
        for name, stream in self.streams.items():
            parts, n_bytes = [], 0
            try:
                for local in stream:
                    n_bytes += self.token_bytes.batch_bytes(local)  # this host's rows
                    parts.append(self.eval_step(params, self.batch.put(local)))
            except ShardFormatError as e:  # an id outside the vocabulary, found on reading
                raise RunError(f"eval {name}: {str(e).splitlines()[0]}") from None
            sums = np.asarray(jax.device_get(parts), np.float64).reshape(-1, 2).sum(0)
            n_bytes = sum_over_processes(n_bytes)
            loss = float(sums[0] / max(sums[1], 1.0))
            results[name] = (loss, bits_per_byte(float(sums[0]), n_bytes))
        return results

    def record(self, step: int, params: Any) -> None:
        """Score `params`, emit the eval record of `step`, remember each domain's loss."""
        t = time.perf_counter()
        scores = self.scores(params)
        record: dict[str, Any] = {"step": step}
        for name, (loss, bpb) in scores.items():
            record[f"eval/{name}/loss"] = loss
            record[f"eval/{name}/ppl"] = math.exp(min(loss, 80.0))
            record[f"eval/{name}/bpb"] = bpb
        record["eval_s"] = time.perf_counter() - t
        self.log.emit(record)
        self.last = {name: loss for name, (loss, _) in scores.items()}


def sum_over_processes(value: int) -> int:
    """The sum of an integer over every JAX process (itself with one process)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.asarray(multihost_utils.process_allgather(np.int64(value))).sum())


class Trainer:
    """One run of `config` on this process's devices (call `run()`)."""

    def __init__(
        self, config: TrainConfig, on_metrics: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        # Stored absolute (config.yaml, checkpoints): the run is read from other directories.
        config = with_absolute_paths(config)
        start_processes(config)
        self.is_main = jax.process_index() == 0
        self.data_dirs = DataDirs()
        # init_from's model, the steps of epochs, the warmup of its fraction: see plan_run.
        self.plan = plan_run(config, self.data_dirs)
        self.config = config = self.plan.config
        self.model = self.plan.model
        self.run_dir = Path(config.run_dir)
        self.mesh = make_run_mesh(config)
        self.schedule = step_lib.make_schedule(config.schedule, config.steps)
        self.tx = step_lib.make_optimizer(config.optimizer, self.schedule)
        self.layout = StateLayout.of(self.model, self.tx, self.mesh, config.seed)
        self.train_batch = BatchLayout.on(self.mesh, config.batch.size, config.batch.seq_len)
        check_writable_dir(self.run_dir, "run_dir")
        check_writable_dir(config.checkpoint_dir, "checkpoint.dir")
        self.loader = open_loader(config, self.data_dirs, self.plan, self.train_batch.host)
        self.eval_batch = BatchLayout.on(self.mesh, config.eval_batch_size, config.batch.seq_len)
        self.evals = open_eval_streams(config, self.data_dirs, self.plan, self.eval_batch.host)
        # Bytes per token of the run's tokenizer (every directory has the same one), so
        # that evals report bits per byte, comparable across tokenizers.
        first = self.data_dirs[config.data.dirs[0]]
        self.token_bytes = TokenBytes.for_shards(first) if self.evals else None
        self.checkpointer = open_checkpointer(config)
        self.log = RunLog(
            self.run_dir,
            config.steps,
            enabled=self.is_main,
            tensorboard=config.log.tensorboard,
            bar=config.log.progress,
            on_metrics=on_metrics,
        )
        self.harness = self._harness_hook(first.tokenizer_path)  # tasks checked before step 1
        peak = peak_tflops_per_device(config.log.peak_tflops, self.model.compute_dtype)
        self.records = TrainRecords(
            self.log,
            config.log.every,
            config.steps,
            config.tokens_per_step,
            flops_per_token(self.model, config.batch.seq_len),
            1e12 * jax.device_count() * peak,
        )

    def run(self) -> RunSummary:
        """Train to `config.steps` (or a stop signal); checkpoint, evaluate, log on the way."""
        try:
            prepare_run_dir(self.run_dir, self.config, is_main=self.is_main)
            start = self.initial_state()
            if start.state is None:
                self.log.message(
                    f"lemur-train: already at step {start.step} of {self.config.steps} "
                    f"({self.checkpointer.step_dir(start.step)}); nothing to train"
                )
                return self._summary(start, start.step, None, {})
            # Drop what a killed run logged after its last checkpoint (everything when
            # starting over), so metrics.jsonl reads as one history.
            with interrupt.critical():
                self.log.writer.truncate_after(start.step if start.resumed_from is not None else -1)
            train_step, eval_step, compile_s = step_lib.compile_steps(
                self.layout,
                self.schedule,
                self.config,
                self.train_batch,
                self.eval_batch if self.evals else None,
            )
            evaluator = None
            if eval_step is not None:
                evaluator = Evaluator(
                    self.evals, eval_step, self.eval_batch, self.token_bytes, self.log
                )
            return self._train(start, train_step, evaluator, compile_s)
        finally:
            self.log.close()
            self.checkpointer.close()

    def initial_state(self) -> Start:
        """Say what the run is, then where it starts (see `lemur.train.state.initial_state`)."""
        config = self.config
        self.log.message(
            f"lemur-train: {param_count(self.model) / 1e6:,.1f}M params, mesh "
            f"{dict(self.mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
            f"device(s), {jax.process_count()} process(es); {config.tokens_per_step:,} "
            f"tokens/step; eval: {', '.join(self.evals) or 'none (no val shards)'}"
        )
        for note in self.plan.notes:  # what plan_run resolved (the model, steps, warmup)
            self.log.message(note)
        if self.log.writer.note:  # no TensorBoard writer installed: said, not silent
            self.log.message(self.log.writer.note)
        return initial_state(
            config,
            self.layout,
            self.checkpointer,
            self.loader,
            self.log.message,
            is_main=self.is_main,
        )

    def _train(
        self, start: Start, train_step: Any, evaluator: Evaluator | None, compile_s: float
    ) -> RunSummary:
        """The training loop from `start`, with the stop handlers installed."""
        self.log.reporter.step(start.step)
        origin = self.config.model.init_from or "a random init"
        self.log.message(
            (
                f"lemur-train: resumed from step {start.resumed_from}"
                if start.resumed_from is not None
                else f"lemur-train: from {origin}"
            )
            + f"; compiled in {compile_s:.1f}s"
        )
        hooks = []
        if evaluator is not None:
            hooks.append(Hook(evaluator, self.config.eval.every, pauses_clock=True))
        if self.harness is not None:
            every = self.config.eval.harness.every  # type: ignore[union-attr]
            hooks.append(Hook(self.harness, every, pauses_clock=True))
        hooks.append(Hook(self._save, self.config.checkpoint.every, on_stop=True))
        with StopSignal() as stop:
            interrupt.disarm()  # from here on a signal checkpoints and stops
            try:
                with jax.set_mesh(self.mesh):
                    step, last_loss = self._loop(start, train_step, hooks, evaluator, stop)
            except TrainingDiverged as e:
                self.checkpointer.wait()
                latest = self.checkpointer.latest_step()
                where = (
                    f"last checkpoint: step {latest} in {self.checkpointer.directory}"
                    if latest is not None
                    else "no checkpoint was saved"
                )
                raise TrainingDiverged(f"{e}; stopped ({where})") from None
        return self._summary(start, step, last_loss, evaluator.last if evaluator else {})

    def _loop(
        self,
        start: Start,
        train_step: Any,
        hooks: list[Hook],
        evaluator: Evaluator | None,
        stop: StopSignal,
    ) -> tuple[int, float | None]:
        """Steps from `start` to the end or a stop: (last step, its loss)."""
        steps, state, step = self.config.steps, start.state, start.step
        last_loss: float | None = None
        if self.config.eval.at_start and evaluator is not None and step == 0:
            evaluator.record(0, state["params"])
        window = StepWindow(time.perf_counter(), start.log_window)
        pending: tuple[int, Any] | None = None
        while step < steps:
            state, metrics = train_step(state, self._next_batch(window, step))
            step += 1
            # Read step n-1's metrics only now that step n is queued behind it.
            if pending is not None:
                last_loss = self._consume(*pending, window)
            pending = (step, metrics)
            stopping = stop.at(step)
            # A stop (preemption) saves but does not evaluate: the resumed run evaluates
            # where an uninterrupted one would, and the grace period goes to the save.
            due = [hook for hook in hooks if hook.due(step, steps, stop=stopping)]
            if due:
                # Check this step's numbers before saving its state.
                last_loss, pending = self._consume(*pending, window), None
                for hook in due:
                    hook.run(StepInfo(step, state, window))
                    if hook.pauses_clock:
                        window.restart_clock(time.perf_counter())
            if stopping:
                self.log.message(
                    f"lemur-train: stopped at step {step} "
                    "(signal); checkpoint saved, rerun to resume"
                )
                break
        if pending is not None:
            last_loss = self._consume(*pending, window)
        return step, last_loss

    def _next_batch(self, window: StepWindow, step: int) -> Batch:
        """The next global batch; loader time is counted as data wait and transfer."""
        # Time blocked waiting for the loader's next batch: the "data wait". (Assembling
        # the global arrays is timed apart: on CPU it competes with the running step for
        # the cores rather than stalling it.)
        t_data = time.perf_counter()
        try:
            local = next(self.loader)
        except ShardFormatError as e:  # an id outside the vocabulary, found on reading
            raise RunError(f"step {step + 1}: {str(e).splitlines()[0]}") from None
        t_put = time.perf_counter()
        window.data_wait += t_put - t_data
        batch = self.train_batch.put(local)
        window.put_time += time.perf_counter() - t_put
        return batch

    def _consume(self, step: int, metrics: Any, window: StepWindow) -> float:
        """Fetch step `step`'s metrics, stop on a non-finite loss, gradient or parameter
        norm, then the metrics hook (`TrainRecords`); the step's loss."""
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        for name in ("loss", "grad_norm", "param_norm"):
            if not math.isfinite(m[name]):
                raise TrainingDiverged(f"step {step}: {name} is {m[name]}")
        self.records(step, m, window)
        return m["loss"]

    def _harness_hook(self, tokenizer_path: Path) -> HarnessHook | None:
        """The `eval.harness` hook over the run's tokenizer (None without the section)."""
        settings = self.config.eval.harness
        if settings is None:
            return None
        tokenizer = open_tokenizer(tokenizer_path)
        return HarnessHook(settings, self.model, tokenizer, self.log.emit, self.config.seed)

    def _save(self, info: StepInfo) -> None:
        """The checkpoint hook: the state, the loader's position and the run's meta."""
        meta = {
            "step": info.step,
            "tokens_seen": info.step * self.config.tokens_per_step,
            "process_count": jax.process_count(),
            "config": self.config.to_dict(),
            "vocab_size": self.model.vocab_size,
            "tokenizer_sha256": self.plan.tokenizer_sha256,
            # Losses since the last train record: a resumed run's next record averages
            # the same steps as an uninterrupted run's (JSON floats round-trip exactly).
            "log_window": list(info.window.losses),
            "time": time.time(),
        }
        self.checkpointer.save(info.step, info.state, self.loader.get_state(), meta)

    def _summary(
        self, start: Start, step: int, loss: float | None, evals: dict[str, float]
    ) -> RunSummary:
        """What the run reports at its end."""
        return RunSummary(
            step=step,
            loss=loss,
            evals=evals,
            resumed_from=start.resumed_from,
            stopped_early=step < self.config.steps,
            run_dir=str(self.run_dir),
        )


def train(
    config: TrainConfig, on_metrics: Callable[[dict[str, Any]], None] | None = None
) -> RunSummary:
    """Run `config` to the end (resuming from its latest checkpoint); see Trainer."""
    return Trainer(config, on_metrics=on_metrics).run()

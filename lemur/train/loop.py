"""The training run: set up mesh, data, state (fresh, pretrained or resumed), then loop.

The loop follows nanodo: the step is compiled ahead of time with explicit shardings and
a donated state, and step n+1 is dispatched before step n's metrics are read, so the
host never stalls the devices. A non-finite loss, gradient or parameter norm stops the
run before anything is saved from that step on: the last checkpoint stays intact.
"""

from __future__ import annotations

import functools
import math
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lemur.model.config import flops_per_token, param_count
from lemur.shards.format import ShardFormatError, atomic_write_bytes
from lemur.shards.windows import BATCH_KEYS
from lemur.tokenizer import TokenBytes
from lemur.train import interrupt
from lemur.train import mesh as mesh_lib
from lemur.train import step as step_lib
from lemur.train.config import TrainConfig
from lemur.train.inputs import Inputs
from lemur.train.metrics import MetricsWriter, StepWindow, peak_tflops_per_device
from lemur.train.progress import Reporter
from lemur.train.resume import Resume
from lemur.train.run_paths import with_absolute_paths
from lemur.train.setup import (
    DataDirs,
    RunError,
    RunSummary,
    TrainingDiverged,
    check_writable_dir,
    data_vocab,
    make_mesh,
    open_checkpointer,
    plan_run,
)


class Trainer(Inputs, Resume):
    """One run of `config` on this process's devices (call `run()`)."""

    def __init__(
        self, config: TrainConfig, on_metrics: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        # Stored absolute (config.yaml, checkpoints): the run is read from other directories.
        self.config = config = with_absolute_paths(config)
        self.on_metrics = on_metrics
        interrupt.guard_jax_cache_writes()
        mesh_lib.initialize_distributed(config.mesh.distributed)
        if config.compile_cache_dir and not jax.config.jax_compilation_cache_dir:
            jax.config.update(
                "jax_compilation_cache_dir", str(Path(config.compile_cache_dir).expanduser())
            )
        self.is_main = jax.process_index() == 0
        self.run_dir = Path(config.run_dir)
        self.data_dirs = DataDirs()
        # init_from's model, the steps of epochs, the warmup of its fraction: see plan_run.
        self.config, self.model, self.tokenizer_sha, self.notes = plan_run(config, self.data_dirs)
        config = self.config
        self.data_vocab = data_vocab(config, self.data_dirs)[0]  # may be < the model's (padded)
        self.mesh = make_mesh(config)
        self.schedule = step_lib.make_schedule(config.schedule, config.steps)
        self.tx = step_lib.make_optimizer(config.optimizer, self.schedule)
        self.key = jax.random.key(config.seed)
        self.abstract = jax.eval_shape(
            functools.partial(step_lib.init_state, model=self.model, tx=self.tx), self.key
        )
        self.shardings = step_lib.state_shardings(self.abstract, self.model, self.tx, self.mesh)
        self.replicated = NamedSharding(self.mesh, P())
        B, L = config.batch.size, config.batch.seq_len
        self.batch_shape = (B, L)
        self.batch_sharding = mesh_lib.batch_sharding(self.mesh, B, L)
        self.host = mesh_lib.host_slice(self.batch_sharding, self.batch_shape)
        check_writable_dir(self.run_dir, "run_dir")
        check_writable_dir(config.checkpoint_dir, "checkpoint.dir")
        # Set by _make_evals (when there are evals) and _compile; declared here so that
        # every attribute of a Trainer is visible in one place.
        self.eval_sharding: NamedSharding | None = None
        self.eval_shape: tuple[int, int] | None = None
        self.train_step: Any = None
        self.eval_step: Any = None
        self.compile_s = 0.0
        self.loader = self._make_loader()
        self.evals = self._make_evals()
        # Bytes per token of the run's tokenizer (every directory has the same one), so
        # that evals report bits per byte, comparable across tokenizers.
        first = self.data_dirs[config.data.dirs[0]]
        self.token_bytes = TokenBytes.for_shards(first) if self.evals else None
        self.checkpointer = open_checkpointer(config)
        self.writer = MetricsWriter(
            self.run_dir, enabled=self.is_main, tensorboard=config.log.tensorboard
        )
        self.reporter = Reporter(config.steps, 0, enabled=self.is_main, bar=config.log.progress)
        self.resumed_window: list[float] = []
        self.flops_per_token = flops_per_token(self.model, L)
        peak = peak_tflops_per_device(config.log.peak_tflops, self.model.compute_dtype)
        self.peak_flops = 1e12 * jax.device_count() * peak
        self._stop = False

    # ------------------------------------------------------------------ setup

    def _compile(self) -> None:
        """AOT-compile the train and eval steps with explicit shardings (donated state)."""
        b = self.config.batch
        train_fn = step_lib.make_train_step(
            self.model,
            self.tx,
            self.schedule,
            microbatches=b.microbatches,
            document_attention=self.config.data.document_attention,
        )
        abstract_batch = {
            k: jax.ShapeDtypeStruct(self.batch_shape, np.int32, sharding=self.batch_sharding)
            for k in BATCH_KEYS
        }
        abstract_state = step_lib.with_shardings(self.abstract, self.shardings)
        t = time.perf_counter()
        with jax.set_mesh(self.mesh):
            self.train_step = (
                jax.jit(
                    train_fn,
                    in_shardings=(self.shardings, self.batch_sharding),
                    out_shardings=(self.shardings, self.replicated),
                    donate_argnums=0,
                )
                .lower(abstract_state, abstract_batch)
                .compile()
            )
            self.eval_step = None
            if self.evals:
                eval_fn = step_lib.make_eval_step(self.model, self.config.data.document_attention)
                abstract_eval = {
                    k: jax.ShapeDtypeStruct(self.eval_shape, np.int32, sharding=self.eval_sharding)
                    for k in abstract_batch
                }
                self.eval_step = (
                    jax.jit(
                        eval_fn,
                        in_shardings=(self.shardings["params"], self.eval_sharding),
                        out_shardings=self.replicated,
                    )
                    .lower(abstract_state["params"], abstract_eval)
                    .compile()
                )
        self.compile_s = time.perf_counter() - t

    # ------------------------------------------------------------------ loop pieces

    def _emit(self, record: dict[str, Any]) -> None:
        self.writer.write(record)
        self.reporter.record(record)
        if self.on_metrics is not None:
            self.on_metrics(record)

    def _save(self, step: int, state: step_lib.State, window: StepWindow) -> None:
        meta = {
            "step": step,
            "tokens_seen": step * self.config.tokens_per_step,
            "process_count": jax.process_count(),
            "config": self.config.to_dict(),
            "vocab_size": self.model.vocab_size,
            "tokenizer_sha256": self.tokenizer_sha,
            # Losses since the last train record: a resumed run's next record averages
            # the same steps as an uninterrupted run's (JSON floats round-trip exactly).
            "log_window": list(window.losses),
            "time": time.time(),
        }
        self.checkpointer.save(step, state, self.loader.get_state(), meta)

    def _install_stop_handlers(self) -> dict[int, Any]:
        """SIGTERM/SIGINT: finish the current step, checkpoint, return (preemption)."""

        def request_stop(signum: int, _frame: Any) -> None:
            self._stop = True
            signal.signal(signum, previous[signum])  # a second signal acts as usual

        previous: dict[int, Any] = {}
        if jax.process_count() > 1:
            return previous  # JAX's preemption service owns SIGTERM; Ctrl-C stays Ctrl-C
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, request_stop)
            except ValueError:  # not the main thread: leave signals alone
                break
        return previous

    def _should_stop(self, step: int) -> bool:
        if jax.process_count() > 1:
            # Every host must stop at the same step: JAX's preemption service agrees on it.
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return self._stop

    # ------------------------------------------------------------------ run

    def run(self) -> RunSummary:
        """Train to `config.steps` (or a stop signal); checkpoint, evaluate, log on the way."""
        try:
            state, start, resumed = self._setup()
            if state is None:
                self.reporter.message(
                    f"lemur-train: already at step {start} of {self.config.steps} "
                    f"({self.checkpointer.step_dir(start)}); nothing to train"
                )
                return RunSummary(
                    step=start,
                    loss=None,
                    evals={},
                    resumed_from=resumed,
                    stopped_early=False,
                    run_dir=str(self.run_dir),
                )
            return self._train(state, start, resumed)
        finally:
            self.reporter.close()
            self.checkpointer.close()
            self.writer.close()

    def _setup(self) -> tuple[step_lib.State | None, int, int | None]:
        """Run directory, initial state, metrics trimmed to it, compiled steps."""
        config = self.config
        self._prepare_run_dir()
        n_params = param_count(self.model)
        self.reporter.message(
            f"lemur-train: {n_params / 1e6:,.1f}M params, mesh {dict(self.mesh.shape)} on "
            f"{jax.device_count()} {jax.devices()[0].platform} device(s), "
            f"{jax.process_count()} process(es); {config.tokens_per_step:,} tokens/step; "
            f"eval: {', '.join(self.evals) or 'none (no val shards)'}"
        )
        state, start, resumed = self._initial_state()
        if state is not None:
            # Drop what a killed run logged after its last checkpoint (everything when
            # starting over), so metrics.jsonl reads as one history.
            with interrupt.critical():
                self.writer.truncate_after(start if resumed is not None else -1)
            self._compile()
        return state, start, resumed

    def _prepare_run_dir(self) -> None:
        """Create the run directory and write the resolved config (whole or not at all)."""
        if not self.is_main:
            return
        try:
            with interrupt.critical():
                self.run_dir.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(self.run_dir / "config.yaml", self.config.to_yaml().encode())
        except OSError as e:
            raise RunError(f"run_dir: {self.run_dir}: {e.strerror or e}") from None

    def _train(self, state: step_lib.State, start: int, resumed: int | None) -> RunSummary:
        """The training loop from `start`, with the stop handlers installed."""
        self.reporter.step(start)
        self.reporter.message(
            (
                f"lemur-train: resumed from step {resumed}"
                if resumed is not None
                else "lemur-train: from " + (self.config.model.init_from or "a random init")
            )
            + f"; compiled in {self.compile_s:.1f}s"
        )
        previous_handlers = self._install_stop_handlers()
        interrupt.disarm()  # from here on a signal checkpoints and stops
        try:
            with jax.set_mesh(self.mesh):
                step, last_loss, evals = self._loop(state, start)
        except TrainingDiverged as e:
            self.checkpointer.wait()
            latest = self.checkpointer.latest_step()
            where = (
                f"last checkpoint: step {latest} in {self.checkpointer.directory}"
                if latest is not None
                else "no checkpoint was saved"
            )
            raise TrainingDiverged(f"{e}; stopped ({where})") from None
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
        return RunSummary(
            step=step,
            loss=last_loss,
            evals=evals,
            resumed_from=resumed,
            stopped_early=step < self.config.steps,
            run_dir=str(self.run_dir),
        )

    def _loop(
        self, state: step_lib.State, start: int
    ) -> tuple[int, float | None, dict[str, float]]:
        """Steps from `start` to the end or a stop: (last step, its loss, last evals)."""
        config = self.config
        evals: dict[str, float] = {}
        last_loss: float | None = None
        if config.eval.at_start and self.eval_step is not None and start == 0:
            evals = self._eval_record(0, state["params"])
        window = StepWindow(time.perf_counter(), self.resumed_window)
        pending: tuple[int, Any] | None = None
        step = start
        while step < config.steps:
            batch = self._next_batch(window, step)
            state, metrics = self.train_step(state, batch)
            step += 1
            # Read step n-1's metrics only now that step n is queued behind it.
            if pending is not None:
                last_loss = self._consume(*pending, window)
            pending = (step, metrics)
            stop = self._should_stop(step)
            at_end = step == config.steps
            # A stop (preemption) saves but does not evaluate: the resumed run evaluates
            # where an uninterrupted one would, and the grace period goes to the save.
            do_eval = self.eval_step is not None and (
                at_end or (config.eval.every and step % config.eval.every == 0)
            )
            do_save = (
                at_end or stop or (config.checkpoint.every and step % config.checkpoint.every == 0)
            )
            if do_eval or do_save:
                # Check this step's numbers before saving its state.
                last_loss = self._consume(*pending, window)
                pending = None
                if do_eval:  # before the save: a checkpoint implies its step's eval record
                    evals = self._eval_record(step, state["params"])
                    window.restart_clock(time.perf_counter())
                if do_save:
                    self._save(step, state, window)
            if stop:
                self.reporter.message(
                    f"lemur-train: stopped at step {step} "
                    "(signal); checkpoint saved, rerun to resume"
                )
                break
        if pending is not None:
            last_loss = self._consume(*pending, window)
        return step, last_loss, evals

    def _next_batch(self, window: StepWindow, step: int) -> Any:
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
        batch = mesh_lib.global_batch(local, self.batch_sharding, self.batch_shape)
        window.put_time += time.perf_counter() - t_put
        return batch

    def _consume(self, step: int, metrics: Any, window: StepWindow) -> float:
        """Fetch one step's metrics, stop on non-finite numbers, log every `log.every`."""
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        for name in ("loss", "grad_norm", "param_norm"):
            if not math.isfinite(m[name]):
                raise TrainingDiverged(f"step {step}: {name} is {m[name]}")
        window.add(m["loss"], self.config.tokens_per_step)
        self.reporter.step(step)
        if step % self.config.log.every == 0 or step == self.config.steps:
            now = time.perf_counter()
            tps = window.tokens / max(now - window.start, 1e-9)
            self._emit(
                {
                    "step": step,
                    "loss": window.mean_loss(),
                    "grad_norm": m["grad_norm"],
                    "lr": m["lr"],
                    "tokens_per_s": tps,
                    "mfu": tps * self.flops_per_token / self.peak_flops,
                    "step_s": (now - window.start) / max(window.steps, 1),
                    "param_norm": m["param_norm"],
                    "data_wait_frac": window.data_wait / max(now - window.start, 1e-9),
                    "batch_put_frac": window.put_time / max(now - window.start, 1e-9),
                    "tokens_seen": step * self.config.tokens_per_step,
                    "valid_tokens": int(m["tokens"]),
                }
            )
            window.restart(now)
        return m["loss"]


def train(
    config: TrainConfig, on_metrics: Callable[[dict[str, Any]], None] | None = None
) -> RunSummary:
    """Run `config` to the end (resuming from its latest checkpoint); see Trainer."""
    return Trainer(config, on_metrics=on_metrics).run()

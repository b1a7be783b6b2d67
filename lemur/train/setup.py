"""A run's set-up before its first step: its summary, the plan (the config and
model resolved from the pre-trained model and the data, checked against both), the
data opened and checked, the checkpointer, the run directory, and the stop signal.

Each function takes what it needs and returns what it makes; `lemur.train.loop.Trainer`
calls them in order.
"""

from __future__ import annotations

import dataclasses
import math
import signal
from pathlib import Path
from typing import Any

import jax

from lemur import machine
from lemur.export.foreign import ForeignData, open_foreign
from lemur.model import pretrained
from lemur.model.config import PARAM_SHAPE_FIELDS, LlamaConfig
from lemur.shards.check import ShardDir
from lemur.shards.format import ShardFormatError, atomic_write_bytes, sha256_file
from lemur.shards.windows import NoWindowError
from lemur.tokenizer import TokenizerError
from lemur.tokenizer.sentencepiece import read_model
from lemur.train import interrupt
from lemur.train.batch import HostSlice
from lemur.train.checkpoint import Checkpointer
from lemur.train.config import DataEntry, TrainConfig, with_steps
from lemur.train.errors import RunError
from lemur.train.loader import (
    EvalStream,
    ExpectedTokenizer,
    Reading,
    TrainIterator,
    make_eval_iterators,
    make_train_iterator,
)
from lemur.train.plan_estimate import mesh_fits, step_bytes


@dataclasses.dataclass
class RunSummary:
    """What a finished (or stopped) run reports."""

    step: int
    loss: float | None
    evals: dict[str, float]
    resumed_from: int | None
    stopped_early: bool
    run_dir: str


class DataDirs:
    """The run's shard directories, each opened once (`ShardDir`: one manifest read, one
    tokenizer hash, checks run once) on first use, shared by the loader and the evals."""

    def __init__(self) -> None:
        self._open: dict[DataEntry, ShardDir] = {}

    def __getitem__(self, directory: DataEntry) -> ShardDir:
        """The opened directory, or another trainer's corpus (`ForeignData`) presented as one;
        RunError (one line) when it cannot be read."""
        if directory not in self._open:
            try:
                self._open[directory] = (
                    open_foreign(directory)
                    if isinstance(directory, ForeignData)
                    else ShardDir(directory)
                )
            except (ShardFormatError, OSError) as e:
                raise RunError(str(e).splitlines()[0]) from None
        return self._open[directory]


def data_vocab(config: TrainConfig, dirs: DataDirs) -> tuple[int, str | None]:
    """The vocab size (the model's, else the shards') and the tokenizer hash of the data."""
    tok = dirs[config.data.dirs[0]].tokenizer
    return config.model.vocab_size or int(tok["vocab_size"]), tok.get("sha256")


def check_writable_dir(path: Path, key: str) -> None:
    """Refuse (one line) a directory path that is, or lies under, an existing non-directory."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise RunError(f"{key}: {p} exists and is not a directory")
            return


def _saved_model(path: str) -> LlamaConfig:
    """The LlamaConfig of `model.init_from`, a lemur checkpoint or an HF model folder
    (RunError naming it if unreadable)."""
    try:
        return pretrained.load_pretrained_config(path)
    except pretrained.PretrainedError as e:
        raise RunError(f"model.init_from: {e}") from None


def resolve_config(config: TrainConfig, dirs: DataDirs) -> tuple[TrainConfig, list[str]]:
    """The config with what comes from the pre-trained model and the data filled in, and a
    log line for each: the model of `init_from` (`model.preset: null`), `steps` from
    `epochs`, `schedule.warmup_steps` from `schedule.warmup_fraction`."""
    notes = []
    if not config.model.complete:
        path = config.model.init_from
        if not path:
            raise RunError(
                "model.init_from: required (model.preset is null): fine-tuning needs a "
                "pre-trained model, an HF model folder or a lemur checkpoint (lemur-convert "
                "to-lemur or from-run)"
            )
        saved = dataclasses.asdict(_saved_model(path))
        fields = {k: v for k, v in saved.items() if k != "vocab_size"}
        model = dataclasses.replace(config.model, overrides={**fields, **config.model.overrides})
        config = dataclasses.replace(config, model=model)
    steps = config.steps
    if config.epochs is not None:
        tokens = sum(int(s["tokens"]) for d in config.data.dirs for s in dirs[d].shards("train"))
        steps = max(1, math.ceil(config.epochs * tokens / config.tokens_per_step))
        notes.append(
            f"lemur-train: {config.epochs:g} epoch(s) of {tokens:,} train tokens = {steps:,} "
            f"steps of {config.tokens_per_step:,} tokens"
        )
    fraction = config.schedule.warmup_fraction
    config = with_steps(config, steps)
    if fraction is not None:
        warmup = config.schedule.warmup_steps
        notes.append(f"lemur-train: warmup {warmup:,} of {steps:,} steps ({fraction:.1%})")
    return config, notes


def resolve_model(config: TrainConfig, vocab_size: int, dirs: DataDirs) -> LlamaConfig:
    """The model of the run; with `init_from`, checked against the checkpoint's shapes and
    tokenizer (a smaller vocabulary only when the data's tokenizer appends the missing ids,
    a larger one only when the data's tokenizer is the checkpoint's own)."""
    model = config.model.llama(vocab_size)
    if config.model.init_from:
        saved = _saved_model(config.model.init_from)
        # Its vocabulary may differ: smaller when the data's tokenizer appends pieces to it
        # (it then grows, see grow_vocab), larger when it is the checkpoint's own tokenizer
        # (an embedding padded past it, as Qwen2.5's 151,936 rows for 151,665 ids).
        for name in PARAM_SHAPE_FIELDS:
            if getattr(saved, name) != getattr(model, name):
                raise RunError(
                    f"model.init_from: {config.model.init_from} has {name} "
                    f"{getattr(saved, name)}, the config gives {getattr(model, name)}"
                )
        compared = check_tokenizer(config.model.init_from, dirs[config.data.dirs[0]])
        if saved.vocab_size > model.vocab_size and compared and not config.model.vocab_size:
            # Every data id is below the checkpoint's vocabulary: keep its padded rows.
            return dataclasses.replace(model, vocab_size=saved.vocab_size)
        if saved.vocab_size != model.vocab_size:
            _check_growth(config, saved.vocab_size, model.vocab_size, dirs)
    return model


def check_tokenizer(path: str, data: ShardDir) -> bool:
    """RunError (one line naming both) unless the shards in `data` were built with the
    tokenizer `path` carries: the same tokenizer.json (sha256), or, for SentencePiece, the
    same model or it with pieces appended (every old id the same piece). Returns whether
    there was a tokenizer to compare (a checkpoint may carry none)."""
    data_file = data.tokenizer_path
    files = pretrained.tokenizer_files(path)
    head = f"model.init_from: {path}: the shards in {data} were built with {data_file}"
    if data_file.suffix == ".json":
        ours = files.get("tokenizer.json")
        if ours is None:
            if files or pretrained.sentencepiece_model(path):
                raise RunError(f"{head}, the model carries no tokenizer.json to compare it with")
            return False
        if (sha := sha256_file(ours)) != data.tokenizer.get("sha256"):
            raise RunError(
                f"{head} (sha256 {str(data.tokenizer.get('sha256'))[:12]}), not with the "
                f"model's tokenizer {ours} (sha256 {sha[:12]})"
            )
        return True
    ours = pretrained.sentencepiece_model(path) or files.get("tokenizer.model")
    if ours is None:
        if files:
            raise RunError(f"{head}, a SentencePiece model; the model's tokenizer is not one")
        return False
    old, new = _pieces(ours), _pieces(data_file)
    bad = next((i for i, piece in enumerate(old) if i >= len(new) or new[i] != piece), None)
    if bad is not None:
        theirs = repr(new[bad]) if bad < len(new) else "missing"
        raise RunError(
            f"{head}, which is neither the model's tokenizer {ours} nor it with pieces "
            f"appended (id {bad} is {theirs} there, {old[bad]!r} in the model's)"
        )
    return True


def _pieces(path: Path) -> list[str]:
    """The piece of every id of a SentencePiece model (RunError with the tokenizer
    package's one line naming it if unreadable)."""
    try:
        return [p.piece for p in read_model(path).pieces]
    except TokenizerError as e:
        raise RunError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What a run trains: the resolved config, the model, the data's vocabulary (may be below
    the model's, a padded one) and tokenizer hash, and a log line for each resolved value."""

    config: TrainConfig
    model: LlamaConfig
    data_vocab: int
    tokenizer_sha256: str | None
    notes: list[str]


def plan_run(config: TrainConfig, dirs: DataDirs) -> RunPlan:
    """`resolve_config` (init_from's model, the steps of epochs, the warmup of its
    fraction), then the vocabulary of the data and the model checked against `init_from`."""
    config, notes = resolve_config(config, dirs)
    vocab, tokenizer_sha = data_vocab(config, dirs)
    model = resolve_model(config, vocab, dirs)
    if jax.default_backend() == "cpu":
        check_host_memory(config, model, machine.host_memory_bytes())
    return RunPlan(config, model, vocab, tokenizer_sha, notes)


def _size(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_host_memory(config: TrainConfig, model: LlamaConfig, memory: int) -> None:
    """RunError naming the batch keys when the step's estimated memory (plan_estimate: the
    state, the activations of one microbatch, a chunk of logits) exceeds the host's: on CPU
    such a run is killed by the kernel, without a word, at its first step (the `continue`
    config's 256 x 4096 does it to small hosts)."""
    devices = jax.device_count()
    if not mesh_fits(config, devices):
        return  # the mesh itself is refused later, in one line naming mesh.*
    need = step_bytes(config, model, devices)
    if need.total <= memory:
        return
    # The fewest microbatches (a divisor of batch.size) whose step takes half the memory.
    size = config.batch.size
    more = next(
        (
            m
            for m in range(config.batch.microbatches + 1, size + 1)
            if size % m == 0
            and step_bytes(_microbatches(config, m), model, jax.device_count()).total <= memory / 2
        ),
        size,
    )
    raise RunError(
        f"batch: the train step needs about {_size(need.total)} ({_size(need.state)} of "
        f"parameters and optimizer state, {_size(need.activations)} of activations for "
        f"{size // config.batch.microbatches} x {config.batch.seq_len} tokens), more than "
        f"this host's {_size(memory)}: raise batch.microbatches (e.g. --set "
        f"batch.microbatches={more}) or lower batch.size or batch.seq_len"
    )


def _microbatches(config: TrainConfig, microbatches: int) -> TrainConfig:
    """The config with another batch.microbatches."""
    return dataclasses.replace(
        config, batch=dataclasses.replace(config.batch, microbatches=microbatches)
    )


def _check_growth(config: TrainConfig, saved: int, vocab: int, dirs: DataDirs) -> None:
    """RunError unless ids saved..vocab-1 are pieces the data's tokenizer appends."""
    data = config.data.dirs[0]
    head = f"model.init_from: {config.model.init_from} has vocab_size {saved}, the model {vocab}"
    if saved > vocab:
        raise RunError(f"{head}: a smaller vocabulary cannot hold the checkpoint's tokens")
    tokenizer: dict[str, Any] = dirs[data].tokenizer
    added = {int(p["id"]) for p in tokenizer.get("added_pieces") or [] if "id" in p}
    if not set(range(saved, vocab)) <= added:
        raise RunError(
            f"{head}: ids {saved}..{vocab - 1} are not all pieces that the tokenizer of "
            f"{data} appends (manifest tokenizer.added_pieces), so its vocabulary does not "
            "extend the checkpoint's"
        )


def open_checkpointer(config: TrainConfig) -> Checkpointer:
    """The run's checkpointer (RunError naming `checkpoint.dir` if it cannot be opened)."""
    try:
        return Checkpointer(
            config.checkpoint_dir,
            keep=config.checkpoint.keep,
            async_save=config.checkpoint.async_save,
        )
    except OSError as e:
        raise RunError(f"checkpoint.dir: {config.checkpoint_dir}: {e.strerror or e}") from None


def open_loader(
    config: TrainConfig, dirs: DataDirs, plan: RunPlan, host: HostSlice
) -> TrainIterator:
    """This process's stream of per-host batches (rows `host`), checked against the model."""
    data = config.data
    weights = data.weights or [1.0] * len(data.dirs)
    try:
        return make_train_iterator(
            [(dirs[d], w) for d, w in zip(data.dirs, weights, strict=True)],
            seq_len=config.batch.seq_len,
            batch_size=host.rows,
            seed=config.data_seed,
            process_index=host.index,
            process_count=host.count,
            expect=ExpectedTokenizer(plan.data_vocab, plan.tokenizer_sha256),
            strict_state=data.strict_state,
            reading=Reading(
                num_workers=data.num_workers, num_threads=data.num_threads, prefetch=data.prefetch
            ),
        )
    except (ShardFormatError, OSError, ValueError) as e:
        raise RunError(str(e).splitlines()[0]) from None


def open_eval_streams(
    config: TrainConfig, dirs: DataDirs, plan: RunPlan, host: HostSlice
) -> dict[str, EvalStream]:
    """One stream per val domain of the eval directories (`code`, `text`, ...), rows `host`."""
    streams: dict[str, EvalStream] = {}
    for d in config.data.eval_dirs or config.data.dirs:
        try:
            shard_dir = dirs[d]
            # Checked once per directory: a train directory's checks are not redone.
            shard_dir.check_compatible(
                vocab_size=plan.data_vocab, tokenizer_sha256=plan.tokenizer_sha256
            )
            found = make_eval_iterators(
                shard_dir,
                seq_len=config.batch.seq_len,
                batch_size=host.rows,
                max_batches=config.eval.batches,
                process_index=host.index,
                process_count=host.count,
                vocab_size=plan.data_vocab,
            )
        except NoWindowError as e:  # a small corpus's val split: say which keys change it
            raise RunError(
                f"{e}: lower batch.seq_len to {e.longest - 1} or less, rebuild {d} with a "
                "larger val_fraction, or name other directories in data.eval_dirs"
            ) from None
        except (ShardFormatError, OSError, ValueError) as e:
            raise RunError(str(e).splitlines()[0]) from None
        for domain, stream in found.items():
            # Two directories with the same val domain: tell them apart by directory.
            name = domain if domain not in streams else f"{domain}@{Path(d).name}"
            streams[name] = stream
    return streams


def prepare_run_dir(run_dir: Path, config: TrainConfig, *, is_main: bool) -> None:
    """Create the run directory and write the resolved config (whole or not at all)."""
    if not is_main:
        return
    try:
        with interrupt.critical():
            run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(run_dir / "config.yaml", config.to_yaml().encode())
    except OSError as e:
        raise RunError(f"run_dir: {run_dir}: {e.strerror or e}") from None


class StopSignal:
    """SIGTERM/SIGINT while training: finish the step, checkpoint, stop (preemption).

    With several processes JAX's preemption service owns SIGTERM and agrees on the step
    every host stops at; Ctrl-C stays Ctrl-C there.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        if jax.process_count() > 1:
            return self
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._request)
            except ValueError:  # not the main thread: leave signals alone
                break
        return self

    def _request(self, signum: int, _frame: Any) -> None:
        self.requested = True
        signal.signal(signum, self._previous[signum])  # a second signal acts as usual

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def at(self, step: int) -> bool:
        """Whether the run stops after step `step` (every host at the same one)."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            return multihost_utils.reached_preemption_sync_point(step)
        return self.requested

"""The training config: one typed dataclass per run, mapped from YAML, validated on load.

Every user mistake (unknown key, wrong type, bad value) raises `ConfigError` with a
one-line message naming the key; `lemur-train` prints it and exits with code 2.
Shipped configs live in `lemur/configs/*.yaml` and can be named without a path
(`lemur-train tiny`). See docs/train.md for every key. The `model:` section
(`ModelConfig`) and `ConfigError` live in lemur.model.preset: a run's checkpoints keep
that section, and `lemur-eval` rebuilds the model from it there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lemur import typed_yaml
from lemur.export.foreign import ForeignData, foreign_entry
from lemur.model.preset import CONFIG_LOADER, ConfigError, ModelConfig, check_key

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
DECAYS = ("cosine", "linear", "constant")
DISTRIBUTED = ("auto", "on", "off")
# Pairs of keys that are alternatives: a `--set` of one clears the other.
ALTERNATIVES = (("steps", "epochs"), ("schedule.warmup_steps", "schedule.warmup_fraction"))
_ONE_OF_THEM = "has an alternative key set too (steps/epochs, warmup_steps/warmup_fraction)"
# The run's length when neither key of its pair is set: validation writes them (a dry run
# prints them); the keys given as the other of the pair (`epochs`, a warmup fraction) are
# counted in steps at start-up by `with_steps`, the one place after validation that sets
# either. Nothing else decides `steps` or `schedule.warmup_steps`.
DEFAULT_STEPS = 1000
DEFAULT_WARMUP_STEPS = 2000


DataEntry = str | ForeignData


def data_entries(entries: list[Any], key: str) -> list[DataEntry]:
    """Each entry a shard folder's path or a `ForeignData` (ConfigError naming the entry)."""
    out: list[DataEntry] = []
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, ForeignData):
            out.append(entry)
        elif isinstance(entry, dict):
            try:
                out.append(foreign_entry(entry, where))
            except ValueError as e:
                raise ConfigError(f"config: {e}") from None
        else:
            check_key(
                isinstance(entry, str) and bool(entry),
                where,
                f"must be a shard directory or a mapping with format:, got {entry!r}",
            )
            out.append(entry)
    return out


@dataclass(frozen=True)
class DataConfig:
    """Shard directories to train on (a weighted mixture) and where the val splits are."""

    # A shard folder's path, or a mapping naming another trainer's corpus (a Megatron prefix
    # list, a datatrove .ds folder: `lemur.export.foreign`), made a `ForeignData` on load.
    dirs: list[Any] = field(default_factory=list)
    weights: list[float] | None = None  # one per dir; None: equal weights
    eval_dirs: list[Any] | None = None  # val shards read from here; None: `dirs`
    seed: int | None = None  # shuffle seed; None: the run's seed
    document_attention: bool = False  # mask attention to each packed document
    num_threads: int = 1
    prefetch: int = 8
    num_workers: int = 0
    # Resume only from a loader state of this same pipeline; false: continue from the
    # saved position even though directories, weights, seed or seq_len changed.
    strict_state: bool = True

    def __post_init__(self) -> None:
        check_key(bool(self.dirs), "data.dirs", "must list at least one shard directory")
        object.__setattr__(self, "dirs", data_entries(self.dirs, "data.dirs"))
        if self.eval_dirs is not None:
            object.__setattr__(self, "eval_dirs", data_entries(self.eval_dirs, "data.eval_dirs"))
        if self.weights is not None:
            check_key(
                len(self.weights) == len(self.dirs),
                "data.weights",
                f"has {len(self.weights)} entries for {len(self.dirs)} data.dirs",
            )
            check_key(all(w > 0 for w in self.weights), "data.weights", "must all be positive")
        check_key(self.num_threads >= 0, "data.num_threads", "must be >= 0")
        check_key(self.prefetch >= 0, "data.prefetch", "must be >= 0")
        check_key(self.num_workers >= 0, "data.num_workers", "must be >= 0")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh (data, fsdp, tensor); -1 on one axis means "the remaining devices"."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    distributed: str = "auto"  # jax.distributed.initialize: auto (from the env) | on | off

    def __post_init__(self) -> None:
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, size in sizes.items():
            check_key(size == -1 or size >= 1, f"mesh.{name}", f"must be >= 1 or -1, got {size}")
        check_key(list(sizes.values()).count(-1) <= 1, "mesh", "may use -1 on one axis only")
        check_key(
            self.distributed in DISTRIBUTED,
            "mesh.distributed",
            f"must be one of {', '.join(DISTRIBUTED)}, got {self.distributed!r}",
        )


@dataclass(frozen=True)
class BatchConfig:
    """Global batch of one optimizer step: `size` windows of `seq_len` tokens."""

    size: int = 8
    seq_len: int = 256
    microbatches: int = 1  # gradient accumulation: size / microbatches windows per pass

    def __post_init__(self) -> None:
        for name in ("size", "seq_len", "microbatches"):
            check_key(getattr(self, name) >= 1, f"batch.{name}", "must be >= 1")
        check_key(
            self.size % self.microbatches == 0,
            "batch.microbatches",
            f"({self.microbatches}) must divide batch.size ({self.size})",
        )


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW (Adam when weight_decay is 0) with global-norm gradient clipping."""

    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0  # decoupled; never applied to norms
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping

    def __post_init__(self) -> None:
        for name in ("b1", "b2"):
            check_key(0 <= getattr(self, name) < 1, f"optimizer.{name}", "must be in [0, 1)")
        check_key(self.eps > 0, "optimizer.eps", "must be > 0")
        check_key(self.weight_decay >= 0, "optimizer.weight_decay", "must be >= 0")
        check_key(self.grad_clip >= 0, "optimizer.grad_clip", "must be >= 0")


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning rate: linear warmup to `peak_lr`, then decay to `final_lr_ratio * peak_lr`."""

    peak_lr: float = 4e-5
    warmup_steps: int | None = None  # None: DEFAULT_WARMUP_STEPS, or warmup_fraction's
    warmup_fraction: float | None = None  # warmup as a share of the steps (set at start-up)
    decay: str = "cosine"  # cosine | linear | constant
    final_lr_ratio: float = 0.1
    decay_steps: int | None = None  # step where the decay ends (warmup included); None: steps

    def __post_init__(self) -> None:
        check_key(self.peak_lr > 0, "schedule.peak_lr", "must be > 0")
        steps, fraction = self.warmup_steps, self.warmup_fraction
        check_key(steps is None or fraction is None, "schedule.warmup_steps", _ONE_OF_THEM)
        if steps is None and fraction is None:
            object.__setattr__(self, "warmup_steps", DEFAULT_WARMUP_STEPS)
        check_key(steps is None or steps >= 0, "schedule.warmup_steps", "must be >= 0")
        check_key(
            fraction is None or 0 <= fraction < 1, "schedule.warmup_fraction", "not in [0, 1)"
        )
        check_key(
            self.decay in DECAYS,
            "schedule.decay",
            f"must be one of {', '.join(DECAYS)}, got {self.decay!r}",
        )
        check_key(0 <= self.final_lr_ratio <= 1, "schedule.final_lr_ratio", "must be in [0, 1]")
        check_key(
            self.decay_steps is None or self.decay_steps >= 1,
            "schedule.decay_steps",
            "must be >= 1",
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the whole train state and the loader position."""

    every: int = 1000  # steps between saves; 0: only at the end
    keep: int = 3  # newest checkpoints kept
    async_save: bool = True  # write in the background while training continues
    resume: bool = True  # continue from the latest complete checkpoint in `dir`
    dir: str | None = None  # None: RUN_DIR/checkpoints

    def __post_init__(self) -> None:
        check_key(self.every >= 0, "checkpoint.every", "must be >= 0")
        check_key(self.keep >= 1, "checkpoint.keep", "must be >= 1")


@dataclass(frozen=True)
class HarnessEvalConfig:
    """lm-evaluation-harness tasks run on the live params (lemur.train.harness_hook)."""

    tasks: list[str]  # lm-eval task or group names
    every: int = 1000  # steps between runs (and at the last step); 0: only at the end
    limit: int | None = None  # documents per task; None: all
    include_path: str | None = None  # a folder of task YAMLs added to lm-eval's
    num_fewshot: int | None = None  # None: each task's own
    batch_size: int = 16  # sequences per scoring call

    def __post_init__(self) -> None:
        check_key(bool(self.tasks) and all(self.tasks), "eval.harness.tasks", "must name tasks")
        check_key(self.every >= 0, "eval.harness.every", "must be >= 0")
        check_key(self.limit is None or self.limit >= 1, "eval.harness.limit", "must be >= 1")
        check_key(
            self.num_fewshot is None or self.num_fewshot >= 0,
            "eval.harness.num_fewshot",
            "must be >= 0",
        )
        check_key(self.batch_size >= 1, "eval.harness.batch_size", "must be >= 1")


@dataclass(frozen=True)
class EvalConfig:
    """Loss on each val domain (code, text) of the eval directories."""

    every: int = 1000  # steps between evals; 0: only at the end
    batches: int | None = None  # at most this many batches per domain; None: all
    batch_size: int | None = None  # global; None: batch.size / batch.microbatches
    at_start: bool = False  # also evaluate the initial params
    harness: HarnessEvalConfig | None = None  # lm-eval tasks too; None: none

    def __post_init__(self) -> None:
        check_key(self.every >= 0, "eval.every", "must be >= 0")
        check_key(self.batches is None or self.batches >= 1, "eval.batches", "must be >= 1")
        check_key(
            self.batch_size is None or self.batch_size >= 1, "eval.batch_size", "must be >= 1"
        )


@dataclass(frozen=True)
class LogConfig:
    """Metrics: JSONL in the run directory, TensorBoard when installed, a progress bar."""

    every: int = 10  # steps per logged record (train loss, tokens/s, MFU)
    progress: bool = True
    # None: events when a writer is installed (the run says when none is); true: required.
    tensorboard: bool | None = None
    peak_tflops: float | None = None  # per device, for MFU; None: known table or measured

    def __post_init__(self) -> None:
        check_key(self.every >= 1, "log.every", "must be >= 1")
        check_key(
            self.peak_tflops is None or self.peak_tflops > 0, "log.peak_tflops", "must be > 0"
        )


@dataclass(frozen=True)
class PlanConfig:
    """The machine the config is sized for: `lemur-train plan CONFIG` compiles for it."""

    topology: str | None = None  # a Cloud TPU accelerator type (v4-512) or h100-8
    slices: int = 1  # TPU slices over DCN (data parallel)

    def __post_init__(self) -> None:
        check_key(self.slices >= 1, "plan.slices", "must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one `lemur-train` run needs."""

    run_dir: str = "runs/lemur"
    seed: int = 0
    steps: int | None = None  # None: DEFAULT_STEPS, or the steps of `epochs` (with_steps)
    epochs: float | None = None  # passes over the train tokens; steps set at start-up
    # JAX's persistent compilation cache: a restarted run (resume, preemption) skips compiling.
    compile_cache_dir: str | None = None
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=lambda: DataConfig(dirs=["out/demo"]))
    mesh: MeshConfig = field(default_factory=MeshConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)

    def __post_init__(self) -> None:
        check_key(self.steps is None or self.epochs is None, "steps", _ONE_OF_THEM)
        if self.steps is None and self.epochs is None:
            object.__setattr__(self, "steps", DEFAULT_STEPS)
        check_key(self.steps is None or self.steps >= 1, "steps", "must be >= 1")
        check_key(self.epochs is None or self.epochs > 0, "epochs", "must be > 0")
        check_key(bool(self.run_dir), "run_dir", "must not be empty")
        if self.model.complete:  # else checked once init_from gives the model
            max_len = self.model.llama().max_seq_len
            of = f" of model.init_from {self.model.init_from}" if self.model.init_from else ""
            too_long = (
                f"({self.batch.seq_len}) exceeds the model's max_seq_len ({max_len}{of}): "
                f"lower it, e.g. --set batch.seq_len={max_len}"
            )
            check_key(self.batch.seq_len <= max_len, "batch.seq_len", too_long)

    @property
    def checkpoint_dir(self) -> Path:
        """Where checkpoints go."""
        return Path(self.checkpoint.dir or Path(self.run_dir) / "checkpoints")

    @property
    def data_seed(self) -> int:
        """The loader's shuffle seed."""
        return self.seed if self.data.seed is None else self.data.seed

    @property
    def eval_batch_size(self) -> int:
        """Global eval batch (defaults to one microbatch: it fits in memory)."""
        return self.eval.batch_size or self.batch.size // self.batch.microbatches

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one optimizer step's global batch."""
        return self.batch.size * self.batch.seq_len

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (YAML/JSON-able) of every key, defaults included."""
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        """The resolved config as YAML, loadable again with `load_train_config`."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def with_steps(config: TrainConfig, steps: int) -> TrainConfig:
    """The config of a run of `steps` steps (`epochs` counted: cleared), its warmup fraction
    counted in those steps (`schedule.warmup_steps`)."""
    schedule = config.schedule
    if schedule.warmup_fraction is not None:
        warmup = round(schedule.warmup_fraction * steps)
        schedule = dataclasses.replace(schedule, warmup_steps=warmup, warmup_fraction=None)
    return dataclasses.replace(config, steps=steps, epochs=None, schedule=schedule)


# ---------------------------------------------------------------------------- parsing


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides in place (values parsed as YAML); returns `raw`.

    Setting one of two alternative keys (steps / epochs, schedule.warmup_steps /
    schedule.warmup_fraction) clears the other, so `--set steps=40` runs a config that
    trains by epochs for 40 steps.
    """
    others = {a: b for pair in ALTERNATIVES for a, b in (pair, pair[::-1])}
    for other in filter(None, (others.get(o.partition("=")[0].strip()) for o in overrides)):
        *parents, name = other.split(".")
        node = raw.get(parents[0]) if parents else raw
        if isinstance(node, dict):
            node.pop(name, None)
    return typed_yaml.apply_overrides(raw, overrides, ConfigError)


def resolve_config_path(name: str | os.PathLike) -> Path:
    """A config file path, or the shipped config of that name (`tiny`, `lemur-70b`, ...)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = CONFIGS_DIR / f"{path.name.removesuffix('.yaml')}.yaml"
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    known = ", ".join(shipped_configs())
    raise ConfigError(f"config: {name}: no such file or shipped config (shipped: {known})")


def shipped_configs() -> list[str]:
    """Names of the configs shipped in lemur/configs."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))


def config_from_dict(raw: dict[str, Any]) -> TrainConfig:
    """Validate a mapping into a TrainConfig (raises ConfigError naming the key)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: top level must be a mapping, got {type(raw).__name__}")
    return CONFIG_LOADER.build(TrainConfig, raw, "")


def load_train_config(
    name: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> TrainConfig:
    """Read a YAML config (a path or a shipped name; None: all defaults), apply overrides."""
    raw: Any = {}
    if name is not None:
        path = resolve_config_path(name)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"config: {path}{where}: not valid YAML") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config: {path}: top level must be a mapping")
    return config_from_dict(apply_overrides(raw, overrides or []))


def absolute(path: str) -> str:
    """`path` made absolute against the working directory (`~` expanded; a URL as it is)."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def absolute_entry(entry: DataEntry) -> DataEntry:
    """A data entry with its paths absolute (a shard folder's or a `ForeignData`'s)."""
    return entry.absolute() if isinstance(entry, ForeignData) else absolute(entry)


def with_absolute_paths(config: TrainConfig) -> TrainConfig:
    """The config with every path absolute: run_dir, compile_cache_dir, model.init_from,
    data.dirs, data.eval_dirs and checkpoint.dir.

    A run stores them so (its `config.yaml`, its checkpoints' meta): it is read later from
    other working directories (`lemur-eval`, `lemur-convert from-run` find the tokenizer in
    its first data directory), where a relative path would point elsewhere, or nowhere.
    """
    data, model, ckpt = config.data, config.model, config.checkpoint
    return dataclasses.replace(
        config,
        run_dir=absolute(config.run_dir),
        compile_cache_dir=config.compile_cache_dir and absolute(config.compile_cache_dir),
        model=dataclasses.replace(model, init_from=model.init_from and absolute(model.init_from)),
        data=dataclasses.replace(
            data,
            dirs=[absolute_entry(d) for d in data.dirs],
            eval_dirs=None
            if data.eval_dirs is None
            else [absolute_entry(d) for d in data.eval_dirs],
        ),
        checkpoint=dataclasses.replace(ckpt, dir=ckpt.dir and absolute(ckpt.dir)),
    )

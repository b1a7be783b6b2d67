"""`lemur-train plan`: size a run for a TPU pod before renting it.

The run's own train and eval steps (`compile_steps`: the config's mesh, shardings, remat,
microbatches, donated state) are compiled ahead of time for the abstract devices of a
Cloud TPU topology on this host (no TPU: libtpu's compiler only). The compiler's memory
analysis says whether a step fits in the chip's HBM (it refuses a program that does not:
RESOURCE_EXHAUSTED, whose figures are reported instead); the model's own FLOP count and a
stated MFU give the step's and the run's time. GPU targets cannot be compiled without a
GPU (jax-ml/jax#28376): they get an analytic estimate, labelled as such
(lemur.train.plan_estimate).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from lemur.cli_common import UserError
from lemur.model.config import LlamaConfig, flops_per_token, param_count
from lemur.train.config import DEFAULT_STEPS, TrainConfig, with_steps
from lemur.train.plan_targets import GIB, Memory, Target, parse_oom, tpu_devices, usable_hbm


@dataclasses.dataclass
class Plan:
    """What `plan` reports for one config on one target."""

    config: str
    target: str
    devices: int
    mesh: dict[str, int]
    settings: dict[str, Any]  # the memory knobs: microbatches, remat, scan_layers, attention
    memory: Memory
    parameters: int
    tokens_per_step: int
    flops_per_step: float
    peak_tflops: float
    mfu: float
    mfu_source: str
    step_s: float
    steps: int | None
    estimate: bool = False  # GPU: the analytic formula, nothing compiled

    @property
    def run_s(self) -> float | None:
        """The whole run's time at the stated MFU (None when its steps are not known)."""
        return None if self.steps is None else self.step_s * self.steps

    def to_json(self) -> dict[str, Any]:
        """The plan as JSON-able data."""
        out = dataclasses.asdict(self)
        out["run_s"] = self.run_s
        return out


def memory_settings(config: TrainConfig, model: LlamaConfig) -> dict[str, Any]:
    """The config's settings that change memory but not the math."""
    return {
        "batch.microbatches": config.batch.microbatches,
        "model.overrides.remat": model.remat,
        "model.overrides.scan_layers": model.scan_layers,
        "model.overrides.attention_impl": model.attention_impl,
    }


def plan_model(config: TrainConfig) -> LlamaConfig:
    """The run's model (init_from's when the preset is null; the data's vocabulary when
    readable, else the preset's)."""
    from lemur.train.errors import RunError
    from lemur.train.setup import DataDirs, resolve_config

    if not config.model.complete:
        try:
            config, _ = resolve_config(config, DataDirs())
        except RunError as e:
            raise UserError(f"model: {e}") from None
    vocab = None
    if config.model.vocab_size is None:
        try:
            vocab = int(DataDirs()[config.data.dirs[0]].tokenizer["vocab_size"])
        except RunError:
            vocab = None  # the preset's vocabulary
    return config.model.llama(vocab)


def run_steps(config: TrainConfig) -> int | None:
    """The run's steps (None: `epochs` of data that is not readable here)."""
    if config.epochs is None:
        return config.steps
    from lemur.train.errors import RunError
    from lemur.train.setup import DataDirs, resolve_config

    try:
        return resolve_config(config, DataDirs())[0].steps
    except RunError:
        return None


def compile_memory(
    config: TrainConfig,
    model: LlamaConfig,
    devices: list[Any],
    hbm: tuple[float, str],
    *,
    with_eval: bool = True,
) -> Memory:
    """Compile the run's train step (and eval step) for `devices`; their per-device memory,
    or the compiler's out-of-HBM figure."""
    from lemur.train import step as step_lib
    from lemur.train.batch import BatchLayout

    layout, schedule = run_layout(config, model, devices)
    train_batch = BatchLayout.on(layout.mesh, config.batch.size, config.batch.seq_len)
    start = time.perf_counter()
    try:
        train_step, _, _ = step_lib.compile_steps(layout, schedule, config, train_batch, None)
        eval_peak = eval_memory(layout, config) if with_eval else None
    except Exception as e:  # JaxRuntimeError; anything but an out-of-HBM refusal is a bug
        refused = parse_oom(str(e))
        if refused is None:
            raise
        return Memory(
            fits=False,
            peak=refused[0],
            hbm=refused[1],
            hbm_source="the compiler",
            compile_s=_since(start),
        )
    stats = train_step.memory_analysis()
    return Memory(
        fits=True,
        peak=float(stats.peak_memory_in_bytes),
        hbm=hbm[0],
        hbm_source=hbm[1],
        arguments=float(stats.argument_size_in_bytes),
        temporaries=float(stats.temp_size_in_bytes),
        outputs=float(stats.output_size_in_bytes),
        aliased=float(stats.alias_size_in_bytes),
        eval_peak=eval_peak,
        compile_s=_since(start),
    )


def run_layout(config: TrainConfig, model: LlamaConfig, devices: list[Any]) -> tuple[Any, Any]:
    """The run's StateLayout over `devices` (as the trainer makes it) and its schedule."""
    from lemur.train import step as step_lib
    from lemur.train.state import make_run_mesh
    from lemur.train.step import StateLayout

    mesh = make_run_mesh(config, devices)
    # A run by `epochs` of data not readable here has no steps yet: the schedule's length
    # changes no buffer, so any will do.
    config = with_steps(config, config.steps or DEFAULT_STEPS)
    schedule = step_lib.make_schedule(config.schedule, config.steps)
    tx = step_lib.make_optimizer(config.optimizer, schedule)
    return StateLayout.of(model, tx, mesh, config.seed), schedule


def eval_memory_for(config: TrainConfig, model: LlamaConfig, devices: list[Any]) -> float:
    """Peak bytes per device of the run's eval step on `devices`."""
    return eval_memory(run_layout(config, model, devices)[0], config)


def eval_memory(layout: Any, config: TrainConfig) -> float:
    """Peak bytes per device of the run's eval step compiled for `layout`'s mesh."""
    from lemur.train import step as step_lib
    from lemur.train.batch import BatchLayout

    eval_batch = BatchLayout.on(layout.mesh, config.eval_batch_size, config.batch.seq_len)
    compiled = step_lib.compile_eval_step(layout, config, eval_batch)
    return float(compiled.memory_analysis().peak_memory_in_bytes)


def _since(start: float) -> float:
    """Seconds since `start` (perf_counter)."""
    return time.perf_counter() - start


def chip_hbm(target: Target, devices: list[Any]) -> tuple[float, str]:
    """Usable HBM per chip: the compiler's limit (probed), else the published figure."""
    usable = usable_hbm(devices[0])
    if usable is not None:
        return usable, "the compiler's limit"
    return target.chip.hbm_gib * GIB, "published HBM"


def with_slices(config: TrainConfig, target: Target) -> TrainConfig:
    """The config's mesh with the slices as data parallelism over DCN (data x slices)."""
    if target.slices == 1:
        return config
    mesh = dataclasses.replace(config.mesh, data=config.mesh.data * target.slices)
    return dataclasses.replace(config, mesh=mesh)


def make_plan(
    config: TrainConfig,
    name: str,
    target: Target,
    memory: Memory,
    model: LlamaConfig,
    mfu: float | None,
    mesh: dict[str, int],
) -> Plan:
    """The report of one compiled (or estimated) configuration."""
    from lemur.train.metrics import datasheet_tflops
    from lemur.train.plan_targets import GPU_PEAK_TFLOPS

    peak = GPU_PEAK_TFLOPS.get(target.chip.family) or datasheet_tflops(f"TPU {target.chip.family}")
    tokens = config.tokens_per_step
    flops = flops_per_token(model, config.batch.seq_len) * tokens
    use_mfu = target.chip.mfu if mfu is None else mfu
    source = target.chip.mfu_source if mfu is None else "--mfu"
    return Plan(
        config=name,
        target=target.name + (f" x {target.slices} slices" if target.slices > 1 else ""),
        devices=target.devices,
        mesh=mesh,
        settings=memory_settings(config, model),
        memory=memory,
        parameters=param_count(model),
        tokens_per_step=tokens,
        flops_per_step=flops,
        peak_tflops=peak,
        mfu=use_mfu,
        mfu_source=source,
        step_s=flops / (target.devices * peak * 1e12 * use_mfu),
        steps=run_steps(config),
        estimate=target.is_gpu,
    )


def plan_tpu(
    config: TrainConfig, name: str, target: Target, mfu: float | None, *, with_eval: bool = True
) -> Plan:
    """Compile `config` for the TPU `target` and report it."""
    config = with_slices(config, target)
    model = plan_model(config)
    devices = tpu_devices(target)
    from lemur.train.state import make_run_mesh

    mesh = dict(make_run_mesh(config, devices).shape)
    memory = compile_memory(config, model, devices, chip_hbm(target, devices), with_eval=with_eval)
    return make_plan(config, name, target, memory, model, mfu, mesh)


def plan_gpu(config: TrainConfig, name: str, target: Target, mfu: float | None) -> Plan:
    """The analytic estimate of `config` on the GPU `target` (nothing compiled)."""
    from lemur.train.plan_estimate import estimate_memory, mesh_sizes

    model = plan_model(config)
    mesh = dict(zip(("data", "fsdp", "tensor"), mesh_sizes(config, target.devices), strict=True))
    memory = estimate_memory(config, model, target)
    return make_plan(config, name, target, memory, model, mfu, mesh)


def gib(n: float | None) -> str:
    """Bytes as GiB with two decimals (MiB below one GiB)."""
    if n is None:
        return "?"
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"


def duration(seconds: float) -> str:
    """A duration in the unit that reads best (s, h, days)."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def set_flags(settings: dict[str, Any]) -> str:
    """Settings as `--set KEY=VALUE` flags (YAML values: null, true)."""

    def value(v: Any) -> str:
        return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    return " ".join(f"--set {k}={value(v)}" for k, v in settings.items())


def refusal_line(plan: Plan) -> str:
    """The one line of a plan that does not fit."""
    m = plan.memory
    kind = "estimated" if plan.estimate else "the compiler needs"
    return (
        f"{plan.config} on {plan.target} does not fit: {kind} {gib(m.peak)} per device, "
        f"{gib(m.hbm)} usable ({m.hbm_source}); settings {set_flags(plan.settings)} "
        "(lemur-train plan --fit searches for ones that fit)"
    )


def format_plan(plan: Plan) -> str:
    """The human-readable report of a plan that fits."""
    m, label = plan.memory, " (analytic estimate)" if plan.estimate else ""
    mesh = " x ".join(f"{k} {v}" for k, v in plan.mesh.items())
    lines = [
        f"{plan.config} on {plan.target}: {plan.devices} device(s), mesh {mesh}",
        f"settings: {set_flags(plan.settings)}",
        f"memory per device{label}: peak {gib(m.peak)} of {gib(m.hbm)} usable "
        f"({m.hbm_source}): {'fits' if m.fits else 'does not fit'}",
        f"  arguments {gib(m.arguments)}, temporaries {gib(m.temporaries)} (summed over "
        f"buffers, not all live at once), outputs {gib(m.outputs)}"
        + ("" if m.eval_peak is None else f"; eval step peak {gib(m.eval_peak)}"),
        f"model: {plan.parameters:,} parameters; {plan.tokens_per_step:,} tokens "
        f"per step; {plan.flops_per_step:.3e} model FLOPs per step (attention included)",
        f"time at {plan.mfu:.0%} MFU ({plan.mfu_source}) of {plan.peak_tflops:g} TFLOP/s "
        f"per chip: {duration(plan.step_s)} per step"
        + f" ({duration(plan.step_s * 1e9 / plan.tokens_per_step)} per billion tokens)"
        + (
            "; steps unknown (epochs of data not readable here)"
            if plan.run_s is None
            else f"; {plan.steps:,} steps: {duration(plan.run_s)}"
        ),
    ]
    if not plan.estimate:
        lines.append(f"compile: {m.compile_s:.0f} s on this host")
    return "\n".join(lines) + "\n"

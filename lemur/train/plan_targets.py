"""The machines `lemur-train plan` sizes a run for: Cloud TPU slices by the names Cloud TPU
gives them (`v4-512`, `v5e-256`, `v5p-1024`, `v6e-256`), and GPU nodes (`h100-8`), which
JAX cannot compile for without a GPU (jax-ml/jax#28376) and which are estimated instead.

TPU devices come from `jax.experimental.topologies.get_topology_desc` (libtpu must be
importable; no TPU is needed), and the chip's usable HBM from the compiler itself: a probe
program too big for any chip fails to compile with "exceeds available HBM (30.75G)".
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
from typing import Any

from lemur.cli_common import UserError

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    """One kind of accelerator chip: how Cloud TPU names count it, its memory and speed."""

    family: str  # the name's prefix: v4, v5e, v5p, v6e, h100, h200
    cores_per_chip: int  # v4 and v5p names count TensorCores (2 per chip), the others chips
    chip_config: str  # get_topology_desc's chip_config_name
    hbm_gib: float  # published HBM per chip
    mfu: float  # the default MFU of `plan`'s time estimates
    mfu_source: str  # where that MFU was published


CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 2, "megacore", 32, 0.57, "MaxText configs/2xv4-128.sh: 158 TFLOP/s/chip, 22B"),
    "v5e": Chip(
        "v5e", 1, "default", 16, 0.60, "MaxText configs/v5e/README.md: 64B on v5e-256, 59.9%"
    ),
    "v5p": Chip(
        "v5p", 2, "megacore", 95, 0.65, "MaxText: Llama-2-70B on v5p-512 at seq 4096, 65.4%"
    ),
    "v6e": Chip(
        "v6e", 1, "default", 32, 0.44, "MaxText tiering (tpu-recipes): Llama-2-70B v6e-256, 43.8%"
    ),
    "h100": Chip(
        "h100", 1, "", 80, 0.52, "NVIDIA dgxc-benchmarking: Llama-2-70B MaxText, 64 H100, 52.6%"
    ),
    "h200": Chip("h200", 1, "", 141, 0.52, "H100's: NVIDIA dgxc-benchmarking, Llama-2-70B, 52.6%"),
}
GPU_FAMILIES = ("h100", "h200")
# Dense bf16 TFLOP/s per chip (vendor datasheets), for GPUs (TPUs take lemur.train.metrics').
GPU_PEAK_TFLOPS = {"h100": 989.0, "h200": 989.0}

# Physical shapes (chips) of the slices Cloud TPU offers, by chips.
_SHAPES_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    768: "8x8x12",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
    6144: "16x16x24",
}
_SHAPES_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_MAX_CHIPS = {"v4": 2048, "v5p": 6144, "v5e": 256, "v6e": 256}
# Chips over every slice a plan may have: tens of thousands, as the largest Multislice run
# published (Google, 2023: 50,944 v5e chips in 199 slices). Host memory stays small below
# it (measured here: tiny on v5e-256 x 256 slices, 65,536 chips, 1.0 GB RSS, 8 s); a
# million slices grew past 13.6 GB making devices before it ever compiled.
MAX_PLAN_CHIPS = 65_536
_GPUS_PER_NODE = 8


@dataclasses.dataclass
class Memory:
    """Per-device bytes of one compiled step (or the compiler's refusal of it)."""

    fits: bool
    peak: float  # what the compiler holds against HBM; on refusal, the figure it refused
    hbm: float  # usable bytes per chip
    hbm_source: str
    arguments: float | None = None
    temporaries: float | None = None
    outputs: float | None = None
    aliased: float | None = None
    eval_peak: float | None = None
    compile_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Target:
    """A named machine: `chips` chips of `chip` (per slice), `slices` slices over DCN."""

    name: str
    chip: Chip
    chips: int
    shape: str  # physical chip grid (TPU), "" for GPUs
    slices: int = 1

    @property
    def is_gpu(self) -> bool:
        """GPU targets are estimated, not compiled."""
        return self.chip.family in GPU_FAMILIES

    @property
    def devices(self) -> int:
        """Chips over every slice: JAX's device count (one device per chip, megacore)."""
        return self.chips * self.slices


def valid_names() -> str:
    """Every target name `plan` accepts, one family per item."""
    out = []
    for family, limit in _MAX_CHIPS.items():
        per = CHIPS[family].cores_per_chip
        shapes = _SHAPES_3D if per == 2 else _SHAPES_2D
        counts = [n * per for n in shapes if n <= limit]
        out.append(f"{family}-{{{','.join(map(str, counts))}}}")
    out.append(f"h100-N, h200-N (N a multiple of {_GPUS_PER_NODE}, or 1, 2, 4)")
    return "; ".join(out)


def parse_target(name: str, slices: int = 1) -> Target:
    """The machine named `name` (Cloud TPU's accelerator type, or h100-N) over `slices`
    slices; UserError if the name is not one, or if the chips over every slice are more
    than MAX_PLAN_CHIPS."""
    target = _named_target(name, slices)
    if target.devices > MAX_PLAN_CHIPS:
        raise UserError(
            f"--slices {slices}: {name} x {slices:,} slices is {target.devices:,} chips; a "
            f"plan is bounded at {MAX_PLAN_CHIPS:,} chips (tens of thousands: the largest "
            "Multislice run published, 50,944 v5e chips): fewer slices"
        )
    return target


def _named_target(name: str, slices: int) -> Target:
    """`parse_target` before the bound on chips over every slice."""
    match = re.fullmatch(r"(v4|v5e|v5p|v6e|h100|h200)-(\d+)", name.strip().lower())
    if slices < 1:
        raise UserError(f"--slices: must be >= 1, got {slices}")
    if match is None:
        raise UserError(f"--topology: unknown {name!r}; valid: {valid_names()}")
    family, count = match[1], int(match[2])
    chip = CHIPS[family]
    if family in GPU_FAMILIES:
        if (
            count < 1
            or (count > _GPUS_PER_NODE and count % _GPUS_PER_NODE)
            or count in (3, 5, 6, 7)
        ):
            raise UserError(f"--topology: unknown {name!r}; valid: {valid_names()}")
        return Target(name, chip, count, "", slices)
    shapes = _SHAPES_3D if chip.cores_per_chip == 2 else _SHAPES_2D
    chips, rest = divmod(count, chip.cores_per_chip)
    if rest or chips not in shapes or chips > _MAX_CHIPS[family]:
        raise UserError(f"--topology: unknown {name!r}; valid: {valid_names()}")
    return Target(name, chip, chips, shapes[chips], slices)


def libtpu_available() -> bool:
    """Whether libtpu (the TPU compiler) can be imported here."""
    return importlib.util.find_spec("libtpu") is not None


LIBTPU_MISSING = (
    "compiling for a TPU needs libtpu (no TPU needed): pip install -e '.[dev]' "
    "(it pins the libtpu of the installed jax; see docs/train.md)"
)
_LIBTPU_REINSTALL = "reinstall it: pip install --force-reinstall -e '.[dev]' (see docs/train.md)"


def libtpu_library() -> str:
    """The shared library JAX loads as the TPU compiler: TPU_LIBRARY_PATH, else the libtpu
    package's (as jax's `_get_tpu_library_path` finds it)."""
    given = os.environ.get("TPU_LIBRARY_PATH")
    return given or str(importlib.import_module("libtpu").get_library_path())


def libtpu_problem() -> str | None:
    """Why `plan` cannot compile for a TPU here (no libtpu; a libtpu package whose shared
    library is missing, which jax's loader reports with a traceback), or None."""
    if not libtpu_available():
        return LIBTPU_MISSING
    library = libtpu_library()
    if not os.path.isfile(library):
        return f"libtpu cannot be loaded from {library}: no such file; {_LIBTPU_REINSTALL}"
    return None


def tpu_devices(target: Target) -> list[Any]:
    """The abstract devices of a TPU target (every slice), slice by slice; UserError if
    libtpu's library does not load (a damaged file)."""
    from jax.errors import JaxRuntimeError
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            platform="tpu",
            topology_name=f"{target.chip.family}:{target.shape}",
            chip_config_name=target.chip.chip_config,
            chips_per_host_bounds=(2, 2, 1),
            num_slices=target.slices,
        )
    except JaxRuntimeError as e:
        library = libtpu_library()
        if library not in str(e):  # not the loader's: a bug, its traceback shows
            raise
        raise UserError(
            f"libtpu cannot be loaded from {library}: {str(e).splitlines()[0]}; {_LIBTPU_REINSTALL}"
        ) from None
    return sorted(topology.devices, key=lambda d: (getattr(d, "slice_index", 0), d.id))


_HBM = re.compile(r"exceeds available HBM \(([\d.]+)([KMGT]?)\)")
_TEMPS = re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\)")
_USED = re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_oom(message: str) -> tuple[float, float] | None:
    """(bytes needed, bytes available) from the compiler's out-of-HBM error, None if the
    message is not one."""
    hbm, temps = _HBM.search(message), _TEMPS.search(message)
    if hbm and temps:
        return (
            float(temps[1]) * _UNITS[temps[2]],
            float(hbm[1]) * _UNITS[hbm[2]],
        )
    used = _USED.search(message)
    if used:
        return float(used[1]) * _UNITS[used[2]], float(used[3]) * _UNITS[used[4]]
    return None


def usable_hbm(device: Any) -> float | None:
    """The HBM (bytes) the compiler lets one program use on `device`'s chip: it compiles a
    probe that needs 256 GiB and reads the limit from the refusal (None if it does not say)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    replicated = NamedSharding(Mesh(np.array([device]), ("one",)), P())
    row = jax.ShapeDtypeStruct((2**20,), jnp.float32, sharding=replicated)
    probe = jax.jit(lambda x: jnp.tile(x, (2**16, 1)) * 2, out_shardings=replicated)
    try:
        probe.lower(row).compile()
    except Exception as e:  # JaxRuntimeError: RESOURCE_EXHAUSTED, the expected outcome
        parsed = parse_oom(str(e))
        return None if parsed is None else parsed[1]
    return None

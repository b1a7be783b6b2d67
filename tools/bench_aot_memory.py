"""Per-chip memory of lemur's train step compiled ahead of time for a TPU topology, on any
CPU host: the same step with different model settings, side by side.

Needs libtpu importable (not in the project's venv: install it into a folder of its own,
`pip install --target DIR "libtpu==0.0.42.1"` for jax 0.10.2, and put DIR on PYTHONPATH;
ALLOW_MULTIPLE_LIBTPU_LOAD=1 when another process holds libtpu). Compiles
`lemur.train.step.make_train_step` with the trainer's state shardings, donated state,
document attention and an fsdp mesh over all chips, for each `--variant` (model
overrides), and prints the compiler's per-chip figures (`memory_analysis()`) and the
largest buffers of the compiled HLO that have L x L (attention scores) or L x V (logits)
in their shape. Example (the figures in docs/benchmarks.md):

    PYTHONPATH=$PWD:/path/to/libtpu-site python tools/bench_aot_memory.py \\
        --preset llama3.2-1b --topology v4-8 --batch-per-chip 4 --seq-len 4096 \\
        --set remat=dots --variant logits_chunk=4096 --variant logits_chunk=null
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time

import jax
import numpy as np
import yaml
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lemur.model import sharding as model_sharding
from lemur.model.config import config_from_preset
from lemur.shards.windows import BATCH_KEYS
from lemur.train import step as step_lib
from lemur.train.config import OptimizerConfig, ScheduleConfig
from lemur.train.plan_targets import parse_target, tpu_devices
from lemur.train.step import StateLayout

GIB = 2**30


def overrides(pairs: list[str]) -> dict:
    """KEY=VALUE pairs (values parsed as YAML) -> a dict of LlamaConfig overrides."""
    return {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in pairs)}


def big_buffers(hlo: str, seq_len: int, vocab: int) -> dict[str, str]:
    """The largest HLO shape having two seq_len dims (scores) and one with vocab (logits)."""
    found: dict[str, tuple[int, str]] = {}
    for dtype, dims in re.findall(r"\b(f32|bf16|f16)\[([0-9,]+)\]", hlo):
        shape = [int(d) for d in dims.split(",")]
        kind = "LxL" if shape.count(seq_len) >= 2 else "V" if vocab in shape else None
        size = int(np.prod(shape)) * (2 if dtype != "f32" else 4)
        if kind and size > found.get(kind, (0, ""))[0]:
            found[kind] = (size, f"{dtype}[{dims}] {size / GIB:.2f} GiB")
    return {k: v[1] for k, v in found.items()}


def compile_variant(args: argparse.Namespace, devices: list, variant: dict) -> str:
    """One line: the variant's per-chip memory, compile seconds and largest buffers."""
    model = config_from_preset(args.preset, **{**overrides(args.set), **variant})
    model = dataclasses.replace(model, max_seq_len=max(model.max_seq_len, args.seq_len))
    mesh = model_sharding.make_mesh(data=1, fsdp=-1, tensor=1, devices=devices)
    schedule = step_lib.make_schedule(ScheduleConfig(), 1000)
    tx = step_lib.make_optimizer(OptimizerConfig(), schedule)
    layout = StateLayout.of(model, tx, mesh, 0)
    shape = (args.batch_per_chip * len(devices), args.seq_len)
    batch_sharding = model_sharding.batch_sharding(mesh, shape)
    batch = dict.fromkeys(
        BATCH_KEYS, jax.ShapeDtypeStruct(shape, np.int32, sharding=batch_sharding)
    )
    fn = step_lib.make_train_step(model, tx, schedule, document_attention=True)
    t = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = step_lib.compile_step(
                fn,
                (layout.target(), batch),
                (layout.shardings, batch_sharding),
                (layout.shardings, NamedSharding(mesh, P())),
                donate_argnums=0,
            )
    except jax.errors.JaxRuntimeError as err:  # over HBM: the compiler's figures in one line
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        return f"{variant}: does not fit: {str(err).splitlines()[0]}"
    secs = time.perf_counter() - t
    m = compiled.memory_analysis()
    buffers = big_buffers(compiled.as_text(), args.seq_len, model.vocab_size)
    return (
        f"{variant}: peak {m.peak_memory_in_bytes / GIB:.2f} GiB, arguments "
        f"{m.argument_size_in_bytes / GIB:.2f}, temporaries {m.temp_size_in_bytes / GIB:.2f}, "
        f"outputs {m.output_size_in_bytes / GIB:.2f}; compile {secs:.0f} s; largest {buffers}"
    )


def main() -> None:
    """Compile each variant and print its line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--topology", default="v4-8", help="a Cloud TPU name, as lemur-train plan")
    ap.add_argument("--batch-per-chip", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every variant")
    ap.add_argument("--variant", action="append", default=[], help="KEY=VALUE[,KEY=VALUE]")
    args = ap.parse_args()
    # The topology names and abstract devices of `lemur-train plan` (one table of them).
    devices = tpu_devices(parse_target(args.topology))
    print(f"{args.preset} on {args.topology} ({len(devices)} chips), {args.set}", flush=True)
    for variant in args.variant or [""]:
        print(compile_variant(args, devices, overrides([v for v in variant.split(",") if v])))


if __name__ == "__main__":
    main()

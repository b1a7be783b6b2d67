"""Benchmark: can XLA on this CPU split a batch-8 decode step over two cores? Three ways.

A toy of lemur's decode step at the benchmark model's size (8 layers of d_model 384
projections and a 1024 x 2 gated MLP, the 32000 x 384 head, argmax; 16 steps in a
`lax.scan`, batch 8, fp32), compiled three ways, each in its own process (the device count
is fixed when JAX starts), the variants alternating over --rounds:
  one-chain : the batch as one chain (what lemur's decode compiles to)
  two-chains: two half-batch chains in one program (independent work XLA could overlap)
  two-devices: the batch sharded over two CPU devices (`jax_num_cpu_devices=2`)
Prints the median milliseconds per 16 steps of each.

    JAX_PLATFORMS=cpu python tools/bench_decode_split.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

D, F, V, LAYERS, BATCH, STEPS = 384, 1024, 32000, 8, 8, 16
VARIANTS = ("one-chain", "two-chains", "two-devices")


def _measure(variant: str, repeats: int = 9) -> float:
    """Median ms per STEPS steps of one variant, in this process."""
    import jax
    import jax.numpy as jnp

    if variant == "two-devices":
        jax.config.update("jax_num_cpu_devices", 2)
    keys = jax.random.split(jax.random.PRNGKey(0), 4 * LAYERS + 2)
    shapes = [(D, 3 * D), (D, D), (D, 2 * F), (F, D)]
    weights = [
        [jax.random.normal(keys[4 * i + j], s) * 0.02 for j, s in enumerate(shapes)]
        for i in range(LAYERS)
    ]
    head = jax.random.normal(keys[-2], (D, V)) * 0.02

    def chain(x: jax.Array) -> jax.Array:
        for wqkv, wo, wup, wdown in weights:
            x = x + (x @ wqkv)[:, :D] @ wo
            u = x @ wup
            x = x + (jax.nn.silu(u[:, :F]) * u[:, F:]) @ wdown
        return jnp.argmax(x @ head, -1)

    def step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        if variant == "two-chains":
            t = jnp.concatenate([chain(x[: BATCH // 2]), chain(x[BATCH // 2 :])])
        else:
            t = chain(x)
        return x + t[:, None].astype(x.dtype) * 1e-6, t

    run = jax.jit(lambda x: jax.lax.scan(lambda c, _: step(c), x, None, length=STEPS)[1])
    x = jax.random.normal(keys[-1], (BATCH, D))
    if variant == "two-devices":
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        mesh = Mesh(jax.devices()[:2], ("batch",))
        x = jax.device_put(x, NamedSharding(mesh, PartitionSpec("batch")))
    run(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    """Run each variant in its own process, alternating, and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(_measure(args.variant)))
        return 0
    got: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:
            out = subprocess.run(
                [sys.executable, __file__, "--variant", v], check=True, capture_output=True
            )
            got[v].append(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    print(f"batch {BATCH}, {STEPS} steps per call, median ms of 9 calls per process")
    print("| variant | ms per 16 steps, each round | median |")
    print("|---|---|---|")
    for v, ms in got.items():
        print(f"| {v} | {', '.join(f'{m:.0f}' for m in ms)} | {statistics.median(ms):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

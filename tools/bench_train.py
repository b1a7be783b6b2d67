"""Benchmark the trainer: tokens/s and MFU of lemur's train step against a minimal JAX step.

In one process, on the same model, batch and device:

- reference: the smallest honest JAX train step: `jit(value_and_grad(mean cross-entropy of
  lemur.model.llama.forward))` + `optax.adam`, params and optimizer state donated;
- lemur step: `lemur.train.step.make_train_step` compiled as `lemur-train` compiles it
  (explicit shardings on the mesh, donated state, loss over `loss_mask`, global-norm
  clipping, AdamW, gradient and parameter norms, microbatch accumulation if asked);
- lemur loop (`--loop`): the whole `lemur-train` loop (Trainer) on a synthetic shard
  directory: Grain loader, host-to-device batches, metrics read one step behind,
  progress; tokens/s from its own log records.

Steps are timed in alternating rounds (reference, lemur, reference, ...) and the median
round is reported, so load from other processes hits both sides alike. MFU uses
lemur.model.config.flops_per_token (MaxText's convention) against the device's bf16 peak
(datasheet table; on CPU, the best measured matmul). Examples:

    python tools/bench_train.py                                  # CPU: ~10M-param Llama
    python tools/bench_train.py --preset llama-1b --seq-len 4096 --batch 4 \\
        --dtype bfloat16 --remat dots --loop                      # one H100
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lemur.model import llama
from lemur.model import sharding as model_sharding
from lemur.model.config import LlamaConfig, Params, config_from_preset, flops_per_token, param_count
from lemur.shards.format import (
    ShardWriter,
    make_manifest,
    token_dtype,
    tokenizer_entry,
    write_manifest,
)
from lemur.train import step as step_lib
from lemur.train.batch import BatchLayout
from lemur.train.config import MeshConfig, OptimizerConfig, ScheduleConfig, config_from_dict
from lemur.train.metrics import measure_matmul_tflops, peak_tflops_per_device


def model_config(args: argparse.Namespace) -> LlamaConfig:
    """The benchmarked model: a preset with the command line's overrides."""
    overrides = {
        k: v
        for k, v in {
            "vocab_size": args.vocab,
            "d_model": args.d_model,
            "n_layers": args.layers,
            "n_heads": args.heads,
            "n_kv_heads": args.kv_heads,
            "d_ff": args.d_ff,
            "dtype": args.dtype,
            "remat": args.remat,
            "max_seq_len": max(args.seq_len, 256),
            "attention_impl": args.attention,
        }.items()
        if v is not None
    }
    return config_from_preset(args.preset, **overrides)


def random_batch(
    model: LlamaConfig, batch: int, seq_len: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """A loader-shaped batch of random tokens (one document per window)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, model.vocab_size, (batch, seq_len + 1)).astype(np.int32)
    ones = np.ones((batch, seq_len), np.int32)
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": ones,
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)).copy(),
        "loss_mask": ones,
    }


def reference_step(model: LlamaConfig) -> Any:
    """The minimal JAX train step: mean cross-entropy, grads, Adam; state donated."""
    tx = optax.adam(1e-4, b1=0.9, b2=0.95)

    def loss_fn(params: Params, inputs: jax.Array, targets: jax.Array) -> jax.Array:
        logits = llama.forward(params, inputs, model)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(
        params: Params, opt_state: Any, inputs: jax.Array, targets: jax.Array
    ) -> tuple[Params, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, inputs, targets)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return tx, step


def time_steps(run_one: Any, steps: int) -> float:
    """Seconds per step over `steps` steps, dispatched back to back, then synchronised."""
    t = time.perf_counter()
    out = None
    for _ in range(steps):
        out = run_one()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / steps


def compile_lemur_step(
    model: LlamaConfig,
    batch: int,
    seq_len: int,
    *,
    microbatches: int = 1,
    document_attention: bool = False,
    seed: int = 0,
) -> tuple[Any, Any, BatchLayout, float]:
    """lemur's train step compiled exactly as `lemur-train` compiles it (explicit shardings
    on a 1-device-per-axis mesh, donated state): (compiled step, fresh state from
    `jax.random.key(seed)`, the batch layout, compile seconds)."""
    key = jax.random.key(seed)
    m = MeshConfig()
    mesh = model_sharding.make_mesh(m.data, m.fsdp, m.tensor)
    schedule = step_lib.make_schedule(ScheduleConfig(peak_lr=1e-4, warmup_steps=10), 1000)
    tx = step_lib.make_optimizer(OptimizerConfig(), schedule)
    init = functools.partial(step_lib.init_state, model=model, tx=tx)
    abstract = jax.eval_shape(init, key)
    shardings = step_lib.state_shardings(abstract, model, tx, mesh)
    layout = BatchLayout.on(mesh, batch, seq_len)
    state = jax.jit(init, out_shardings=shardings)(key)
    train = step_lib.make_train_step(
        model, tx, schedule, microbatches=microbatches, document_attention=document_attention
    )
    t = time.perf_counter()
    with jax.set_mesh(mesh):
        compiled = step_lib.compile_step(
            train,
            (step_lib.with_shardings(abstract, shardings), layout.abstract()),
            (shardings, layout.sharding),
            (shardings, NamedSharding(mesh, P())),
            donate_argnums=0,
        )
    return compiled, state, layout, time.perf_counter() - t


def bench_steps(model: LlamaConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds per step of the reference and lemur steps, alternating rounds."""
    B, L = args.batch, args.seq_len
    key = jax.random.key(0)
    host = random_batch(model, B, L)

    # Reference: params straight from init on the default device.
    ref_tx, ref_step = reference_step(model)
    params = jax.jit(functools.partial(llama.init_params, model))(key)
    ref = {"params": params, "opt": jax.jit(ref_tx.init)(params)}
    inputs, targets = jnp.asarray(host["inputs"]), jnp.asarray(host["targets"])
    t = time.perf_counter()
    ref["params"], ref["opt"], loss = ref_step(ref["params"], ref["opt"], inputs, targets)
    jax.block_until_ready(loss)
    ref_compile = time.perf_counter() - t

    # lemur: exactly the trainer's compile path.
    compiled, state, layout, lemur_compile = compile_lemur_step(
        model, B, L, microbatches=args.microbatches
    )
    batch = layout.put(host)
    box = {"state": state}

    def lemur_one() -> Any:
        box["state"], metrics = compiled(box["state"], batch)
        return metrics["loss"]

    def ref_one() -> Any:
        ref["params"], ref["opt"], loss = ref_step(ref["params"], ref["opt"], inputs, targets)
        return loss

    jax.block_until_ready(lemur_one())  # first call: allocation, warm caches
    ref_times, lemur_times = [], []
    for _ in range(args.rounds):
        ref_times.append(time_steps(ref_one, args.steps))
        lemur_times.append(time_steps(lemur_one, args.steps))
    return {
        "reference_s": statistics.median(ref_times),
        "lemur_s": statistics.median(lemur_times),
        # Each round pairs the two sides under the same load: the robust ratio.
        "paired_ratio": statistics.median(
            r / m for r, m in zip(ref_times, lemur_times, strict=True)
        ),
        "reference_rounds": ref_times,
        "lemur_rounds": lemur_times,
        "reference_compile_s": ref_compile,
        "lemur_compile_s": lemur_compile,
        "_ref_one": ref_one,
    }


def synthesize(directory: Path, vocab: int, tokens: int) -> Path:
    """A train-only shard directory of random documents (throughput only needs shapes)."""
    rng = np.random.default_rng(0)
    dtype = token_dtype(vocab)
    tok = b"bench tokenizer " + str(vocab).encode()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.model").write_bytes(tok)
    writer = ShardWriter(directory, "train", "train", "mixed", dtype, 1 << 22)
    written = 0
    while written < tokens:
        n = int(min(rng.lognormal(6.8, 1.2), 50_000))
        writer.add(np.concatenate(([1], rng.integers(3, vocab, n), [2])).astype(dtype))
        written += n + 2
    tokenizer = tokenizer_entry(directory, "tokenizer.model", vocab, bos_id=1, eos_id=2)
    sections = {"mix": {}, "counts": {}, "recipe": {}, "recipe_sha256": ""}  # no build behind it
    write_manifest(directory, make_manifest(dtype, 4096, tokenizer, writer.close(), **sections))
    return directory


def bench_loop(
    model: LlamaConfig, args: argparse.Namespace, work: Path, ref_one: Any
) -> dict[str, Any]:
    """tokens/s of the whole lemur-train loop, from its own log records (first one dropped).

    The loop cannot alternate with the reference step, so reference rounds run right
    before and right after it and the loop is compared with their median.
    """
    from lemur.train.loop import train

    windows = args.rounds + 1
    data = synthesize(
        work / "data",
        model.vocab_size,
        tokens=2 * windows * args.steps * args.batch * (args.seq_len + 1),
    )
    overrides = {
        f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "vocab_size"
    }
    raw = {
        "run_dir": str(work / "run"),
        "steps": windows * args.steps,
        "model": {"preset": args.preset, "vocab_size": model.vocab_size, "overrides": overrides},
        "data": {"dirs": [str(data)]},
        "batch": {"size": args.batch, "seq_len": args.seq_len, "microbatches": args.microbatches},
        "schedule": {"peak_lr": 1e-4, "warmup_steps": 10},
        "checkpoint": {"every": 0, "async_save": True},
        "eval": {"every": 0},
        "log": {"every": args.steps, "progress": False, "tensorboard": False},
    }
    records: list[dict[str, Any]] = []
    config = config_from_dict(raw)
    around = [time_steps(ref_one, args.steps) for _ in range(2)]
    train(config, on_metrics=records.append)
    around += [time_steps(ref_one, args.steps) for _ in range(2)]
    tps = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]
    return {
        "loop_tokens_per_s": statistics.median(tps),
        "loop_data_wait_frac": statistics.median(
            [r["data_wait_frac"] for r in records if "data_wait_frac" in r][1:] or [0.0]
        ),
        "loop_batch_put_frac": statistics.median(
            [r["batch_put_frac"] for r in records if "batch_put_frac" in r][1:] or [0.0]
        ),
        "loop_rounds": tps,
        "loop_reference_s": statistics.median(around),
        "loop_reference_rounds": around,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (and JSON with --json)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--d-ff", type=int, default=None)
    p.add_argument("--dtype", default=None, help="compute dtype (bfloat16 on GPU/TPU)")
    p.add_argument("--remat", default=None, choices=["none", "full", "dots"])
    p.add_argument("--attention", default=None, choices=["xla", "cudnn"])
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--loop", action="store_true", help="also time the whole lemur-train loop")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.preset == "tiny" and args.d_model is None:
        # CPU default: a ~11M-parameter Llama with GQA at seq 256 (see docs/benchmarks.md).
        args.vocab, args.d_model, args.layers = args.vocab or 16000, 256, 4
        args.heads, args.kv_heads, args.d_ff = 8, 4, 768
    model = model_config(args)
    if jax.default_backend() == "cpu":
        measure_matmul_tflops(model.compute_dtype, repeats=30)  # the CPU peak, measured once
    tokens = args.batch * args.seq_len
    fpt = flops_per_token(model, args.seq_len)
    peak = peak_tflops_per_device(None, model.compute_dtype) * 1e12 * jax.device_count()
    device = jax.devices()[0]
    print(
        f"device: {jax.device_count()} x {device.device_kind} ({device.platform}); "
        f"peak {peak / 1e12:.2f} TFLOP/s; jax {jax.__version__}",
        file=sys.stderr,
    )
    print(
        f"model: {param_count(model) / 1e6:.1f}M params, {model}; "
        f"batch {args.batch} x {args.seq_len} = {tokens:,} tokens/step, "
        f"{fpt:.3e} FLOPs/token",
        file=sys.stderr,
    )
    results: dict[str, Any] = {
        "device": device.device_kind,
        "devices": jax.device_count(),
        "params": param_count(model),
        "tokens_per_step": tokens,
        "flops_per_token": fpt,
        "peak_flops": peak,
        "args": vars(args),
    }
    results.update(bench_steps(model, args))
    ref_one = results.pop("_ref_one")
    ref_tps = tokens / results["reference_s"]
    rows = [
        ("reference step (jit + optax.adam)", ref_tps, ref_tps),
        ("lemur step (lemur-train's compiled step)", tokens / results["lemur_s"], ref_tps),
    ]
    if args.loop:
        with tempfile.TemporaryDirectory() as work:
            results.update(bench_loop(model, args, Path(work), ref_one))
        around = tokens / results["loop_reference_s"]
        rows.append(("reference step, around the loop", around, around))
        rows.append(("lemur loop (loader + step + metrics)", results["loop_tokens_per_s"], around))
    print(f"{'run':<44} {'tokens/s':>12} {'MFU':>7} {'vs ref':>7}")
    for name, tps, base in rows:
        print(f"{name:<44} {tps:>12,.0f} {100 * tps * fpt / peak:>6.1f}% {tps / base:>6.2f}x")
    print(f"lemur step vs reference, median of paired rounds: {results['paired_ratio']:.3f}x")
    if args.loop:
        print(
            f"loop data wait (blocked on the loader): "
            f"{100 * results['loop_data_wait_frac']:.2f}% of step time; global batch "
            f"assembly {100 * results['loop_batch_put_frac']:.2f}% (overlaps the step)"
        )
    print(
        f"compile: reference {results['reference_compile_s']:.1f}s, "
        f"lemur {results['lemur_compile_s']:.1f}s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The measurements of tools/gpu_check.py, one per child process (see that script).

Each function takes the part's spec (a JSON-able dict the driver built) and a `save`
callback that writes what is known so far, so a part killed at its time cap still leaves
its partial figures. Nothing here runs at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lemur.model.config import LlamaConfig, config_from_preset, flops_per_token, param_count
from lemur.train.metrics import peak_tflops_per_device

Save = Callable[[dict[str, Any]], None]
# Shapes of the CPU smoke runs: every preset shrunk to this (vocab, ties, biases and rotary
# scaling kept, so the 128k/152k-vocab and Qwen2 paths still run).
SMOKE_SHAPE = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 192}
CUDNN_ATTENTION = "__cudnn$fmha"  # prefix of the cuDNN fused attention custom calls


def device_info() -> dict[str, Any]:
    """The device the figures come from, and the software that produced them."""
    d = jax.devices()[0]
    return {
        "device_kind": d.device_kind,
        "platform": d.platform,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }


def model_for(spec: dict[str, Any]) -> LlamaConfig:
    """The spec's model: a preset at bf16 (or the spec's dtype), its remat, seq_len room."""
    overrides: dict[str, Any] = {
        "dtype": spec["dtype"],
        "remat": spec["remat"],
        "max_seq_len": max(spec["seq_len"], 256),
    }
    if spec.get("attention"):
        overrides["attention_impl"] = spec["attention"]
    if spec["smoke"]:
        overrides |= SMOKE_SHAPE
    return config_from_preset(spec["preset"], **overrides)


def attention_calls(hlo_text: str) -> dict[str, Any]:
    """Which attention a compiled step runs, read off its optimized HLO's custom calls."""
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo_text)))
    cudnn = [t for t in targets if t.startswith(CUDNN_ATTENTION)]
    return {"attention": "cudnn" if cudnn else "xla", "cudnn_calls": cudnn, "custom_calls": targets}


def memory_analysis(compiled: Any) -> dict[str, Any]:
    """The compiler's own byte counts for the step (where the backend gives them)."""
    try:
        m = compiled.memory_analysis()
    except Exception as e:  # not every backend implements it
        return {"error": f"{type(e).__name__}: {e}"}
    names = ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes")
    return {n: int(getattr(m, n)) for n in (*names, "alias_size_in_bytes") if hasattr(m, n)}


def analytic_memory(model: LlamaConfig, batch: int, seq_len: int) -> dict[str, Any]:
    """Per-device bytes of the train step by formula, before anything runs.

    Uses `lemur-train plan`'s GPU estimate when this checkout has it
    (lemur.train.plan_estimate); else the same terms written out here: fp32 params,
    gradients and Adam's two moments; the activations the remat policy saves over every
    layer plus one layer's working set; the fp32 logits and their gradient.
    """
    try:
        from lemur.train.config import config_from_dict

        # Imported by name: the module is another branch's, merged or not when this runs.
        estimate_memory = importlib.import_module("lemur.train.plan_estimate").estimate_memory
        parse_target = importlib.import_module("lemur.train.plan_targets").parse_target

        raw = {
            "run_dir": "/tmp/unused",
            "model": {"preset": "llama-1b"},
            "data": {"dirs": ["/tmp/unused"]},
            "batch": {"size": batch, "seq_len": seq_len},
        }
        memory = estimate_memory(config_from_dict(raw), model, parse_target("h100-1"))
        return {"bytes": float(memory.peak), "source": "lemur.train.plan_estimate"}
    except Exception as e:  # not merged yet, or its API moved: the formula below
        reason = f"{type(e).__name__}: {e}"
    D, H, G, K, F = model.d_model, model.n_heads, model.n_kv_heads, model.head_dim, model.d_ff
    width = jnp.dtype(model.compute_dtype).itemsize
    matmuls = H * K + 2 * G * K + 2 * D + 2 * F
    every = matmuls + 3 * D + H * K + 2 * F
    saved = {"full": D, "dots": matmuls, "none": every}[model.remat] * width
    tokens = batch * seq_len
    state = 4 * param_count(model) * 4
    activations = tokens * (model.n_layers * saved + every * width + 8 * model.vocab_size)
    return {"bytes": float(state + activations), "source": f"formula in gpu_check ({reason})"}


def peak_bytes() -> int | None:
    """The device allocator's peak bytes in use (None where the backend keeps no stats)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats else int(stats.get("peak_bytes_in_use", 0))


def run_steps(
    compiled: Any, state: Any, layout: Any, loader: Any, total: int
) -> tuple[list[float], list[float], list[float], list[float]]:
    """`total` steps fed by the loader, as the trainer runs them (step n+1 dispatched before
    step n's loss is read): per-step wall times, data waits, batch put times and losses."""
    times, waits, puts, losses = [], [], [], []
    pending = None
    last = time.perf_counter()
    for _ in range(total):
        t0 = time.perf_counter()
        local = next(loader)
        t1 = time.perf_counter()
        batch = layout.put(local)
        waits.append(t1 - t0)
        puts.append(time.perf_counter() - t1)
        state, metrics = compiled(state, batch)
        if pending is not None:
            losses.append(float(pending["loss"]))  # blocks until the previous step is done
            now = time.perf_counter()
            times.append(now - last)
            last = now
        pending = metrics
    losses.append(float(pending["loss"]))
    times.append(time.perf_counter() - last)
    return times, waits, puts, losses


def train(spec: dict[str, Any], save: Save) -> dict[str, Any]:
    """Part 1/2/3/5: lemur's compiled train step on the carried corpus's packed batches."""
    from bench_train import compile_lemur_step

    from lemur.train.loader import make_train_iterator

    if spec.get("precision"):
        jax.config.update("jax_default_matmul_precision", spec["precision"])
    model = model_for(spec)
    B, L = spec["batch"], spec["seq_len"]
    fpt = flops_per_token(model, L)
    peak = peak_tflops_per_device(None, model.compute_dtype) * 1e12
    out: dict[str, Any] = {
        **device_info(),
        "model": dataclasses.asdict(model),
        "params": param_count(model),
        "batch": B,
        "seq_len": L,
        "tokens_per_step": B * L,
        "flops_per_token": fpt,
        "peak_flops": peak,
        "estimate": analytic_memory(model, B, L),
    }
    save(out)
    compiled, state, layout, compile_s = compile_lemur_step(
        model, B, L, document_attention=spec["doc_mask"]
    )
    out |= {"compile_s": compile_s, "compiled_memory": memory_analysis(compiled)}
    out |= attention_calls(compiled.as_text())
    save(out)
    # No vocab check: the corpus's 8k tokenizer ids fit every preset's table, and the MFU
    # is the preset's own (its vocabulary's head), not one shrunk to the corpus's.
    loader = make_train_iterator(spec["data"], seq_len=L, batch_size=B, seed=0)
    warmup = spec["warmup"]
    times, waits, puts, losses = run_steps(compiled, state, layout, loader, warmup + spec["steps"])
    loader.close()
    timed = times[warmup:]
    step_s = statistics.median(timed)
    out |= {
        "losses": losses,
        "step_s": step_s,
        "step_s_min": min(timed),
        "step_s_max": max(timed),
        "step_s_stdev": statistics.pstdev(timed),
        "step_times": timed,
        "tokens_per_s": B * L / step_s,
        "mfu": B * L * fpt / step_s / peak,
        "data_wait_frac": sum(waits[warmup:]) / sum(timed),
        "data_wait_max_s": max(waits[warmup:]),
        "batch_put_frac": sum(puts[warmup:]) / sum(timed),
        "peak_bytes_in_use": peak_bytes(),
    }
    if out["peak_bytes_in_use"]:
        out["peak_over_estimate"] = out["peak_bytes_in_use"] / out["estimate"]["bytes"]
    return out


def random_hf_folder(folder: Path, config: LlamaConfig) -> None:
    """Random weights (std 0.05, so greedy choices have margins) written as a bf16 HF folder
    (half the bytes to write; both sides then load the same bf16-exact values)."""
    from lemur.model import hf, llama

    params = jax.jit(llama.init_params, static_argnums=0)(config, jax.random.key(0))
    params = jax.device_get(params)
    hf.write_hf_checkpoint(folder, config, hf.params_to_hf(params, config, "bfloat16"))


def greedy_equal(models: dict[str, Any], batch: list[list[int]], new: int, device: str) -> dict:
    """Rows whose greedy tokens agree between lemur and transformers, per dtype. fp32 runs
    at matmul precision "highest" on both sides (no TF32), so equality is the assertion;
    bf16 rows can part at near-ties of random weights and are recorded for information."""
    from bench_generate import hf_runner, lemur_runner, same_tokens

    out = {}
    for dtype, (ours, theirs) in models.items():
        exact = dtype == "float32"
        with jax.default_matmul_precision("highest") if exact else contextlib.nullcontext():
            ok = same_tokens(
                lemur_runner(ours, batch, new), hf_runner(theirs, batch, new, device), batch
            )
        out[f"greedy_rows_equal_{dtype}"] = f"{ok}/{len(batch)}"
    return out


def decode_prompts(count: int, vocab: int, seed: int = 1) -> list[list[int]]:
    """`count` prompts of random ids after BOS, of lengths 40 to 40 + 6 (count - 1)."""
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, vocab, 40 + 6 * i).tolist()] for i in range(count)]


def decode(spec: dict[str, Any], save: Save) -> dict[str, Any]:
    """Part 4: lemur's generation against transformers' `generate`, same GPU, same prompts."""
    import torch
    from bench_generate import load_hf, measure

    from lemur.eval.load import load_model
    from lemur.model.decode import split_layers

    device = "cuda" if torch.cuda.is_available() and not spec["smoke"] else "cpu"
    base = model_for({**spec, "dtype": "float32", "remat": "none", "seq_len": 2048})
    config = dataclasses.replace(base, init_std=0.05)
    out: dict[str, Any] = {**device_info(), "torch": torch.__version__, "torch_device": device}
    out |= {"params": param_count(config), "new_tokens": spec["new"]}
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        random_hf_folder(Path(tmp), config)
        out["export_s"] = time.perf_counter() - t
        models = {}
        for dtype in ("float32", spec["dtype"]):
            ours = load_model(tmp, dtype=dtype)
            ours.params = split_layers(ours.params)  # as lemur-eval does
            models[dtype] = (ours, load_hf(Path(tmp), device, dtype))
    save(out)
    prompts = decode_prompts(max(spec["batches"]), config.vocab_size)
    rows = []
    for size in spec["batches"]:
        batch = prompts[:size]
        row: dict[str, Any] = {"batch": size, **greedy_equal(models, batch, spec["new"], device)}
        ours, theirs = models[spec["dtype"]]
        row |= measure(ours, theirs, [batch], spec["new"], spec["rounds"], device)
        row["decode_ratio"] = row["lemur"]["decode_tok_s"] / row["transformers"]["decode_tok_s"]
        row["prefill_ratio"] = row["lemur"]["prefill_tok_s"] / row["transformers"]["prefill_tok_s"]
        rows.append(row)
        save(out | {"rows": rows})
    return out | {"rows": rows}


PARTS: dict[str, Callable[[dict[str, Any], Save], dict[str, Any]]] = {
    "train": train,
    "decode": decode,
}

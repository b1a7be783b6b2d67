"""Benchmark: prefill and decode tokens/s of lemur's KV-cache generation against
transformers' `generate`, on the same random Llama (GQA) exported to HF, same prompts,
same device, same process.

Both decode greedily with no early stop. Prefill time is a generation of one new token;
decode time is a generation of --new tokens minus that, over the (--new - 1) tokens it
adds per row. Each figure is the median of --rounds timed runs after two warm-up runs (which
compile lemur's programs); the runs of both implementations alternate, so a change in
the machine's load hits both alike. Batch 1 runs the first 3 prompts one at a time; batch 8 runs
8 prompts of different lengths together (left-padded in both).

    python tools/bench_generate.py --json bench_generate.json
    python tools/bench_generate.py --device cuda --dtype bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from lemur.eval import generate as gen_lib  # noqa: E402
from lemur.eval.decoding import GenerationConfig  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.model import hf  # noqa: E402
from lemur.model.config import LlamaConfig, param_count, param_shapes
from lemur.model.decode import split_layers  # noqa: E402


def make_model(out: Path, args: argparse.Namespace) -> LlamaConfig:
    """A random Llama (GQA) exported to an HF folder with lemur's exporter."""
    config = LlamaConfig(
        vocab_size=32000,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=args.d_ff,
        dtype="float32",
        init_std=0.05,
        max_seq_len=2048,
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: (config.init_std * rng.standard_normal(s)).astype(np.float32),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    hf.write_hf_checkpoint(out, config, hf.params_to_hf(params, config, "float32"), dtype="float32")
    return config


def prompts(n: int) -> list[list[int]]:
    """n prompts of different lengths (41 to 41 + 22 (n - 1) tokens) of random ids."""
    rng = np.random.default_rng(1)
    return [[1, *rng.integers(3, 32000, 40 + 22 * i).tolist()] for i in range(n)]


def interleaved_medians(fns: dict[str, Any], rounds: int, warmup: int = 2) -> dict[str, float]:
    """Median wall seconds of each fn, timed in turn round after round (so a change in the
    machine's load hits every one alike), after `warmup` untimed runs of each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def lemur_runner(model: Any, batch: list[list[int]], new: int) -> Any:
    """A closure generating `new` greedy tokens for the batch with lemur."""
    gen = GenerationConfig(max_new_tokens=new, batch_size=len(batch))
    return lambda: gen_lib.generate_ids(model.params, model.config, batch, gen, eos_id=None)


def hf_runner(model: Any, batch: list[list[int]], new: int, device: str) -> Any:
    """A closure generating `new` greedy tokens for the batch with transformers (left-padded)."""
    import torch

    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)

    def run() -> Any:
        with torch.no_grad():
            out = model.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0
            )
        if device != "cpu":
            torch.cuda.synchronize()
        return out

    return run


def measure(
    ours: Any, hf: Any, batches: list[list[list[int]]], new: int, rounds: int, device: str
) -> dict[str, dict[str, float]]:
    """Prefill and decode tokens/s of both implementations over a list of batches."""
    fns = {}
    for i, b in enumerate(batches):
        for n in (1, new):
            fns[("lemur", i, n)] = lemur_runner(ours, b, n)
            fns[("transformers", i, n)] = hf_runner(hf, b, n, device)
    t = interleaved_medians(fns, rounds)
    prompt_tokens = sum(len(p) for b in batches for p in b)
    new_tokens = sum(len(b) for b in batches) * (new - 1)
    out = {}
    for name in ("lemur", "transformers"):
        prefill_s = sum(t[(name, i, 1)] for i in range(len(batches)))
        total_s = sum(t[(name, i, new)] for i in range(len(batches)))
        out[name] = {
            "prefill_s": prefill_s,
            "total_s": total_s,
            "prefill_tok_s": prompt_tokens / prefill_s,
            "decode_tok_s": new_tokens / max(total_s - prefill_s, 1e-9),
        }
    return out


def same_tokens(ours: Any, theirs: Any, batch: list[list[int]]) -> int:
    """Rows whose greedy tokens agree between the two implementations."""
    width = max(map(len, batch))
    out = theirs().cpu().numpy()[:, width:]
    return sum(c.tokens == out[i].tolist() for i, c in enumerate(ours()))


def load_hf(path: Path, device: str, dtype: str) -> Any:
    """The exported model in transformers, greedy with no end-of-sequence stop."""
    import torch
    import transformers

    model = (
        transformers.LlamaForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        .to(device)
        .eval()
    )
    model.generation_config.eos_token_id = None
    return model


def parse_args() -> argparse.Namespace:
    """Model size, run length and device."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="torch device (JAX uses its default)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None)
    return ap.parse_args()


def compare(ours: Any, theirs: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per batch size: both implementations' figures and greedy agreement."""
    all_prompts = prompts(8)
    rows = []
    for batch, batches in {1: [[p] for p in all_prompts[:3]], 8: [all_prompts]}.items():
        timed = measure(ours, theirs, batches, args.new, args.rounds, args.device)
        agree = sum(
            same_tokens(
                lemur_runner(ours, b, args.new), hf_runner(theirs, b, args.new, args.device), b
            )
            for b in batches
        )
        rows.append(
            {"batch": batch, **timed, "greedy_rows_equal": f"{agree}/{sum(map(len, batches))}"}
        )
    return rows


def print_table(report: dict[str, Any]) -> None:
    """The markdown table of docs/benchmarks.md."""
    print(
        f"{report['params'] / 1e6:.1f}M params, {report['new_tokens']} new tokens, "
        f"{report['device']}, load {report['load_average'][0]:.1f}"
    )
    print(
        "| batch | prefill tok/s lemur | transformers | ratio | decode tok/s lemur | "
        "transformers | ratio | greedy rows equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in report["rows"]:
        o, t = r["lemur"], r["transformers"]
        print(
            f"| {r['batch']} | {o['prefill_tok_s']:,.0f} | {t['prefill_tok_s']:,.0f} | "
            f"{o['prefill_tok_s'] / t['prefill_tok_s']:.2f}x | {o['decode_tok_s']:,.1f} | "
            f"{t['decode_tok_s']:,.1f} | {o['decode_tok_s'] / t['decode_tok_s']:.2f}x | "
            f"{r['greedy_rows_equal']} |"
        )


def main() -> int:
    """Run the comparison, print a markdown table, optionally write JSON."""
    args = parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        config = make_model(Path(tmp), args)
        ours = load_model(tmp, dtype=args.dtype)
        ours.params = split_layers(ours.params)  # as lemur-eval does
        theirs = load_hf(Path(tmp), args.device, args.dtype)
    report = {
        "params": param_count(config),
        "config": dataclasses.asdict(config),
        "new_tokens": args.new,
        "device": f"jax {jax.devices()[0].platform}, torch {args.device} "
        f"({torch.get_num_threads()} threads)",
        "dtype": args.dtype,
        "jax": jax.__version__,
        "torch": torch.__version__,
        "rows": compare(ours, theirs, args),
        "load_average": os.getloadavg(),
    }
    print_table(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

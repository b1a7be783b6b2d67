"""Benchmark: `lemur-eval harness`'s model (lemur.model.harness_lm, JAX) against lm-eval's own
HF backend (`--model hf`, torch) on the `lemur-convert to-hf` export of the same random
Llama, the same lm-eval tasks, in one process, on the same CPU threads.

Two tasks are written to a temporary folder from real standard-library source: a
multiple-choice task (loglikelihood: which of four lines follows a snippet) and a
generate_until task (greedy continuation of a function's first lines, --new tokens, a stop
string no row reaches, so every row decodes --new tokens). The tokenizer is a real 32k
SentencePiece BPE with Llama-2's conventions (the mistral-common wheel's
`tokenizer.model.v1`). Each task runs through `lm_eval.simple_evaluate` with both models,
alternating, --rounds times; the time is that of the model's `loglikelihood` or
`generate_until` calls only (task building is the same code for both). The first round
includes lemur's compiles (cold); the figures are the best later round (warm). Both must
agree: per-sample loglikelihoods within max(1e-4, 1e-6 |ll|) and the same generations.

    python tools/bench_harness.py --json bench_harness.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.model import checkpoint  # noqa: E402
from lemur.model.config import LlamaConfig, param_count, param_shapes  # noqa: E402
from lemur.model.harness_lm import harness_lm  # noqa: E402

STDLIB = Path(os.__file__).parent


def llama2_tokenizer() -> Path:
    """The mistral-common wheel's Llama-2-style 32k SentencePiece model."""
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    if not path.is_file():
        sys.exit(f"bench_harness: {path} missing (pip install mistral-common)")
    return path


def make_models(root: Path, args: argparse.Namespace) -> tuple[Path, Path, LlamaConfig]:
    """A random lemur checkpoint with the tokenizer, and its float32 HF export."""
    config = LlamaConfig(
        vocab_size=32000,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        d_ff=args.d_ff,
        dtype="float32",
        init_std=0.05,
        max_seq_len=args.context,
    )
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda s: (config.init_std * rng.standard_normal(s)).astype(np.float32),
        param_shapes(config),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    checkpoint.save_params(root / "lemur", params, config, llama2_tokenizer())
    argv = ["to-hf", str(root / "lemur"), str(root / "hf"), "--dtype", "float32"]
    if convert.main(argv) != 0:
        sys.exit("bench_harness: lemur-convert to-hf failed")
    return root / "lemur", root / "hf", config


def source_lines(n_files: int) -> list[list[str]]:
    """Non-blank lines of the first standard-library modules (sorted by name)."""
    files = sorted(STDLIB.glob("*.py"))[:n_files]
    return [[ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()] for f in files]


def write_tasks(folder: Path, args: argparse.Namespace) -> list[str]:
    """The two task YAMLs and their JSONL data (absolute data_files paths)."""
    rnd = random.Random(0)
    files = [lines for lines in source_lines(60) if len(lines) > 40]
    mc, gen = [], []
    for i in range(args.mc_docs):
        lines = files[i % len(files)]
        at = rnd.randrange(8, len(lines) - 1)
        wrong = rnd.sample([ln for ln in lines if ln != lines[at]], 3)
        answer = rnd.randrange(4)
        choices = wrong[:answer] + [lines[at]] + wrong[answer:]
        mc.append({"snippet": "\n".join(lines[at - 8 : at]), "choices": choices, "answer": answer})
    for i in range(args.gen_docs):
        lines = files[(i * 7) % len(files)]
        at = rnd.randrange(0, len(lines) - 6)
        gen.append({"prompt": "\n".join(lines[at : at + 6]) + "\n"})
    for name, rows in (("mc", mc), ("gen", gen)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = "dataset_path: json\ntest_split: test\nmetadata: {version: 1.0}\n"
    (folder / "bench_mc.yaml").write_text(
        f"task: bench_mc\n{common}dataset_kwargs: {{data_files: {{test: {folder / 'mc.jsonl'}}}}}\n"
        'output_type: multiple_choice\ndoc_to_text: "{{snippet}}\\n"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list: [{metric: acc}]\n"
    )
    (folder / "bench_gen.yaml").write_text(
        f"task: bench_gen\n{common}dataset_kwargs: {{data_files: {{test: {folder / 'gen.jsonl'}}}}}\n"
        'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: ""\n'
        f"generation_kwargs: {{until: ['\\x00\\x00'], max_gen_toks: {args.new}, do_sample: false}}\n"
        "metric_list: [{metric: exact_match}]\n"
    )
    return ["bench_mc", "bench_gen"]


def timed(lm: Any) -> dict[str, float]:
    """Wrap the LM's request methods so that their wall seconds add up in the returned dict."""
    seconds: dict[str, float] = {"loglikelihood": 0.0, "generate_until": 0.0}
    for name in seconds:
        method = getattr(lm, name)

        def wrapper(requests: Any, *a: Any, _m: Any = method, _n: str = name, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return _m(requests, *a, **k)
            finally:
                seconds[_n] += time.perf_counter() - t0

        setattr(lm, name, wrapper)
    return seconds


def run_task(lm: Any, task: str, manager: Any) -> tuple[float, list[dict[str, Any]]]:
    """(seconds in the model, per-sample records) of one task through simple_evaluate."""
    import lm_eval

    seconds = timed(lm)
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True)
    return sum(seconds.values()), sorted(out["samples"][task], key=lambda s: s["doc_id"])


def agree(task: str, ours: list[dict], ref: list[dict]) -> str:
    """How the two backends' per-sample answers compare."""
    if task == "bench_gen":
        same = sum(a["resps"][0][0] == b["resps"][0][0] for a, b in zip(ours, ref, strict=True))
        return f"{same}/{len(ref)} generations equal"
    pairs = [
        (x[0][0], y[0][0])
        for a, b in zip(ours, ref, strict=True)
        for x, y in zip(a["resps"], b["resps"], strict=True)
    ]
    within = sum(abs(x - y) <= max(1e-4, 1e-6 * abs(y)) for x, y in pairs)
    worst = max(abs(x - y) for x, y in pairs)
    return f"{within}/{len(pairs)} loglikelihoods within tolerance (max |diff| {worst:.1e})"


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The random Llama's size options (`make_models` reads them), shared with bench_serve."""
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--context", type=int, default=512, help="max_seq_len")


def main() -> int:
    """Build, run both backends round after round, print a table (and --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mc-docs", type=int, default=64, help="multiple-choice documents (x4)")
    p.add_argument("--gen-docs", type=int, default=16, help="generation prompts")
    p.add_argument("--new", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--batch-size", type=int, default=8, help="both backends")
    p.add_argument("--rounds", type=int, default=2, help="runs of each (the first is cold)")
    add_model_args(p)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lemur_dir, hf_dir, config = make_models(root, args)
        (root / "tasks").mkdir()
        tasks = write_tasks(root / "tasks", args)
        manager = TaskManager(include_path=str(root / "tasks"))
        model = load_model(lemur_dir, dtype="float32")
        ours = harness_lm(model.config, model.params, model.tokenizer, batch_size=args.batch_size)
        hf = HFLM(pretrained=str(hf_dir), dtype="float32", batch_size=args.batch_size, device="cpu")
        figures = measure(ours, hf, tasks, manager, args.rounds)
    report(figures, config, args)
    return 0


def alternate(
    lms: dict[str, Any], task: str, manager: Any, rounds: int
) -> tuple[dict[str, float], dict[str, float], dict[str, list[dict]]]:
    """(cold seconds, warm seconds, samples) of each backend on one task, the backends
    alternated round after round (warm: the best round after the first)."""
    times: dict[str, list[float]] = {name: [] for name in lms}
    samples: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for name, lm in lms.items():
            secs, samples[name] = run_task(lm, task, manager)
            times[name].append(secs)
    warm = {n: min(t[1:]) if len(t) > 1 else t[0] for n, t in times.items()}
    return {n: t[0] for n, t in times.items()}, warm, samples


def measure(ours: Any, hf: Any, tasks: list[str], manager: Any, rounds: int) -> dict[str, Any]:
    """Per task: cold and warm seconds of each backend, and how their answers agree."""
    figures: dict[str, Any] = {}
    for task in tasks:
        cold, warm, samples = alternate({"lemur": ours, "hf": hf}, task, manager, rounds)
        figures[task] = {
            "cold_s": cold,
            "warm_s": warm,
            "speedup": warm["hf"] / warm["lemur"],
            "agreement": agree(task, samples["lemur"], samples["hf"]),
        }
    return figures


def report(figures: dict[str, Any], config: LlamaConfig, args: argparse.Namespace) -> None:
    """Print the table; write --json."""
    print(
        f"model: d_model {config.d_model}, {config.n_layers} layers, {config.n_heads} heads / "
        f"{config.n_kv_heads} KV, d_ff {config.d_ff}, vocab 32000 ({param_count(config):,} "
        f"params), fp32, context {config.max_seq_len}; batch {args.batch_size}; torch threads "
        f"{args.threads}; jax {jax.__version__} on {jax.default_backend()}"
    )
    print("| task | lemur s (cold) | hf s (cold) | lemur s | hf s | speedup | agreement |")
    print("|---|---|---|---|---|---|---|")
    for task, f in figures.items():
        print(
            f"| {task} | {f['cold_s']['lemur']:.2f} | {f['cold_s']['hf']:.2f} | "
            f"{f['warm_s']['lemur']:.2f} | {f['warm_s']['hf']:.2f} | "
            f"**{f['speedup']:.2f}x** | {f['agreement']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "figures": figures}, indent=2))


if __name__ == "__main__":
    sys.exit(main())

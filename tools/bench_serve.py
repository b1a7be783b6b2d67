"""Benchmark: lm-eval through `lemur-eval serve` (`--model local-completions`, concurrent
clients) against `lemur-eval harness`'s model in process (lemur.model.harness_lm), the
same random Llama and the same lm-eval tasks (tools/bench_harness.py's: a multiple-choice
loglikelihood task and a greedy generate_until task over standard-library source, a
32k SentencePiece BPE), on this machine's CPUs. Goal: serve within 0.8x of in process.

The server runs in a subprocess (`--batch-size` rows per device call); lm-eval sends
`--client-batch` prompts per request, `--concurrent` requests at once. The time is that of
the model's `loglikelihood` or `generate_until` calls only; the first round includes the
compiles (cold), the figures are the best later round (warm). The in-process model runs
with `add_bos_token=False`, as the server sees prompts (lm-eval's API client sends no
BOS), so both must agree: loglikelihoods within max(1e-4, 1e-6 |ll|), the same
generations. The load average is printed: other work on the machine skews both.

    python tools/bench_serve.py --json bench_serve.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_harness beside this file
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import jax  # noqa: E402
from bench_harness import add_model_args, agree, alternate, make_models, write_tasks  # noqa: E402

from lemur.eval.load import load_model  # noqa: E402
from lemur.model.config import param_count  # noqa: E402
from lemur.model.harness_lm import harness_lm  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def start_server(model: Path, batch_size: int) -> tuple[subprocess.Popen, str]:
    """`lemur-eval serve` on a free port, and its base URL once it listens."""
    argv = [sys.executable, "-m", "lemur.eval.cli", "serve", str(model), "--port", "0"]
    argv += ["--dtype", "float32", "--batch-size", str(batch_size), "--max-queue", "4096"]
    proc = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if m := re.search(r"serving .* on (http://\S+)/v1", line):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
    sys.exit(f"bench_serve: the server exited {proc.wait()} before serving")


def served_lm(url: str, hf_dir: Path, context: int, args: argparse.Namespace) -> Any:
    """lm-eval's local-completions client of the server, the export's tokenizer."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        base_url=f"{url}/v1/completions",
        tokenizer_backend="huggingface",
        tokenizer=str(hf_dir),
        max_length=context,
        batch_size=args.client_batch,
        num_concurrent=args.concurrent,
        max_retries=1,
    )


def measure(lms: dict[str, Any], tasks: list[str], manager: Any, rounds: int) -> dict[str, Any]:
    """Per task: cold and warm seconds of each, how their answers agree, serve's ratio."""
    figures: dict[str, Any] = {}
    for task in tasks:
        cold, warm, samples = alternate(lms, task, manager, rounds)
        figures[task] = {
            "cold_s": cold,
            "warm_s": warm,
            "serve_vs_harness": warm["harness"] / warm["serve"],
            "agreement": agree(task, samples["serve"], samples["harness"]),
        }
    return figures


def main() -> int:
    """Build, serve, run both round after round, print a table (and --json)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mc-docs", type=int, default=32, help="multiple-choice documents (x4)")
    p.add_argument("--gen-docs", type=int, default=16, help="generation prompts")
    p.add_argument("--new", type=int, default=32, help="tokens generated per prompt")
    p.add_argument("--batch-size", type=int, default=8, help="rows per device call, both")
    p.add_argument("--client-batch", type=int, default=4, help="prompts per request")
    p.add_argument("--concurrent", type=int, default=8, help="requests at once")
    p.add_argument("--rounds", type=int, default=3, help="runs of each (the first is cold)")
    add_model_args(p)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args()
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lemur_dir, hf_dir, config = make_models(root, args)
        (root / "tasks").mkdir()
        tasks = write_tasks(root / "tasks", args)
        manager = TaskManager(include_path=str(root / "tasks"))
        model = load_model(lemur_dir, dtype="float32")
        proc, url = start_server(lemur_dir, args.batch_size)
        try:
            lms = {
                "harness": harness_lm(
                    model.config,
                    model.params,
                    model.tokenizer,
                    batch_size=args.batch_size,
                    add_bos_token=False,
                ),
                "serve": served_lm(url, hf_dir, config.max_seq_len, args),
            }
            figures = measure(lms, tasks, manager, args.rounds)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
    print(
        f"model: d_model {config.d_model}, {config.n_layers} layers, vocab 32000 "
        f"({param_count(config):,} params), fp32, context {config.max_seq_len}; batch "
        f"{args.batch_size}; client: {args.client_batch} prompts x {args.concurrent} "
        f"concurrent; jax {jax.__version__} on {jax.default_backend()}; {os.cpu_count()} CPUs; "
        f"server exit {code}; load average {os.getloadavg()[0]:.1f}"
    )
    print("| task | harness s (cold) | serve s (cold) | harness s | serve s | serve vs harness |")
    print("|---|---|---|---|---|---|")
    for task, f in figures.items():
        print(
            f"| {task} | {f['cold_s']['harness']:.2f} | {f['cold_s']['serve']:.2f} | "
            f"{f['warm_s']['harness']:.2f} | {f['warm_s']['serve']:.2f} | "
            f"**{f['serve_vs_harness']:.2f}x** | {f['agreement']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One prepared GPU run for issue #39: trainer MFU, attention path, memory, loader, decode.

Runs each measurement in its own child process under its own time cap (so an OOM, a hang
or a crash costs that part only, and each part's peak memory is its own), within one
overall budget, and rewrites `OUT/results.json` atomically after every part (children
also save partial figures as they go); children's output goes to `OUT/log.txt`. The parent
never imports JAX (it would hold the GPU the children need). The parts, in the order they
run (the ones the issue's acceptance needs first; the rest as the budget allows):

  1. train_b8_dots: `llama-1b`, seq 4096, bf16 compute, fp32 master weights, document
     masking on, packed batches of the carried corpus through lemur's own Grain loader
     (`make_train_iterator`) into lemur's compiled train step (tools/bench_train.py
     `compile_lemur_step`), stepped as the trainer steps (step n+1 queued before step n's
     loss is read): tokens/s, MFU, step-time spread over 20 timed steps after 3 warm-up
     steps, the attention the compiled HLO calls (`__cudnn$fmha*` custom calls, or none:
     XLA), peak memory (`memory_stats()["peak_bytes_in_use"]`) against the analytic
     estimate (`lemur-train plan`'s GPU formula where this checkout has it, else the same
     terms written out), and the loader's wait per step (goal < 1% of step time).
  2. decode: `llama-1b`, random weights written as an HF folder, lemur's generation
     (lemur.eval.generate, as `lemur-eval generate` runs it) against transformers'
     `generate` on the same GPU, at batch 1 and 32, 128 new tokens, greedy, bf16 timings
     (tools/bench_generate.py `measure`); greedy tokens compared in fp32 at matmul
     precision "highest" on both sides (must be equal) and in bf16 (information).
  3. train_b4_none: the sweep's second setting (batch 4, no remat).
  4. train_b8_dots_nomask: part 1 without segment ids: the attention path and MFU of each.
  5. train_fp32_check: part 1's first 3 batches in fp32 (precision "highest", full remat
     to fit): its losses must equal part 1's within 1e-2 relative.
  6. train_b16_full: the sweep's third setting (batch 16, full remat). The best of the
     three settings is the summary's `best_setting`.
  7. if time is left: `llama3.2-1b` (128k vocab) and `qwen2.5-1.5b` at batch 4 + dots.

`--smoke` runs every part on the CPU with the same presets shrunk to 2 layers of width 64
(vocab, tied head, Qwen2 biases and rotary scaling kept), seq 128, batch <= 2, 3 steps,
decode at batch 1 and 2 with 8 new tokens. `--parts a,b` runs only those (a rerun).

On the CPU machine, in the repository root (tools/gpu_check.md has the wheels, the exact
`run` call, and what to copy into docs/benchmarks.md afterwards):

    python tools/gpu_check.py prepare            # .gpucheck/corpus: 3.1M tokens, 6.1 MiB
    python tools/gpu_check.py run --smoke --out /tmp/gpu_check_smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_check_report import summarize

DEFAULT_DIR = ".gpucheck"


@dataclasses.dataclass(frozen=True)
class Part:
    """One child run: its name, which function of gpu_check_parts, its cap, its spec."""

    name: str
    kind: str
    cap_s: float
    spec: dict[str, Any]


def train_part(name: str, cap: float, smoke: bool, data: str, **spec: Any) -> Part:
    """A train measurement of `preset` at the spec's batch and remat (GPU or smoke sizes)."""
    base = {
        "preset": "llama-1b",
        "dtype": "bfloat16",
        "doc_mask": True,
        "seq_len": 128 if smoke else 4096,
        "steps": 3 if smoke else 20,
        "warmup": 1 if smoke else 3,
    }
    full = base | spec | {"smoke": smoke, "data": data}
    if smoke:
        full["batch"] = min(full["batch"], 2)
    return Part(name, "train", cap, full)


def plan(smoke: bool, data: str) -> list[Part]:
    """The parts in the order they run (see the module docstring)."""
    t = {"smoke": smoke, "data": data}
    decode = {
        "preset": "llama-1b",
        "dtype": "bfloat16",
        "seq_len": 2048,
        "remat": "none",
        "batches": [1, 2] if smoke else [1, 32],
        "new": 8 if smoke else 128,
        "rounds": 1 if smoke else 2,
        "smoke": smoke,
    }
    return [
        train_part("train_b8_dots", 150, **t, batch=8, remat="dots"),
        Part("decode", "decode", 180, decode),
        train_part("train_b4_none", 110, **t, batch=4, remat="none"),
        train_part("train_b8_dots_nomask", 110, **t, batch=8, remat="dots", doc_mask=False),
        train_part(
            "train_fp32_check",
            120,
            **t,
            batch=8,
            remat="full",
            dtype="float32",
            precision="highest",
            steps=3,
            warmup=0,
        ),
        train_part("train_b16_full", 130, **t, batch=16, remat="full"),
        train_part(
            "train_llama3.2-1b_b4_dots", 120, **t, preset="llama3.2-1b", batch=4, remat="dots"
        ),
        train_part(
            "train_qwen2.5-1.5b_b4_dots", 120, **t, preset="qwen2.5-1.5b", batch=4, remat="dots"
        ),
    ]


class Results:
    """results.json and log.txt under the output folder, rewritten as parts finish."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path, self.log_path = out / "results.json", out / "log.txt"
        self.data: dict[str, Any] = {"meta": meta, "parts": {}, "summary": {}}
        self.write()

    def log(self, line: str) -> None:
        """One line to stdout and log.txt."""
        print(line, flush=True)
        with open(self.log_path, "a") as f:
            f.write(line + "\n")

    def write(self) -> None:
        """Rewrite results.json atomically (a temporary file renamed over it)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)


def run_child(part: Part, cap: float, results: Results, smoke: bool) -> dict[str, Any]:
    """Run one part in a child process, killed at `cap` seconds; what it saved, plus how
    it ended (`status`: ok, error, timeout; `wall_s`)."""
    env = dict(os.environ)
    if part.kind == "decode":  # JAX shares the GPU with torch: no up-front 75% grab
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if not smoke:  # a rerun on the same warm machine skips the compiles
        env.setdefault("JAX_COMPILATION_CACHE_DIR", "/tmp/gpu_check_jax_cache")
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps({"kind": part.kind, "spec": part.spec}))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "child",
            str(spec_path),
            str(out_path),
        ]
        t = time.perf_counter()
        with open(results.log_path, "a") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            try:
                rc = proc.wait(timeout=cap)
                status = "ok" if rc == 0 else "error"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: this child and its helpers
                proc.wait()
                status = "timeout"
        got = json.loads(out_path.read_text()) if out_path.exists() else {}
    got.setdefault("status", status)
    if status == "timeout":
        got["status"], got["error"] = "timeout", f"killed at its {cap:g} s cap"
    elif status == "error" and "error" not in got:
        got["error"] = f"exit code {proc.returncode}, nothing saved (see log.txt)"
    got["wall_s"] = time.perf_counter() - t
    return got


def child(spec_path: str, out_path: str) -> int:
    """Inside a child process: run the part, saving partial results as it goes."""
    import gpu_check_parts

    from lemur.shards.format import atomic_write_json

    job = json.loads(Path(spec_path).read_text())
    state: dict[str, Any] = {"spec": job["spec"]}

    def save(partial: dict[str, Any]) -> None:
        state.update(partial)
        atomic_write_json(out_path, json.loads(json.dumps(state, default=str)))

    try:
        save(gpu_check_parts.PARTS[job["kind"]](job["spec"], save) | {"status": "ok"})
        return 0
    except BaseException as e:  # recorded for the driver; the next part still runs
        traceback.print_exc()
        save({"status": "error", "error": f"{type(e).__name__}: {str(e)[:2000]}"})
        return 1


def print_table(results: Results) -> None:
    """A short table last, where the run tool's output tail shows it."""
    data = results.data
    results.log(f"device: {data['meta'].get('device_kind')} ; jax {data['meta'].get('jax')}")
    for name, p in data["parts"].items():
        figures = ""
        if "mfu" in p:
            figures = (
                f"{p['tokens_per_s']:,.0f} tok/s  MFU {100 * p['mfu']:.1f}%  step "
                f"{p['step_s']:.3f}s [{p['step_s_min']:.3f}-{p['step_s_max']:.3f}]  "
                f"attn {p.get('attention')}  wait {100 * p['data_wait_frac']:.2f}%"
            )
        for r in p.get("rows", []):
            figures += (
                f" b{r['batch']}: decode {r['decode_ratio']:.2f}x, fp32 equal "
                f"{r['greedy_rows_equal_float32']};"
            )
        error = f" {p['error']}" if p.get("error") else ""
        results.log(
            f"{name:<28} {p.get('status', '?'):<8} {p.get('wall_s', 0):6.0f}s {figures}{error}"
        )
    results.log("summary: " + json.dumps(data["summary"], default=str))


def run(args: argparse.Namespace) -> int:
    """Every selected part, in order, within the budget; results.json after each."""
    out = Path(args.out or os.environ.get("OUT") or "gpu_check_out")
    data = str(Path(args.dir, "corpus").resolve())
    # No JAX here: a parent holding the GPU (JAX takes 75% of it at start) would starve
    # the children. The device and versions come from the first child that reports them.
    meta = {
        "smoke": args.smoke,
        "budget_s": args.budget,
        "argv": sys.argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results = Results(out, meta)
    results.log(f"gpu_check: budget {args.budget:.0f} s, output {out}")
    deadline = time.monotonic() + args.budget
    chosen = set(args.parts.split(",")) if args.parts else None
    for part in plan(args.smoke, data):
        if chosen is not None and part.name not in chosen:
            continue
        left = deadline - time.monotonic()
        if left < args.min_part_s:
            results.data["parts"][part.name] = {"status": "skipped", "error": f"{left:.0f} s left"}
            results.write()
            continue
        results.log(f"== {part.name} (cap {min(part.cap_s, left):.0f} s)")
        got = run_child(part, min(part.cap_s, left), results, args.smoke)
        results.data["parts"][part.name] = got
        for key in ("device_kind", "platform", "device_count", "jax", "torch"):
            if key in got:
                meta.setdefault(key, got[key])
        results.data["summary"] = summarize(results.data["parts"])
        results.write()
        results.log(
            f"== {part.name}: {got['status']} in {got['wall_s']:.0f} s {got.get('error', '')}"
        )
    print_table(results)
    return 0


def corpus_recipe(directory: Path, work: Path) -> str:
    """The recipe of the carried corpus: this machine's Python standard library sources
    (real code, ~4M tokens with an 8k SentencePiece), packed for seq 4096."""
    stdlib = sysconfig.get_paths()["stdlib"]
    skip = [
        "test/*",
        "idlelib/*",
        "lib2to3/*",
        "site-packages/*",
        "tkinter/*",
        "turtledemo/*",
        "ensurepip/*",
        "config-*",
    ]
    return json.dumps(
        {
            "output": str(directory / "corpus"),
            "work_dir": str(work),
            "seed": 0,
            "seq_len": 4096,
            "tokenizer": {"train": {"vocab_size": 8000, "sample_bytes": 4_000_000}},
            "mix": {"ratio": {"code": 1}},
            "executor": {"kind": "local", "tasks": 2, "workers": 2},
            "shard_tokens": 1 << 20,
            "sources": [
                {
                    "name": "stdlib",
                    "domain": "code",
                    "format": "files",
                    "paths": [stdlib],
                    "include": ["*.py"],
                    "exclude": skip,
                    "language": "Python",
                }
            ],
        }
    )  # JSON is YAML


def prepare(args: argparse.Namespace) -> int:
    """Build the corpus with `lemur-data build` into DIR/corpus (its work dir elsewhere)."""
    directory = Path(args.dir).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = Path(tmp) / "recipe.yaml"
        recipe.write_text(corpus_recipe(directory, Path(tmp) / "work"))
        cmd = [sys.executable, "-m", "lemur.data.cli", "build", str(recipe), "--force"]
        rc = subprocess.call(cmd)
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    print(f"gpu_check: {directory / 'corpus'}: {size / 2**20:.1f} MiB (exit {rc})")
    return rc


def main(argv: list[str] | None = None) -> int:
    """prepare | run [--smoke] | child (internal)."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("prepare", help="build the corpus the run reads (CPU machine)")
    pre.add_argument("--dir", default=DEFAULT_DIR)
    r = sub.add_parser("run", help="run the parts")
    r.add_argument("--dir", default=DEFAULT_DIR, help="where `prepare` put corpus/")
    r.add_argument("--out", default=None, help="results folder (default $OUT)")
    r.add_argument("--smoke", action="store_true", help="every part at tiny sizes on CPU")
    r.add_argument(
        "--budget", type=float, default=None, help="seconds for all parts (500; smoke 1800)"
    )
    r.add_argument("--min-part-s", type=float, default=45.0, help="skip a part with less left")
    r.add_argument("--parts", default=None, help="comma-separated part names (a rerun)")
    c = sub.add_parser("child")
    c.add_argument("spec")
    c.add_argument("out")
    args = p.parse_args(argv)
    if args.command == "prepare":
        return prepare(args)
    if args.command == "child":
        return child(args.spec, args.out)
    if args.budget is None:  # smoke: the CPU machine's load, not the lease, sets its pace
        args.budget = 1800.0 if args.smoke else 500.0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

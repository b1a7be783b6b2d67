"""Benchmark: time and peak memory of lemur-convert (lemur/convert/cli.py) both ways, on a random
Hugging Face Llama of about --params parameters saved in bf16 safetensors shards.

Each conversion runs as its own child process, so its peak RSS is its own
(RUSAGE_CHILDREN). Also checks the round trip gives bit-identical tensors.

    python tools/bench_convert.py --params 246e6
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOOL = Path(__file__).resolve().parents[1] / "lemur" / "convert" / "cli.py"


def make_model(out: Path, params: float) -> int:
    """Save a random bf16 Llama (GQA) of about `params` parameters; return its size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d, vocab = 1024, 32000
    per_layer = 4 * d * d * 0.625 + 3 * d * 2816  # q,o full + k,v at 1/4 + SwiGLU
    layers = max(1, round((params - 2 * vocab * d) / per_layer))
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="100MB", safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


# Runs the converter in this child and reports the child's own peak RSS (RUSAGE_CHILDREN
# would give the largest of all children so far).
_RUN = (
    "import resource, runpy, sys; sys.argv = sys.argv[1:]\n"
    "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
    "except SystemExit as e:\n    assert not e.code, e.code\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)"
)


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of the converter run as `cmd` (tool path first)."""
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", _RUN, *cmd],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    return wall, int(res.stderr.strip().splitlines()[-1]) / 1e6


def main() -> int:
    """Convert HF -> lemur -> HF and print a markdown table."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--params", type=float, default=246e6)
    args = ap.parse_args()
    import torch
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        n = make_model(tmp / "hf", args.params)
        size = sum(p.stat().st_size for p in (tmp / "hf").glob("*.safetensors")) / 1e6
        wall1, rss1 = timed([str(TOOL), "to-lemur", str(tmp / "hf"), str(tmp / "lemur")])
        wall2, rss2 = timed(
            [str(TOOL), "to-hf", str(tmp / "lemur"), str(tmp / "back"), "--shard-gb", "0.1"]
        )
        a, b = {}, {}
        for p in (tmp / "hf").glob("*.safetensors"):
            a.update(load_file(str(p)))
        for p in (tmp / "back").glob("*.safetensors"):
            b.update(load_file(str(p)))
        same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(f"{n:,} params, bf16 HF checkpoint {size:.0f} MB\n")
    print("| conversion | wall s | peak RSS GB |\n|---|---|---|")
    print(f"| to-lemur (fp32) | {wall1:.0f} | {rss1:.2f} |")
    print(f"| to-hf (bf16, 100 MB shards) | {wall2:.0f} | {rss2:.2f} |")
    print(f"\nround trip bit-identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

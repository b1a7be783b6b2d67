"""Convert Hugging Face Llama checkpoints to lemur checkpoints (orbax) and back.

    lemur-convert to-lemur HF_DIR OUT_DIR [--dtype float32]
    lemur-convert to-hf LEMUR_DIR OUT_DIR [--dtype bfloat16] [--shard-gb 5]

HF_DIR holds config.json and model.safetensors or sharded model-*.safetensors with
model.safetensors.index.json (what `save_pretrained` and the Hub give). Tensors stream
one at a time: to-lemur holds the lemur params plus one HF tensor, to-hf the lemur params
plus one output shard, never two full copies of the model. No torch needed.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence

import numpy as np

from lemur.model import checkpoint, hf
from lemur.model.config import DTYPES, param_count


def to_lemur(hf_dir: str, out_dir: str, dtype: str = "float32") -> None:
    """HF directory -> lemur checkpoint directory, tensor by tensor."""
    start = time.time()
    with hf.open_hf_checkpoint(hf_dir) as (hf_config, get_tensor):
        config = hf.config_from_hf(hf_config)
        print(f"{hf_dir}: {param_count(config):,} params, {config}", flush=True)
        names = hf.hf_names(config)

        counter = itertools.count(1)

        def logged(name: str) -> np.ndarray:
            done = next(counter)
            if done % 50 == 0 or done == len(names):
                print(
                    f"  read {done}/{len(names)} tensors ({time.time() - start:.0f}s)", flush=True
                )
            return get_tensor(name)

        params = hf.params_from_hf(logged, config, dtype)
    checkpoint.save_params(out_dir, params, config)
    print(f"wrote {out_dir} ({dtype}) in {time.time() - start:.0f}s", flush=True)


def to_hf(lemur_dir: str, out_dir: str, dtype: str = "bfloat16", shard_gb: float = 5.0) -> None:
    """lemur checkpoint directory -> HF directory (safetensors shards + index + config)."""
    start = time.time()
    params, config = checkpoint.load_params(lemur_dir)
    print(f"{lemur_dir}: {param_count(config):,} params ({time.time() - start:.0f}s)", flush=True)
    files = hf.write_hf_checkpoint(
        out_dir,
        config,
        hf.params_to_hf(params, config, dtype),
        dtype=dtype,
        max_shard_bytes=int(shard_gb * 2**30),
    )
    print(
        f"wrote {len(files)} safetensors file(s) to {out_dir} ({dtype}) "
        f"in {time.time() - start:.0f}s",
        flush=True,
    )


def parser() -> argparse.ArgumentParser:
    """The `lemur-convert` argument parser (also used to check the command lines in docs)."""
    p = argparse.ArgumentParser(prog="lemur-convert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-lemur", help="HF safetensors -> lemur (orbax)")
    a.add_argument("src")
    a.add_argument("dst")
    a.add_argument(
        "--dtype",
        default="float32",
        choices=sorted(DTYPES),
        help="stored param dtype (the trainer keeps fp32 master weights)",
    )
    b = sub.add_parser("to-hf", help="lemur (orbax) -> HF safetensors")
    b.add_argument("src")
    b.add_argument("dst")
    b.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    b.add_argument("--shard-gb", type=float, default=5.0, help="max safetensors file size")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        if args.command == "to-lemur":
            to_lemur(args.src, args.dst, args.dtype)
        else:
            to_hf(args.src, args.dst, args.dtype, args.shard_gb)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert Hugging Face Llama/Qwen2/Mistral checkpoints to lemur checkpoints (orbax) and back.

    lemur-convert to-lemur HF_DIR OUT_DIR [--dtype float32]
    lemur-convert to-hf LEMUR_DIR OUT_DIR [--dtype bfloat16] [--shard-gb 5] [--tokenizer PATH]
    lemur-convert from-run RUN_DIR OUT_DIR [--step N]

HF_DIR holds config.json and model.safetensors or sharded model-*.safetensors with
model.safetensors.index.json (what `save_pretrained` and the Hub give). Tensors stream
one at a time: to-lemur holds the lemur params plus one HF tensor, to-hf the lemur params
plus one output shard, never two full copies of the model. No torch needed.

A lemur checkpoint carries the SentencePiece model (`tokenizer.model`) when there is one:
to-lemur copies it from HF_DIR, from-run takes the run's data tokenizer, and to-hf writes
it as HF tokenizer files (lemur.model.hf_tokenizer: a ChatML tokenizer gets its chat
template). It also carries HF_DIR's own tokenizer files unchanged (tokenizer.json, its
config and chat template; lemur.model.pretrained), which to-hf copies back out instead:
from-run keeps those of the run's `model.init_from` when the run's data was built with
that very tokenizer. from-run turns a lemur-train run's checkpoint (its params only) into a lemur
checkpoint, e.g. to fine-tune from it (`model.init_from`) or to export it.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lemur.model import checkpoint, hf, hf_tokenizer, pretrained
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
    checkpoint.save_params(
        out_dir,
        params,
        config,
        checkpoint.tokenizer_path(hf_dir),
        hf_tokenizer=pretrained.tokenizer_files(hf_dir),
    )
    print(f"wrote {out_dir} ({dtype}) in {time.time() - start:.0f}s", flush=True)


def from_run(run_dir: str, out_dir: str, step: int | None = None) -> None:
    """A lemur-train run's latest (or `step`) checkpoint -> lemur checkpoint + tokenizer."""
    # lemur.eval reads runs (params only, no optimizer state) and depends on lemur.model;
    # imported here so that lemur.model keeps no import of it at module level.
    from lemur.eval.load import detect_kind, load_model

    start = time.time()
    if detect_kind(Path(run_dir)) not in ("run", "step"):
        raise ValueError(f"{run_dir}: not a lemur-train run directory or checkpoint step")
    # Absolute: orbax refuses relative checkpoint paths.
    loaded = load_model(Path(run_dir).resolve(), step=step, dtype=None)
    tokenizer = loaded.tokenizer.path if loaded.tokenizer is not None else None
    checkpoint.save_params(
        out_dir, loaded.params, loaded.config, tokenizer, hf_tokenizer=loaded.hf_tokenizer
    )
    print(
        f"wrote {out_dir}: {param_count(loaded.config):,} params"
        + (f", tokenizer {tokenizer}" if tokenizer else ", no tokenizer (data directory gone)")
        + f" in {time.time() - start:.0f}s",
        flush=True,
    )


def _tokenizer_to_export(lemur_dir: str, tokenizer: str | None, vocab_size: int) -> Path | None:
    """The tokenizer to export (given, else the checkpoint's), checked to fit the model."""
    path = Path(tokenizer) if tokenizer is not None else checkpoint.tokenizer_path(lemur_dir)
    if path is None:
        return None
    pieces = len(hf_tokenizer.read_model_proto(path).pieces)
    if pieces > vocab_size:
        raise ValueError(f"{path}: {pieces} tokenizer pieces, the model has {vocab_size} ids")
    return path


def to_hf(
    lemur_dir: str,
    out_dir: str,
    dtype: str = "bfloat16",
    shard_gb: float = 5.0,
    tokenizer: str | None = None,
) -> None:
    """lemur checkpoint -> HF directory (safetensors shards + index + config + tokenizer).

    The tokenizer: `tokenizer` (a SentencePiece model) when given, else the HF tokenizer
    files the checkpoint carries (copied unchanged), else its `tokenizer.model`.
    """
    start = time.time()
    config = checkpoint.load_config(lemur_dir)
    carried = pretrained.tokenizer_files(lemur_dir) if tokenizer is None else {}
    tok_path = None if carried else _tokenizer_to_export(lemur_dir, tokenizer, config.vocab_size)
    params, config = checkpoint.load_params(lemur_dir)
    print(f"{lemur_dir}: {param_count(config):,} params ({time.time() - start:.0f}s)", flush=True)
    files = hf.write_hf_checkpoint(
        out_dir,
        config,
        hf.params_to_hf(params, config, dtype),
        dtype=dtype,
        max_shard_bytes=int(shard_gb * 2**30),
        token_ids=pretrained.hf_token_ids(carried),
    )
    for name, src in carried.items():
        shutil.copyfile(src, Path(out_dir) / name)
    if tok_path is not None:
        hf_tokenizer.write_hf_tokenizer(tok_path, out_dir, model_max_length=config.max_seq_len)
    said = (
        f" and its tokenizer files ({', '.join(carried)})"
        if carried
        else f" and the tokenizer of {tok_path}"
        if tok_path is not None
        else ", no tokenizer"
    )
    print(
        f"wrote {len(files)} safetensors file(s) to {out_dir} ({dtype}){said} "
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
    b.add_argument(
        "--tokenizer",
        default=None,
        help="SentencePiece model to export (default: the HF tokenizer files the checkpoint "
        "carries, unchanged, else its tokenizer.model)",
    )
    c = sub.add_parser("from-run", help="lemur-train run checkpoint -> lemur (orbax)")
    c.add_argument("src", help="a run directory, or one checkpoint step of it")
    c.add_argument("dst")
    c.add_argument("--step", type=int, default=None, help="default: the latest checkpoint")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        if args.command == "to-lemur":
            to_lemur(args.src, args.dst, args.dtype)
        elif args.command == "from-run":
            from_run(args.src, args.dst, args.step)
        else:
            to_hf(args.src, args.dst, args.dtype, args.shard_gb, args.tokenizer)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Convert Hugging Face Llama/Qwen2/Mistral checkpoints to lemur checkpoints (orbax) and back.

    lemur-convert to-lemur HF_DIR OUT_DIR [--dtype float32]
    lemur-convert to-hf LEMUR_DIR OUT_DIR [--dtype bfloat16] [--shard-gb 5] [--tokenizer PATH]
    lemur-convert from-run RUN_DIR OUT_DIR [--step N] [--tokenizer PATH]

HF_DIR holds config.json and model.safetensors or sharded model-*.safetensors with
model.safetensors.index.json (what `save_pretrained` and the Hub give). Tensors stream
one at a time: to-lemur holds the lemur params plus one HF tensor, to-hf the lemur params
plus one output shard, never two full copies of the model. No torch needed.

A lemur checkpoint carries the SentencePiece model (`tokenizer.model`) when there is one:
to-lemur copies it from HF_DIR, from-run takes the run's data tokenizer, and to-hf writes
it as HF tokenizer files (lemur.tokenizer.hf_writer: a ChatML tokenizer gets its chat
template). It also carries HF_DIR's own tokenizer files unchanged (tokenizer.json, its
config and chat template; lemur.model.pretrained), which to-hf copies back out instead:
from-run keeps those of the run's `model.init_from` when the run's data was built with
that very tokenizer. from-run turns a lemur-train run's checkpoint (its params only) into a lemur
checkpoint, e.g. to fine-tune from it (`model.init_from`) or to export it.

OUT_DIR is written whole or not at all (lemur.model.export_dir): each command refuses a
non-empty OUT_DIR unless given --force, which replaces it once the new export is complete.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lemur.cli_common import add_debug_option, debug_wanted, run_main, writing
from lemur.model import checkpoint, export_dir, hf, pretrained
from lemur.model.config import DTYPES, param_count
from lemur.tokenizer import hf_writer

# What each command reads, and the command that reads each other kind of folder.
WANTS = {"to-lemur": "hf", "to-hf": "lemur", "from-run": "run"}
KIND_NAMES = {
    "hf": "a Hugging Face folder (config.json + safetensors)",
    "lemur": "a lemur checkpoint (config.json + params/)",
    "run": "a lemur-train run directory (or one checkpoint step of it)",
}
READS = {"hf": "to-lemur", "lemur": "to-hf", "run": "from-run"}


def check_source(command: str, src: str) -> None:
    """Refuse a source that `command` does not read, naming the command that reads it."""
    path = Path(src).expanduser()
    if not path.is_dir():
        raise ValueError(f"{src}: no such directory")
    kind = pretrained.folder_kind(path)
    kind = "run" if kind == "step" else kind
    want = WANTS[command]
    if kind == want or (kind is None and want == "hf"):
        return  # an HF folder's reader names what is missing (e.g. only .bin weights)
    if kind is None:
        raise ValueError(f"{src}: not {KIND_NAMES[want]}")
    then = " (then to-hf its output)" if command == "to-hf" and kind == "run" else ""
    raise ValueError(
        f"{src}: {KIND_NAMES[kind]}, not {KIND_NAMES[want]}; use "
        f"`lemur-convert {READS[kind]}`{then}"
    )


def to_lemur(hf_dir: str, out_dir: str, dtype: str = "float32", force: bool = False) -> None:
    """HF directory -> lemur checkpoint directory, tensor by tensor."""
    start = time.time()
    check_source("to-lemur", hf_dir)
    with export_dir.replacing(out_dir, force, (Path(hf_dir),)) as partial:
        with hf.open_hf_checkpoint(hf_dir) as (hf_config, get_tensor):
            config = hf.config_from_hf(hf_config)
            print(f"{hf_dir}: {param_count(config):,} params, {config}", flush=True)
            names = hf.hf_names(config)
            counter = itertools.count(1)

            def logged(name: str) -> np.ndarray:
                done = next(counter)
                if done % 50 == 0 or done == len(names):
                    print(
                        f"  read {done}/{len(names)} tensors ({time.time() - start:.0f}s)",
                        flush=True,
                    )
                return get_tensor(name)

            params = hf.params_from_hf(logged, config, dtype)
        checkpoint.save_params(
            partial,
            params,
            config,
            checkpoint.tokenizer_path(hf_dir),
            hf_tokenizer=pretrained.tokenizer_files(hf_dir),
            hf_token_ids=hf.token_ids_from_hf(hf_config),
        )
    print(f"wrote {out_dir} ({dtype}) in {time.time() - start:.0f}s", flush=True)


def from_run(
    run_dir: str,
    out_dir: str,
    step: int | None = None,
    tokenizer: str | None = None,
    force: bool = False,
) -> None:
    """A lemur-train run's latest (or `step`) checkpoint -> lemur checkpoint + tokenizer.

    The tokenizer is the run's (its first data directory's), else `tokenizer`; a run whose
    tokenizer is gone and none given is refused: the checkpoint would be unusable alone.
    """
    from lemur.eval.load import load_model

    start = time.time()
    check_source("from-run", run_dir)
    with export_dir.replacing(out_dir, force, (Path(run_dir),)) as partial:
        # Absolute: orbax refuses relative checkpoint paths.
        loaded = load_model(Path(run_dir).resolve(), step=step, tokenizer=tokenizer, dtype=None)
        if loaded.tokenizer is None:
            raise ValueError(
                f"{run_dir}: no tokenizer found ({loaded.tokenizer_problem}); give "
                "--tokenizer PATH (the run's tokenizer.model, or a shard directory holding it)"
            )
        tok, files = _run_tokenizer_files(loaded)
        ids = pretrained.source_token_ids(files) or None  # those of the run's init_from
        checkpoint.save_params(
            partial, loaded.params, loaded.config, tok, hf_tokenizer=files, hf_token_ids=ids
        )
        tok = tok or files.get("tokenizer.json")
    print(
        f"wrote {out_dir}: {param_count(loaded.config):,} params, tokenizer {tok} "
        f"in {time.time() - start:.0f}s",
        flush=True,
    )


def _run_tokenizer_files(loaded: Any) -> tuple[Path | None, dict[str, Path]]:
    """(SentencePiece model, HF tokenizer files) a run's checkpoint carries.

    A run built with a tokenizer.json carries it with the config files beside it in the
    shard directory (or its `init_from` folder's, when they are the same tokenizer).
    """
    tok = loaded.tokenizer
    if getattr(tok, "kind", "sentencepiece") != "tokenizer.json":
        return tok.path, loaded.hf_tokenizer
    if loaded.hf_tokenizer:
        return None, loaded.hf_tokenizer
    folder = tok.files.path.parent
    names = ("tokenizer.json", *pretrained.HF_TOKENIZER_FILES)
    return None, {n: folder / n for n in dict.fromkeys(names) if (folder / n).is_file()}


def _tokenizer_to_export(lemur_dir: str, tokenizer: str | None, vocab_size: int) -> Path | None:
    """The tokenizer to export (given, else the checkpoint's), checked to fit the model."""
    path = Path(tokenizer) if tokenizer is not None else checkpoint.tokenizer_path(lemur_dir)
    if path is None:
        return None
    pieces = len(hf_writer.read_model_proto(path).pieces)
    if pieces > vocab_size:
        raise ValueError(f"{path}: {pieces} tokenizer pieces, the model has {vocab_size} ids")
    return path


def to_hf(
    lemur_dir: str,
    out_dir: str,
    dtype: str = "bfloat16",
    shard_gb: float = 5.0,
    tokenizer: str | None = None,
    force: bool = False,
) -> None:
    """lemur checkpoint -> HF directory (safetensors shards + index + config + tokenizer).

    The tokenizer: `tokenizer` (a SentencePiece model) when given, else the HF tokenizer
    files the checkpoint carries (copied unchanged), else its `tokenizer.model`.
    """
    start = time.time()
    check_source("to-hf", lemur_dir)
    config = checkpoint.load_checkpoint_config(lemur_dir)
    carried = pretrained.tokenizer_files(lemur_dir) if tokenizer is None else {}
    # The source config.json's ids (a Qwen2's null bos) over generation_config.json's; a
    # tokenizer given here is another tokenizer: its ids are the SentencePiece defaults.
    token_ids = (
        {**pretrained.hf_token_ids(carried), **checkpoint.load_hf_token_ids(lemur_dir)}
        if tokenizer is None
        else {}
    )
    tok_path = None if carried else _tokenizer_to_export(lemur_dir, tokenizer, config.vocab_size)
    sources = (Path(lemur_dir),) + ((tok_path,) if tok_path is not None else ())
    with export_dir.replacing(out_dir, force, sources) as partial:
        params, config = checkpoint.load_params(lemur_dir)
        print(
            f"{lemur_dir}: {param_count(config):,} params ({time.time() - start:.0f}s)",
            flush=True,
        )
        files = hf.write_hf_checkpoint(
            partial,
            config,
            hf.params_to_hf(params, config, dtype),
            dtype=dtype,
            max_shard_bytes=int(shard_gb * 2**30),
            token_ids=token_ids,
        )
        for name, src in carried.items():
            shutil.copyfile(src, Path(partial) / name)
        if tok_path is not None:
            hf_writer.write_hf_tokenizer(tok_path, partial, model_max_length=config.max_seq_len)
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
    c.add_argument(
        "--tokenizer",
        default=None,
        help="SentencePiece model (or a shard directory holding it) when the run's data "
        "directory is gone; checked against the hash the run recorded",
    )
    for command in (a, b, c):
        command.add_argument(
            "--force",
            action="store_true",
            help="replace a non-empty DST (whole, once the new export is complete)",
        )
    for q in (p, a, b, c):
        add_debug_option(q)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code (a partial output is removed)."""
    from lemur import process_setup

    process_setup.install("lemur-convert")  # every process-wide change: see lemur.process_setup
    args = parser().parse_args(argv)
    # What a source or a destination cannot give (unsupported configs, missing tensors) is a
    # ValueError or KeyError of the model modules: one line, exit 2.
    mistakes = (ValueError, KeyError)
    return run_main(lambda: _convert(args), "lemur-convert", mistakes, debug=debug_wanted(args))


def _convert(args: argparse.Namespace) -> None:
    """Run the command of `args`."""
    with writing(args.dst):  # what the checks could not foresee (a full disk, permissions)
        if args.command == "to-lemur":
            to_lemur(args.src, args.dst, args.dtype, args.force)
        elif args.command == "from-run":
            from_run(args.src, args.dst, args.step, args.tokenizer, args.force)
        else:
            to_hf(args.src, args.dst, args.dtype, args.shard_gb, args.tokenizer, args.force)


if __name__ == "__main__":
    sys.exit(main())

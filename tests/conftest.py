"""Shared fixtures: small real corpora built at test time from files on this machine."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import sentencepiece as spm

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The dev extra installs libtpu (for `lemur-train plan`): without this every JAX process of
# the suite would first try a TPU backend, warn on stderr and start seconds later.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.pop("LEMUR_DEBUG", None)  # the tests expect one-line errors, not tracebacks
# A suite started as a background job of a script (`make test &`, `nohup ... &`) inherits
# SIGINT ignored, and so would every process a test starts: the tests of Ctrl-C handling
# (exit 130, cancelled Slurm jobs, restored handlers) need Python's own SIGINT handler.
signal.signal(signal.SIGINT, signal.default_int_handler)

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def real_python_files(n: int) -> list[Path]:
    """The first `n` UTF-8 stdlib modules (sorted by name), as real code."""
    out = []
    for p in sorted(STDLIB.glob("*.py")):
        try:
            p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out.append(p)
        if len(out) == n:
            break
    return out


def real_text_docs(n: int) -> list[dict[str, str]]:
    """`n` real English documents: Python's pydoc help topics."""
    from pydoc_data.topics import topics

    return [{"id": name, "text": topics[name]} for name in sorted(topics)[:n]]


def train_sentencepiece(folder: Path, **options) -> Path:
    """A small SentencePiece model (800 pieces, byte fallback unless `options` say) trained
    here on stdlib code and help text with `options`; its path."""
    corpus = folder / "corpus.txt"
    texts = [p.read_text() for p in real_python_files(20)] + [d["text"] for d in real_text_docs(40)]
    corpus.write_text("\n".join(texts))
    prefix = folder / "m"
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=800,
        minloglevel=2,
        num_threads=1,  # the same model on every run
        **{"byte_fallback": True, **options},
    )
    return prefix.with_suffix(".model")


def write_jsonl(path: Path, rows: list, compress: str | None = None) -> Path:
    """Write rows as JSON lines (a str row as it is), optionally gzip- or zstd-compressed."""
    data = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


NO_FILTERS = {
    "code": {"enabled": False},
    "text": {
        k: {"enabled": False} for k in ("gopher_quality", "gopher_repetition", "c4", "fineweb")
    },
}


def base_recipe(tmp: Path, code_dir: Path, text_files: list[Path], **overrides) -> dict:
    """A small two-domain recipe over the given real code directory and text files."""
    recipe = {
        "output": str(tmp / "out"),
        "seed": 7,
        "seq_len": 128,
        "tokenizer": {"train": {"vocab_size": 600, "sample_bytes": 400_000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "executor": {"kind": "local", "tasks": 2, "workers": 1},
        "val_fraction": 0.05,
        "shard_tokens": 50_000,
        "sources": [
            {
                "name": "py",
                "domain": "code",
                "format": "files",
                "paths": [str(code_dir)],
                "include": ["*.py"],
                "language": "Python",
            },
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(p) for p in text_files],
                "language": "en",
            },
        ],
    }
    recipe.update(overrides)
    return recipe


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    """A directory with 40 real stdlib modules and real text in plain, gz and zst JSONL."""
    root = tmp_path_factory.mktemp("corpus")
    code = root / "code"
    code.mkdir()
    for p in real_python_files(40):
        (code / p.name).write_bytes(p.read_bytes())
    docs = real_text_docs(60)
    write_jsonl(root / "a.jsonl", docs[:20])
    write_jsonl(root / "b.jsonl.gz", docs[20:40], "gz")
    write_jsonl(root / "c.jsonl.zst", docs[40:], "zst")
    return root


@pytest.fixture(scope="session")
def tokenizer_model(tmp_path_factory) -> Path:
    """A small SentencePiece model trained with lemur's settings on real code and text."""
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig

    texts = [p.read_text() for p in real_python_files(30)] + [d["text"] for d in real_text_docs(40)]
    out = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return train_tokenizer(texts, TokenizerTrainConfig(vocab_size=800), out)


@pytest.fixture(scope="session")
def llama2_tokenizer() -> Path:
    """A real 32k SentencePiece BPE with Llama-2's conventions (`<unk>` 0, `<s>` 1, `</s>` 2,
    dummy prefix, byte fallback): `tokenizer.model.v1` of the mistral-common wheel, read
    where the wheel installed it (never committed)."""
    mistral_common = pytest.importorskip("mistral_common")
    path = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    assert path.is_file(), f"{path}: the mistral-common wheel no longer ships it"
    return path


@pytest.fixture(scope="module")
def slurm():
    """The local Slurm's partition, and a job name; cancels the name's jobs at the end.
    Skips, saying why, where no Slurm runs here (`.ci/slurm-up` starts one, as root)."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    from localcluster import slurm_partition, slurm_problem

    problem = slurm_problem()
    if problem:
        pytest.skip(problem)
    name = f"lemur-test-{os.getpid()}"
    try:
        yield slurm_partition(), name
    finally:
        subprocess.run(["scancel", "--name", name], capture_output=True, timeout=60)


def slurm_executor(partition: str, name: str) -> dict:
    """2 array tasks of 1 CPU and 512 MB (`mem_per_cpu_gb: 0.5` used to become 0G)."""
    return {
        "kind": "slurm",
        "tasks": 2,
        "workers": 2,
        "partition": partition,
        "time": "00:10:00",
        "mem_per_cpu_gb": 0.5,
        "job_name": name,
    }

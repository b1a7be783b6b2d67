"""Trainer start-up opens each shard directory once: one `manifest.json` read per data
directory, and the tokenizer copy hashed at most once per directory, however many readers
(data_vocab, the loader's checks and sources, the eval checks and streams, the bpb
table) use it."""

from __future__ import annotations

import builtins
import io
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_train_loop import build_corpus, compile_cache, tiny_config


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two shard directories of the same tokenizer (a mixture), the second a copy."""
    first = build_corpus(tmp_path_factory.mktemp("startup"))
    second = first.parent / "copy"
    shutil.copytree(first, second)
    return first, second


def count_opens(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every manifest or tokenizer copy Python opens from now on (resolved paths)."""
    opened: list[Path] = []
    real_open = io.open

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, str | os.PathLike):
            path = Path(file)
            if path.name in ("manifest.json", "tokenizer.model"):
                opened.append(path.resolve())
        return real_open(file, *args, **kwargs)

    # Path.read_text goes through io.open, a bare open() through builtins.open.
    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    return opened


def per_directory(paths: list[Path], dirs: list[Path], name: str) -> dict[str, int]:
    """How many of `paths` named `name` lie inside each of `dirs` (the tokenizer copy
    sits in the build's subdirectory)."""
    return {
        d.name: sum(p.name == name and p.is_relative_to(d.resolve()) for p in paths) for d in dirs
    }


def test_start_up_reads_each_manifest_once_and_hashes_the_tokenizer_once(
    corpora: tuple[Path, Path],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lemur.shards import check
    from lemur.train.loop import Trainer

    first, second = corpora
    # Train on both; eval on the first and the second again: every reader of a directory.
    config = tiny_config(
        first,
        tmp_path / "run",
        f"data.dirs=[{first}, {second}]",
        f"data.eval_dirs=[{first}, {second}]",
        cache=compile_cache(tmp_path_factory),
    )
    hashed: list[Path] = []
    real_hash = check.sha256_file

    def counting_hash(path: str | os.PathLike, *args: int) -> str:
        hashed.append(Path(path).resolve())
        return real_hash(path, *args)

    monkeypatch.setattr(check, "sha256_file", counting_hash)
    opened = count_opens(monkeypatch)
    trainer = Trainer(config)
    monkeypatch.undo()
    assert set(trainer.evals) == {"code", "text", f"code@{second.name}", f"text@{second.name}"}
    once = {first.name: 1, second.name: 1}
    assert per_directory(opened, [first, second], "manifest.json") == once
    assert per_directory(hashed, [first, second], "tokenizer.model") == once
    # The hash is the only Python read of the tokenizer copy (SentencePiece reads it in C++).
    assert per_directory(opened, [first, second], "tokenizer.model") == once

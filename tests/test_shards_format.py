"""lemur.shards.format: a directory written with its writer and manifest functions alone (what
the bench tools synthesize) is a shard directory that reads back and verifies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lemur.shards.format import (
    FORMAT,
    MANIFEST,
    ShardWriter,
    make_manifest,
    open_index,
    open_tokens,
    read_manifest,
    sha256_file,
    token_dtype,
    tokenizer_entry,
    write_manifest,
)
from lemur.shards.verify import verify


def test_writer_and_manifest_make_a_directory_that_verifies(tmp_path: Path) -> None:
    dtype = token_dtype(1000)
    (tmp_path / "tokenizer.model").write_bytes(b"a tokenizer")
    writer = ShardWriter(tmp_path, "train", "train", "mixed", dtype, 15)
    docs = [np.array([1, *range(3, 3 + n), 2], dtype) for n in (4, 7, 2, 9)]
    for doc in docs:
        writer.add(doc)
    tokenizer = tokenizer_entry(tmp_path, "tokenizer.model", 1000, bos_id=1, eos_id=2)
    sections = {"mix": {"tokens": {"code": 30}}, "counts": {}}  # a build's; verify sums mix
    manifest = make_manifest(dtype, 8, tokenizer, writer.close(), **sections)
    path = write_manifest(tmp_path, manifest)

    assert path == tmp_path / MANIFEST
    assert json.loads(path.read_text()) == manifest  # what was made is what was written
    assert tokenizer == {
        "file": "tokenizer.model",
        "sha256": sha256_file(tmp_path / "tokenizer.model"),
        "vocab_size": 1000,
        "bos_id": 1,
        "eos_id": 2,
    }
    read = read_manifest(tmp_path)
    assert (read["format"], read["dtype"], read["seq_len"]) == (FORMAT, "uint16", 8)
    assert [s["documents"] for s in read["shards"]] == [2, 2]  # never split, <= 15 tokens each
    assert verify(tmp_path) == []
    tokens = np.concatenate([open_tokens(tmp_path, s, read["dtype"]) for s in read["shards"]])
    assert tokens.tolist() == np.concatenate(docs).tolist()
    assert open_index(tmp_path, read["shards"][1]).tolist() == [4, 15]

"""A shard directory framed without BOS (Qwen2.5's `doc <|endoftext|>`): `lemur-data stats`,
`lemur-data verify` and the loader's segment ids, positions and loss mask."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import qwen_like_folder
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl
from test_train_data import assert_record, reference

from lemur.data import cli as data_cli
from lemur.data.build import build
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.format import open_index, open_tokens
from lemur.shards.windows import ShardSource


@pytest.fixture(scope="module")
def no_bos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """(shard directory, its input texts): real code files, real help topics and 1,500 short
    documents (single lines of code), built with a Qwen2.5-like tokenizer.json (no BOS)."""
    root = tmp_path_factory.mktemp("no_bos")
    code = root / "code"
    code.mkdir()
    texts = []
    for p in real_python_files(8):
        (code / p.name).write_bytes(p.read_bytes())
        texts.append(p.read_text(encoding="utf-8"))
    help_topics = real_text_docs(10)
    lines = [s for p in real_python_files(8) for s in p.read_text().splitlines() if s.strip()]
    write_jsonl(root / "text.jsonl", help_topics + [{"text": s} for s in lines[:1500]])
    folder = qwen_like_folder(root / "qwen", texts + [d["text"] for d in help_topics])
    recipe = {
        "output": str(root / "out"),
        "seed": 5,
        "seq_len": 64,
        "tokenizer": {"hf": str(folder)},
        "filters": NO_FILTERS,
        "pii": {"enabled": False},
        "dedup": {"exact": False, "near": False},
        "val_fraction": 0.1,
        "shard_tokens": 20_000,
        "mix": {"ratio": {"code": 1, "text": 3}},
        "executor": {"kind": "local", "tasks": 1, "workers": 1},
        "sources": [
            {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
            {
                "name": "txt",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(root / "text.jsonl")],
            },
        ],
    }
    build(recipe_from_dict(recipe))
    return root / "out", texts + [d["text"] for d in help_topics] + lines[:1500]


def test_stats_and_verify_on_a_no_bos_directory(no_bos, tmp_path, capsys) -> None:
    out, _ = no_bos
    manifest = json.loads((out / "manifest.json").read_text())
    eos = manifest["tokenizer"]["eos_id"]
    assert manifest["tokenizer"]["bos_id"] is None
    assert data_cli.main(["verify", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"{out}: OK"

    assert data_cli.main(["stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tokenizer"]["bos_id"] is None and stats["tokenizer"]["eos_id"] == eos
    for key in ("documents", "tokens"):
        assert sum(v[key] for v in stats["splits"].values()) == sum(
            s[key] for s in manifest["shards"]
        )
    assert data_cli.main(["stats", str(out)]) == 0
    # rich may wrap the title at any space (a long tmp path): compare with spaces collapsed.
    assert f"doc + EOS {eos} (no BOS)" in " ".join(capsys.readouterr().out.split())

    # A document that does not end with EOS is found (its shard's checksum made right).
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    shard = next(s for s in manifest["shards"] if s["documents"] > 3)
    tokens = np.fromfile(broken / shard["file"], dtype="<u2")
    ends = np.fromfile(broken / shard["index"], dtype="<u8")
    tokens[int(ends[2]) - 1] = tokens[int(ends[2]) - 2]
    tokens.tofile(broken / shard["file"])
    shard["sha256"] = hashlib.sha256((broken / shard["file"]).read_bytes()).hexdigest()
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert data_cli.main(["verify", str(broken)]) == 1
    err = capsys.readouterr().err
    assert f"{broken / shard['index']}: a document does not end with EOS (id {eos})" in err


@pytest.mark.parametrize("seq_len", [64, 512])
def test_no_bos_windows_start_each_document_at_its_first_text_token(no_bos, seq_len) -> None:
    out, _ = no_bos
    source = ShardSource(out, seq_len)
    eos = source.tokenizer["eos_id"]
    starts_seen, crowded = 0, 0
    for i in range(len(source)):
        shard, start = source.locate(i)
        tokens = open_tokens(out, source.shards[shard], source.dtype.name)
        ends = np.asarray(open_index(out, source.shards[shard]), np.int64)
        record = source[i]
        assert_record(record, reference(tokens, ends, start, seq_len))
        # Where a document starts inside the window: segment + 1, position 0, its first
        # text token as the input (no BOS before it), the EOS ending the previous document
        # just before, in the previous segment; that first token is no target (nothing of
        # its own document comes before it).
        seg, pos = record["segment_ids"], record["positions"]
        new = np.flatnonzero(np.diff(seg)) + 1
        assert np.all(seg[new] == seg[new - 1] + 1) and np.all(pos[new] == 0)
        assert np.all(record["inputs"][new - 1] == eos) and np.all(record["inputs"][new] != eos)
        assert np.all(record["loss_mask"][new - 1] == 0)
        assert record["loss_mask"].sum() == seq_len - np.count_nonzero(
            np.isin(start + 1 + np.arange(seq_len), ends)
        )
        starts_seen += len(new)
        crowded += len(new) >= 24  # the loader's vectorized path
    assert starts_seen > 100 and (crowded > 0 or seq_len < 512)


def test_the_format_md_reading_example_reads_a_no_bos_directory(no_bos, tmp_path) -> None:
    """docs/format.md's numpy + `tokenizers` reader gives back every document's text."""
    out, inputs = no_bos
    doc = (Path(__file__).resolve().parents[1] / "docs" / "format.md").read_text()
    block = doc.split("## Reading it with numpy")[1].split("```python\n")[1].split("```")[0]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "demo").symlink_to(out, target_is_directory=True)
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block, "docs/format.md", "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(cwd)
    manifest = json.loads((out / "manifest.json").read_text())
    texts = namespace["texts"]
    assert len(texts) == sum(s["documents"] for s in manifest["shards"])
    expected = {unicodedata.normalize("NFC", t) for t in inputs}  # the tokenizer's NFC
    assert [t for t in texts if t not in expected] == []

"""The re-chunked export formats read back by their own loaders (#48 items 1-3, 7).

`lemur-data export DIR --format litdata|mds|parquet` of a real two-domain build and of a
chat build; each export is read by the library its trainer reads it with (litdata's
`StreamingDataset` + `TokensLoader`, mosaicml-streaming's `StreamingDataset`, HF
`datasets.load_dataset("parquet")` and pyarrow), and every document's tokens (and loss
mask) must equal lemur's own shards, in order, over every shard and val domain. The
expected documents are read here from the manifest, not through the export's driver.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import base_recipe
from test_data_chat_build import chat_corpus, chat_recipe

from lemur.data import cli as data_cli
from lemur.export.formats import ShardPart
from lemur.shards.format import open_array, open_index, open_mask, open_tokens

# mosaicml-streaming's package __init__ imports `streaming.vision`, which needs torchvision;
# torchvision is kept out of the venv on purpose (its wheel fails to load beside our CPU
# torch: `operator torchvision::nms does not exist`). Nothing here reads images, so an empty
# module stands in for the vision package; every reader and encoding used below is
# streaming's own code, imported unchanged.
sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

Docs = dict[str, list[tuple[np.ndarray, np.ndarray | None]]]


def lemur_documents(directory: Path) -> Docs:
    """Each export folder ("train", "val/<domain>") -> its documents (tokens, mask), in the
    order the export promises: train shards as listed (the global shuffle), each val domain's
    shards as listed."""
    manifest = json.loads((directory / "manifest.json").read_text())
    docs: Docs = {}
    for shard in manifest["shards"]:
        folder = "train" if shard["split"] == "train" else f"val/{shard['domain']}"
        tokens = open_tokens(directory, shard, manifest["dtype"])
        ends, mask = open_index(directory, shard).tolist(), open_mask(directory, shard)
        for start, end in zip([0, *ends[:-1]], ends, strict=True):
            m = None if mask is None else np.asarray(mask[start:end])
            docs.setdefault(folder, []).append((np.asarray(tokens[start:end]), m))
    return docs


def export(source: Path, fmt: str, out: Path, *extra: str) -> None:
    """`lemur-data export SOURCE --format FMT --out OUT` through the command's main()."""
    assert data_cli.main(["export", str(source), "--format", fmt, "--out", str(out), *extra]) == 0


def tree_hashes(out: Path) -> dict[str, str]:
    """sha256 of every file under `out`, by relative path."""
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def demo(tmp_path_factory, corpus_dir) -> Path:
    """A real two-domain build (code and text, val domains apart) of several train shards."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("demo")
    texts = [corpus_dir / "a.jsonl", corpus_dir / "b.jsonl.gz"]
    recipe = base_recipe(tmp, corpus_dir / "code", texts, shard_tokens=20_000, val_fraction=0.1)
    manifest = build(recipe_from_dict(recipe))
    assert sum(s["split"] == "train" for s in manifest["shards"]) > 2
    assert {s["domain"] for s in manifest["shards"] if s["split"] == "val"} == {"code", "text"}
    return tmp / "out"


@pytest.fixture(scope="module")
def chat(tmp_path_factory, tokenizer_model) -> Path:
    """A chat build (loss masks beside the shards)."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("chat")
    paths, _ = chat_corpus(tmp / "data")
    recipe = chat_recipe(tmp, paths, {"model": str(tokenizer_model)}, shard_tokens=4096)
    manifest = build(recipe_from_dict(recipe))
    assert all("mask" in s for s in manifest["shards"])
    return tmp / "out"


# ---------------------------------------------------------------------------- litdata


def litdata_chunks(folder: Path) -> list[tuple[list[np.ndarray], np.ndarray]]:
    """Each chunk of a litdata folder, in index order: its documents (split at the offsets
    of the chunk header, litdata's `uint32 N, uint32[N+1]` layout) and its whole token body."""
    index = json.loads((folder / "index.json").read_text())
    code = int(index["config"]["data_format"][0].split(":")[1])
    dtype = {5: np.uint16, 6: np.uint32}[code]
    chunks = []
    for entry in index["chunks"]:
        raw = (folder / entry["filename"]).read_bytes()
        n = int(np.frombuffer(raw[:4], np.uint32)[0])
        offsets = np.frombuffer(raw[4 : 4 * (n + 2)], np.uint32).tolist()
        docs = [
            np.frombuffer(raw[a:b], dtype) for a, b in zip(offsets[:-1], offsets[1:], strict=True)
        ]
        assert n == entry["chunk_size"] and sum(map(len, docs)) == entry["dim"]
        chunks.append((docs, np.frombuffer(raw[offsets[0] :], dtype)))
    return chunks


def read_litdata(folder: Path, block: int) -> np.ndarray:
    """Every block litdata's StreamingDataset + TokensLoader yields, in order, concatenated
    (as litgpt reads it, without the shuffle)."""
    from litdata import StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    ds = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=block), shuffle=False)
    items = [np.asarray(ds[i]) for i in range(len(ds))]
    assert all(len(x) == block for x in items)
    return np.concatenate(items) if items else np.zeros(0, np.uint16)


def check_litdata(out: Path, expected: Docs) -> None:
    """Every folder's documents equal lemur's, and TokensLoader reads every token of each
    chunk but its last partial block, across document boundaries."""
    for folder, docs in expected.items():
        chunks = litdata_chunks(out / folder)
        got = [d for chunk_docs, _ in chunks for d in chunk_docs]
        assert len(got) == len(docs), folder
        for (tokens, _), doc in zip(docs, got, strict=True):
            np.testing.assert_array_equal(doc, tokens)
        everything = np.concatenate([t for t, _ in docs])
        np.testing.assert_array_equal(read_litdata(out / folder, 1), everything)
        block = 37  # no divisor of any chunk's length here: each chunk's tail is left
        tails = [body[: len(body) // block * block] for _, body in chunks]
        np.testing.assert_array_equal(read_litdata(out / folder, block), np.concatenate(tails))


def test_litdata_export_read_by_litdata(demo, tmp_path):
    out = tmp_path / "litdata"
    export(demo, "litdata", out)
    expected = lemur_documents(demo)
    assert set(expected) == {"train", "val/code", "val/text"}
    check_litdata(out, expected)
    index = json.loads((out / "train" / "index.json").read_text())
    assert index["config"]["item_loader"] == "TokensLoader" and "updated_at" not in index
    before = tree_hashes(out)
    export(demo, "litdata", out, "--force")
    assert tree_hashes(out) == before


def test_litdata_chunks_capped_in_bytes(demo, tmp_path):
    """Shards cut into many small chunks (whole documents each) read back the same."""
    from lemur.export.litdata import LitdataExporter
    from lemur.export.run import export_info, shard_parts

    manifest = json.loads((demo / "manifest.json").read_text())
    parts = shard_parts(demo, manifest, "all")
    info = export_info(demo, tmp_path / "out", manifest, parts)
    fmt = LitdataExporter(chunk_bytes=3000)
    for part in parts:
        fmt.write_part(part, info, tmp_path / "out")
    fmt.finish(parts, info, tmp_path / "out")
    chunks = litdata_chunks(tmp_path / "out" / "train")
    assert len(chunks) > 3 * len(info.train_stems)
    assert all(
        len(body) * 2 + 4 * (len(docs) + 2) <= 3000 for docs, body in chunks if len(docs) > 1
    )
    check_litdata(tmp_path / "out", lemur_documents(demo))


def test_litdata_refuses_a_chat_build(chat, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        data_cli.main(["export", str(chat), "--format", "litdata", "--out", str(tmp_path / "o")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "loss masks" in err[0]
    for carrying in ("nanotron", "olmo", "mds", "parquet"):
        assert carrying in err[0]
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- MDS


def check_mds(out: Path, expected: Docs) -> None:
    """mosaicml-streaming's StreamingDataset reads every document (and mask) of each folder."""
    from streaming import StreamingDataset

    for folder, docs in expected.items():
        ds = StreamingDataset(local=str(out / folder), shuffle=False, batch_size=1)
        assert ds.num_samples == len(docs), folder
        for i, (tokens, mask) in enumerate(docs):
            sample = ds[i]
            # `tokens`: the column LLM Foundry's StreamingTextDataset reads
            assert sample["tokens"].dtype == tokens.dtype
            np.testing.assert_array_equal(sample["tokens"], tokens)
            if mask is None:
                assert "loss_mask" not in sample
            else:
                np.testing.assert_array_equal(sample["loss_mask"], mask)


@pytest.mark.parametrize("build", ["demo", "chat"])
def test_mds_export_read_by_streaming(build, request, tmp_path):
    source = request.getfixturevalue(build)
    out = tmp_path / "mds"
    export(source, "mds", out)
    check_mds(out, lemur_documents(source))
    before = tree_hashes(out)
    export(source, "mds", out, "--force")
    assert tree_hashes(out) == before
    assert "max_seq_len" in (out / "TRAINING.md").read_text()


@pytest.mark.parametrize("build", ["demo", "chat"])
def test_mds_shards_are_mdswriters_bytes(build, request, tmp_path):
    """Under a small size limit, each lemur shard's MDS shards are byte for byte those of
    streaming's own MDSWriter fed the same documents, and the whole export still reads."""
    from streaming import MDSWriter

    from lemur.export.mds import MdsExporter
    from lemur.export.run import export_info, shard_parts

    source = request.getfixturevalue(build)
    manifest = json.loads((source / "manifest.json").read_text())
    parts = shard_parts(source, manifest, "all")
    info = export_info(source, tmp_path / "out", manifest, parts)
    fmt = MdsExporter(size_limit=5000)
    for part in parts:
        fmt.write_part(part, info, tmp_path / "out")
    fmt.finish(parts, info, tmp_path / "out")
    check_mds(tmp_path / "out", lemur_documents(source))
    part: ShardPart = parts[0]
    assert part.split == "train"
    columns = fmt.shard_config(info)
    columns = dict(zip(columns["column_names"], columns["column_encodings"], strict=True))
    ends = open_array(part.index, np.uint64).tolist()
    tokens = open_array(part.tokens, part.token_dtype)
    mask = open_array(part.mask, np.uint8) if part.mask else None
    with MDSWriter(out=str(tmp_path / "ref"), columns=columns, size_limit=5000) as writer:
        for a, b in zip([0, *ends[:-1]], ends, strict=True):
            sample = {"tokens": np.asarray(tokens[a:b])}
            if mask is not None:
                sample["loss_mask"] = np.asarray(mask[a:b])
            writer.write(sample)
    # MDSWriter writes an empty shard first when its first sample alone passes the limit
    # (it flushes before adding, even nothing); we write none: compare the others.
    ref = json.loads((tmp_path / "ref" / "index.json").read_text())["shards"]
    ref = [s for s in ref if s["samples"]]
    folder = tmp_path / "out" / "train"
    ours = json.loads((folder / "index.json").read_text())["shards"]
    ours = [s for s in ours if s["raw_data"]["basename"].startswith(f"{part.number:05d}/")]
    assert len(ref) > 1 and len(ours) == len(ref)
    for r, o in zip(ref, ours, strict=True):
        assert {**o, "raw_data": None} == {**r, "raw_data": None}  # samples, columns, limit
        assert o["raw_data"]["bytes"] == r["raw_data"]["bytes"]
        theirs = (tmp_path / "ref" / r["raw_data"]["basename"]).read_bytes()
        assert (folder / o["raw_data"]["basename"]).read_bytes() == theirs


# ---------------------------------------------------------------------------- parquet


def check_parquet(out: Path, expected: Docs, cache: Path) -> None:
    """HF datasets and pyarrow read every row (and mask) of each folder, in file order."""
    import pyarrow.parquet as pq
    from datasets import load_dataset

    for folder, docs in expected.items():
        files = sorted(str(p) for p in (out / folder).glob("*.parquet"))
        ds = load_dataset("parquet", data_files=files, split="train", cache_dir=str(cache))
        assert ds.num_rows == len(docs), folder
        assert ds.features["input_ids"].feature.dtype == "int32"
        rows = [pq.read_table(f).to_pylist() for f in files]
        rows = [r for file_rows in rows for r in file_rows]
        for i, (tokens, mask) in enumerate(docs):
            for row in (ds[i], rows[i]):
                np.testing.assert_array_equal(np.asarray(row["input_ids"]), tokens)
                if mask is None:
                    assert "loss_mask" not in row
                else:
                    np.testing.assert_array_equal(np.asarray(row["loss_mask"]), mask)


@pytest.mark.parametrize("build", ["demo", "chat"])
def test_parquet_export_read_by_datasets_and_pyarrow(build, request, tmp_path):
    source = request.getfixturevalue(build)
    out = tmp_path / "parquet"
    export(source, "parquet", out)
    check_parquet(out, lemur_documents(source), tmp_path / "hf-cache")
    before = tree_hashes(out)
    export(source, "parquet", out, "--force")
    assert tree_hashes(out) == before


def test_parquet_row_groups_bounded(demo, tmp_path):
    """Small row groups (whole documents each) keep the rows and their order."""
    import pyarrow.parquet as pq

    from lemur.export.parquet import ParquetExporter
    from lemur.export.run import export_info, shard_parts

    manifest = json.loads((demo / "manifest.json").read_text())
    parts = shard_parts(demo, manifest, "all")
    info = export_info(demo, tmp_path / "out", manifest, parts)
    fmt = ParquetExporter(row_group_tokens=2000)
    for part in parts:
        fmt.write_part(part, info, tmp_path / "out")
    meta = pq.ParquetFile(tmp_path / "out" / f"{parts[0].stem}.parquet").metadata
    assert meta.num_row_groups > 2
    check_parquet(tmp_path / "out", lemur_documents(demo), tmp_path / "hf-cache")


# ---------------------------------------------------------------------------- uint32 ids


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """A shard folder of uint32 ids past 2^16 (a vocabulary of 200k): two train shards and a
    val domain, written by lemur's own shard writer (no build needs that vocabulary)."""
    from lemur.shards.format import ShardWriter, make_manifest, write_manifest

    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(5)
    shards = []
    for prefix, split, domain in (("train", "train", "code"), ("val/code", "val", "code")):
        writer = ShardWriter(root, prefix, split, domain, np.dtype("<u4"), 3000)
        for _ in range(40 if split == "train" else 8):
            body = rng.integers(3, 200_000, int(rng.integers(1, 300)))
            writer.add(np.concatenate([[1], body, [2]]))
        shards += writer.close()
    tokenizer = {"file": "none", "sha256": "", "vocab_size": 200_000, "bos_id": 1, "eos_id": 2}
    write_manifest(root, make_manifest(np.dtype("<u4"), 256, tokenizer, shards))
    return root


@pytest.mark.parametrize("fmt", ["litdata", "mds", "parquet"])
def test_uint32_ids_read_back(wide, fmt, tmp_path):
    """Ids past 2^16 keep their value: litdata's `no_header_numpy:6`, MDS's
    `ndarray:uint32`, parquet's int32."""
    from lemur.export.formats import exporter
    from lemur.export.run import export_info, shard_parts

    manifest = json.loads((wide / "manifest.json").read_text())
    parts = shard_parts(wide, manifest, "all")
    info = export_info(wide, tmp_path / "out", manifest, parts)
    writer = exporter(fmt)
    writer.check(info)
    for part in parts:
        writer.write_part(part, info, tmp_path / "out")
    writer.finish(parts, info, tmp_path / "out")
    expected = lemur_documents(wide)
    assert len(info.train_stems) > 1 and max(t.max() for t, _ in expected["train"]) >= 1 << 16
    check = {"litdata": check_litdata, "mds": check_mds}.get(fmt)
    if check:
        check(tmp_path / "out", expected)
    else:
        check_parquet(tmp_path / "out", expected, tmp_path / "hf-cache")

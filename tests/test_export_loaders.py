"""`lemur-data export` read back by each trainer's own loader (#48 item 7).

A two-domain build (real code and text, several train shards, a val shard per domain) and a
chat build (loss masks) are exported as megatron, nanotron and olmo; megatron-core's
`IndexedDataset` and a `GPTDataset` from its `BlendedMegatronDatasetBuilder`, datatrove's
`DatatroveFileDataset` / `DatatroveFolderDataset` and OLMo-core's `NumpyFSLDataset` read
them, and every document's tokens (and masks where the format has them) must equal lemur's
own shards, in order, over every shard and val domain.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import base_recipe

from lemur.export.megatron import read_index, token_ends
from lemur.export.run import export

# megatron-core warns at import about Transformer Engine and Apex, absent on CPU.
pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


def lemur_parts(directory: Path) -> list[tuple[str, list[tuple[np.ndarray, np.ndarray | None]]]]:
    """(stem, [(tokens, mask) per document]) of every shard, in the export's order: train
    shards as the manifest lists them, then each val domain (sorted), numbered from 0."""
    manifest = json.loads((directory / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    groups = [("train", [s for s in manifest["shards"] if s["split"] == "train"])]
    for d in sorted({s["domain"] for s in manifest["shards"] if s["split"] == "val"}):
        vals = [s for s in manifest["shards"] if s["split"] == "val" and s["domain"] == d]
        groups.append((f"val/{d}", vals))
    parts = []
    for folder, shards in groups:
        for n, s in enumerate(shards):
            tokens = np.fromfile(directory / s["file"], dtype)
            ends = np.fromfile(directory / s["index"], np.uint64).astype(np.int64)
            mask = np.fromfile(directory / s["mask"], np.uint8) if "mask" in s else None
            docs = [
                (tokens[a:b], None if mask is None else mask[a:b])
                for a, b in zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True)
            ]
            parts.append((f"{folder}/{n:05d}", docs))
    return parts


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory, corpus_dir) -> Path:
    """A code + text build with several train shards and a val shard per domain."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("plain")
    text = [corpus_dir / "a.jsonl", corpus_dir / "b.jsonl.gz"]
    build(recipe_from_dict(base_recipe(tmp, corpus_dir / "code", text, shard_tokens=20_000)))
    out = tmp / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    splits = [(s["split"], s["domain"]) for s in manifest["shards"]]
    assert splits.count(("train", "mixed")) > 2 and {("val", "code"), ("val", "text")} <= set(
        splits
    )
    return out


@pytest.fixture(scope="module")
def chat_build(tmp_path_factory) -> Path:
    """A chat build (loss masks) over real conversations, several shards."""
    from test_data_chat_build import chat_corpus, chat_recipe

    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("chat")
    paths, _ = chat_corpus(tmp / "data")
    tok = {"train": {"vocab_size": 800, "sample_bytes": 300_000}}
    build(recipe_from_dict(chat_recipe(tmp, paths, tok, shard_tokens=4096)))
    out = tmp / "out"
    assert all("mask" in s for s in json.loads((out / "manifest.json").read_text())["shards"])
    return out


BUILDS = ["plain_build", "chat_build"]


def exported(request, build: str, fmt: str) -> tuple[Path, Path]:
    """(the build, its export as `fmt`), exported once per module."""
    source = request.getfixturevalue(build)
    out = source.parent / f"export-{fmt}"
    if not out.exists():
        export(source, fmt, out)
    return source, out


# ---------------------------------------------------------------------------- megatron


def test_megatron_indexed_dataset_reads_every_document(request):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    source, out = exported(request, "plain_build", "megatron")
    parts = lemur_parts(source)
    for stem, docs in parts:
        ds = IndexedDataset(str(out / stem))
        assert len(ds) == len(docs)
        np.testing.assert_array_equal(ds.document_indices, np.arange(len(docs) + 1))
        for i, (tokens, _) in enumerate(docs):
            np.testing.assert_array_equal(ds[i], tokens)
        # our own reader of the .idx gives the same document ends
        ends = token_ends(read_index(out / f"{stem}.idx"))
        np.testing.assert_array_equal(ends, np.cumsum([len(t) for t, _ in docs]))
    assert {stem.rsplit("/", 1)[0] for stem, _ in parts} == {"train", "val/code", "val/text"}


def test_megatron_gpt_dataset_samples_are_the_documents_concatenated(request):
    """`BlendedMegatronDatasetBuilder` on CPU: every sample of each train prefix's
    `GPTDataset` is the next `sequence_length + 1` tokens of its documents in the order its
    own shuffle put them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    source, out = exported(request, "plain_build", "megatron")
    manifest = json.loads((source / "manifest.json").read_text())
    train = [(stem, docs) for stem, docs in lemur_parts(source) if stem.startswith("train/")]
    L = 64
    # Megatron asks a tokenizer only for its vocab size, EOD and an identity: no pad id, so
    # it pads with -1 and zeroes none of our ids.
    tok = types.SimpleNamespace(
        vocab_size=manifest["tokenizer"]["vocab_size"],
        eod=manifest["tokenizer"]["eos_id"],
        unique_identifiers={"class": "lemur-test-tokenizer"},
    )
    config = GPTDatasetConfig(
        random_seed=1234,
        sequence_length=L,
        blend=([str(out / stem) for stem, _ in train], None),
        split="100,0,0",
        tokenizer=tok,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=None,  # no cache: the cache path asks torch.distributed for a rank
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blended, _, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [None, None, None], lambda: True, config
        ).build()
    by_path = {str(out / stem): docs for stem, docs in train}
    assert sorted(d.dataset_path for d in blended.datasets) == sorted(by_path)
    for gpt in blended.datasets:
        docs = by_path[gpt.dataset_path]
        stream = np.concatenate([docs[int(d)][0] for d in gpt.document_index]).astype(np.int64)
        assert len(gpt) == (len(stream) - 1) // L
        for idx in range(len(gpt)):
            sample = gpt[idx]
            j = int(gpt.shuffle_index[idx])
            window = np.append(sample["tokens"].numpy(), sample["labels"].numpy()[-1])
            np.testing.assert_array_equal(window, stream[j * L : j * L + L + 1])


def test_megatron_refuses_the_chat_build(request):
    from lemur.export.formats import ExportError

    source = request.getfixturevalue("chat_build")
    with pytest.raises(ExportError, match=r"chat build .*nanotron, olmo, mds or parquet"):
        export(source, "megatron", source.parent / "megatron-chat")
    assert not (source.parent / "megatron-chat").exists()


# ---------------------------------------------------------------------------- nanotron


@pytest.mark.parametrize("build", BUILDS)
def test_datatrove_reads_every_document_and_mask(request, build):
    from datatrove.utils.dataset import DatatroveFileDataset

    source, out = exported(request, build, "nanotron")
    manifest = json.loads((source / "manifest.json").read_text())
    size = np.dtype(manifest["dtype"]).itemsize
    for stem, docs in lemur_parts(source):
        path = out / f"{stem}.ds"
        tokens = np.concatenate([t for t, _ in docs])
        # One window of the whole file; its positions come from the .index file.
        ds = DatatroveFileDataset(str(path), len(tokens) - 1, size, return_positions=True)
        item = ds[0]
        np.testing.assert_array_equal(item["input_ids"].numpy(), tokens)
        starts = np.flatnonzero(item["positions"].numpy() == 0)
        np.testing.assert_array_equal(starts, np.cumsum([0] + [len(t) for t, _ in docs[:-1]]))
        loss = Path(f"{path}.loss")
        if docs[0][1] is None:
            assert not loss.exists()
        else:  # datatrove's loss file: one bool byte per token
            np.testing.assert_array_equal(
                np.fromfile(loss, np.bool_), np.concatenate([m for _, m in docs]).astype(bool)
            )
        meta = Path(f"{path}.metadata").read_text().split("\n")
        assert meta[0] == f"{out / 'tokenizer'}|{size}" and meta[1] == str(len(tokens))


def test_datatrove_folder_keeps_the_train_order(request):
    from datatrove.utils.dataset import DatatroveFolderDataset

    source, out = exported(request, "plain_build", "nanotron")
    train = [(s, d) for s, d in lemur_parts(source) if s.startswith("train/")]
    L = 32
    ds = DatatroveFolderDataset(str(out / "train"), L, filename_pattern="*.ds", token_size=2)
    assert [Path(f.file_path).name for f in ds.files] == [f"{s[6:]}.ds" for s, _ in train]
    windows = [
        np.concatenate([t for t, _ in docs])[k * (L + 1) : (k + 1) * (L + 1)]
        for _, docs in train
        for k in range(sum(len(t) for t, _ in docs) // (L + 1))
    ]
    assert len(ds) == len(windows)
    for i in range(0, len(ds), 7):
        np.testing.assert_array_equal(ds[i]["input_ids"].numpy(), windows[i])


# ---------------------------------------------------------------------------- olmo


@pytest.mark.parametrize("build", BUILDS)
def test_olmo_numpy_fsl_dataset_reads_every_document_and_mask(request, build):
    from olmo_core.data import NumpyFSLDataset

    source, out = exported(request, build, "olmo")
    tok = json.loads((source / "manifest.json").read_text())["tokenizer"]
    dtype = np.dtype(json.loads((source / "manifest.json").read_text())["dtype"]).type
    for stem, docs in lemur_parts(source):
        tokens = np.concatenate([t for t, _ in docs])
        masked = docs[0][1] is not None
        ds = NumpyFSLDataset(
            str(out / f"{stem}.npy"),
            sequence_length=len(tokens),
            pad_token_id=tok["eos_id"],
            eos_token_id=tok["eos_id"],
            bos_token_id=tok["bos_id"],
            vocab_size=tok["vocab_size"],
            dtype=dtype,
            generate_doc_lengths=True,
            label_mask_paths=[str(out / f"{stem}.label_mask.npy")] if masked else None,
        )
        assert len(ds) == 1
        item = ds[0]
        np.testing.assert_array_equal(item["input_ids"].numpy(), tokens)
        lengths = [len(t) for t, _ in docs]
        assert item["doc_lens"].tolist() == lengths
        if masked:
            np.testing.assert_array_equal(
                item["label_mask"].numpy(), np.concatenate([m for _, m in docs]).astype(bool)
            )
        else:
            assert not (out / f"{stem}.label_mask.npy").exists()
        rows = list(
            csv.reader(io.StringIO(gzip.decompress((out / f"{stem}.csv.gz").read_bytes()).decode()))
        )
        ends = np.cumsum(lengths).tolist()
        assert [(int(r[0]), int(r[1])) for r in rows] == list(
            zip([0, *ends[:-1]], ends, strict=True)
        )

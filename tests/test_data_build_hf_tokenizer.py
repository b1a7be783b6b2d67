"""Builds with a `tokenizer.json` (`tokenizer: {hf: ...}`): ids equal the reference's on
every document, framing by the model's convention, uint32 where the vocabulary needs it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import (
    llama3_folder,
    pathological_texts,
    qwen_like_folder,
    reference_ids,
)
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.verify import verify
from lemur.tokenizer import TokenizerError


def shard_documents(directory: Path) -> tuple[dict, list[list[int]]]:
    """The manifest and every document's ids (train and val), framing included."""
    manifest = json.loads((directory / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    docs = []
    for shard in manifest["shards"]:
        tokens = np.fromfile(directory / shard["file"], dtype=dtype)
        ends = np.fromfile(directory / shard["index"], dtype="<u8").tolist()
        docs += [tokens[s:e].tolist() for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    return manifest, docs


def as_read(text: str) -> str:
    """`text` as JSON gives it back: an escaped surrogate pair joined, a lone half U+FFFD."""
    text = text.replace("\ud83d\ude00", "\U0001f600")
    return text.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")


def inputs(tmp: Path) -> tuple[list[str], list[dict]]:
    """Real code files, real text and pathological documents, as two sources of one domain."""
    code = tmp / "code"
    code.mkdir()
    texts = []
    for p in real_python_files(25):
        (code / p.name).write_bytes(p.read_bytes())
        texts.append(p.read_text(encoding="utf-8"))
    # Pathological documents as JSONL. The reader reads a lone surrogate's escape as U+FFFD
    # (counted `repaired`) and drops whitespace-only text (`empty`); a megabyte of spaces
    # inside a document stays.
    rows = [{"text": t} for t in pathological_texts() if t] + real_text_docs(15)
    rows.append({"text": "x" + " " * 1_000_000 + "y"})
    write_jsonl(tmp / "text.jsonl", rows)
    texts += [as_read(r["text"]) for r in rows if r["text"].strip()]
    sources = [
        {
            "name": "py",
            "domain": "code",
            "format": "files",
            "paths": [str(code)],
            "language": "Python",
        },
        {"name": "txt", "domain": "code", "format": "jsonl", "paths": [str(tmp / "text.jsonl")]},
    ]
    return texts, sources


def recipe(tmp: Path, tokenizer: dict, sources: list[dict]) -> dict:
    return {
        "output": str(tmp / "out"),
        "filters": NO_FILTERS,
        "pii": {"enabled": False},
        "dedup": {"exact": False, "near": False},
        "seq_len": 256,
        "val_fraction": 0.05,
        "shard_tokens": 400_000,
        "tokenizer": tokenizer,
        "mix": {"ratio": {"code": 1}},
        "executor": {"tasks": 2, "workers": 1},
        "sources": sources,
    }


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Path:
    return llama3_folder(tmp_path_factory.mktemp("llama3"))


def test_llama3_build_has_the_reference_ids_on_every_document(tmp_path, llama3):
    texts, sources = inputs(tmp_path)
    build(recipe_from_dict(recipe(tmp_path, {"hf": str(llama3)}, sources)))
    out = tmp_path / "out"
    manifest, docs = shard_documents(out)
    tok = manifest["tokenizer"]
    assert manifest["dtype"] == "uint32"  # 128,256 ids do not fit uint16
    assert {k: tok[k] for k in ("kind", "engine", "vocab_size", "bos_id", "eos_id")} == {
        "kind": "tokenizer.json",
        "engine": "tiktoken",
        "vocab_size": 128256,
        "bos_id": 128000,
        "eos_id": 128001,
    }
    assert (out / tok["file"]).name == "tokenizer.json"
    assert (out / tok["file"]).parent.joinpath("tokenizer_config.json").is_file()
    want = Counter(tuple([128000, *reference_ids(llama3, t), 128001]) for t in texts)
    assert Counter(tuple(d) for d in docs) == want  # every document, pathological ones too
    assert manifest["counts"]["dropped"] == {"empty": 2}
    assert manifest["counts"]["error_kinds"] == {}
    assert manifest["counts"]["repaired"] == {"lone_surrogate": 1}
    assert manifest["counts"]["sources"]["txt"]["repaired"] == {"lone_surrogate": 1}
    assert verify(out) == []


def test_qwen_like_build_frames_without_bos(tmp_path):
    texts, sources = inputs(tmp_path)
    folder = qwen_like_folder(tmp_path / "qwen", texts[:30])
    build(recipe_from_dict(recipe(tmp_path, {"hf": str(folder)}, sources)))
    manifest, docs = shard_documents(tmp_path / "out")
    tok = manifest["tokenizer"]
    eos = tok["eos_id"]
    assert (tok["bos_id"], tok["engine"], manifest["dtype"]) == (None, "tokenizers", "uint16")
    assert Counter(tuple(d) for d in docs) == Counter(
        tuple([*reference_ids(folder, t), eos]) for t in texts
    )
    assert verify(tmp_path / "out") == []


def test_recipe_framing_overrides_and_errors(tmp_path, llama3):
    texts, sources = inputs(tmp_path)
    raw = recipe(tmp_path, {"hf": str(llama3), "no_bos": True, "eos": "<|eot_id|>"}, sources[:1])
    build(recipe_from_dict(raw))
    manifest, docs = shard_documents(tmp_path / "out")
    assert (manifest["tokenizer"]["bos_id"], manifest["tokenizer"]["eos_id"]) == (None, 128009)
    assert all(d[0] != 128000 and d[-1] == 128009 for d in docs)
    no_eos = tmp_path / "no-eos"
    no_eos.mkdir()
    (no_eos / "tokenizer.json").write_bytes((llama3 / "tokenizer.json").read_bytes())
    (no_eos / "tokenizer_config.json").write_text('{"eos_token": null}')
    no_eos_recipe = recipe(tmp_path, {"hf": str(no_eos)}, sources[:1])
    with pytest.raises(RecipeError, match="name no EOS token to end documents with"):
        recipe_from_dict(no_eos_recipe)  # when the recipe is loaded, before any build
    with pytest.raises(TokenizerError, match="name no EOS token to end documents with"):
        build(recipe_from_dict(no_eos_recipe, check_paths=False))  # a Recipe made in code
    with pytest.raises(RecipeError, match="tokenizer.hf '.*nowhere' is not a tokenizer.json"):
        recipe_from_dict(recipe(tmp_path, {"hf": str(tmp_path / "nowhere")}, sources))
    with pytest.raises(RecipeError, match="apply to 'hf' tokenizers only"):
        recipe_from_dict(recipe(tmp_path, {"model": "x.model", "no_bos": True}, sources))
    with pytest.raises(RecipeError, match="give exactly one of 'model', 'hf' or 'train'"):
        recipe_from_dict(recipe(tmp_path, {"hf": str(llama3), "model": "x"}, sources))


def test_trained_byte_bpe_is_tiktoken_exact_and_deterministic(tmp_path):
    from lemur.data.encode.byte_bpe import train_byte_bpe
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig
    from lemur.tokenizer import open_tokenizer

    texts = [p.read_text(encoding="utf-8") for p in real_python_files(20)]
    config = TokenizerTrainConfig(kind="byte-bpe", vocab_size=1500)
    a = train_byte_bpe(texts, config, tmp_path / "a")
    b = train_byte_bpe(texts, config, tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()  # the same sample gives the same tokenizer
    tok = open_tokenizer(a)
    assert (tok.engine, tok.vocab_size, tok.bos_id, tok.eos_id) == ("tiktoken", 1500, 0, 1)
    held_out = [d["text"] for d in real_text_docs(20)] + pathological_texts()[1:]
    for text in held_out:
        assert tok.encode(text) == reference_ids(a.parent, text)
        assert tok.decode(tok.encode(text)) == text.encode("utf-16", "surrogatepass").decode(
            "utf-16", "replace"
        )


def test_build_trains_a_byte_bpe(tmp_path):
    texts, sources = inputs(tmp_path)
    raw = recipe(tmp_path, {"train": {"kind": "byte-bpe", "vocab_size": 2000}}, sources)
    build(recipe_from_dict(raw))
    manifest, docs = shard_documents(tmp_path / "out")
    tok = manifest["tokenizer"]
    assert (tok["kind"], tok["engine"], tok["vocab_size"]) == ("tokenizer.json", "tiktoken", 2000)
    folder = (tmp_path / "out" / tok["file"]).parent
    want = Counter(tuple([0, *reference_ids(folder, t), 1]) for t in texts)
    assert Counter(tuple(d) for d in docs) == want
    with pytest.raises(RecipeError, match="vocab_size must be > 258 for byte-bpe"):
        recipe_from_dict(
            recipe(tmp_path, {"train": {"kind": "byte-bpe", "vocab_size": 258}}, sources)
        )

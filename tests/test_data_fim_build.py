"""Builds with `fim:`: FIM code documents in the shards with the model's markers, seeded,
text documents untouched, a rate change re-running only the FIM stage and packing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import llama3_folder
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.verify import verify
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.fim import MARKER_STYLES, encode_parts, fim_parts, find_code_markers

SPELLS_MARKERS = (
    "PRE = '<|fim_prefix|>'  # <|fim_middle|> <|fim_suffix|> <|file_sep|>\n"
    "x = ' <PRE> <SUF> <MID> <EOT>'\n" * 3
)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[list[dict], list[str], list[str]]:
    """(sources, code texts, text texts): 20 stdlib modules and a file spelling markers as
    code, 12 real text documents as text."""
    tmp = tmp_path_factory.mktemp("fim-src")
    code = tmp / "code"
    code.mkdir()
    for p in real_python_files(20):
        (code / p.name).write_bytes(p.read_bytes())
    (code / "markers.py").write_text(SPELLS_MARKERS)
    docs = real_text_docs(12)
    write_jsonl(tmp / "text.jsonl", docs)
    srcs = [
        {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
        {"name": "txt", "domain": "text", "format": "jsonl", "paths": [str(tmp / "text.jsonl")]},
    ]
    code_texts = [p.read_text() for p in sorted(code.glob("*.py"))]
    return srcs, code_texts, [d["text"] for d in docs]


@pytest.fixture(scope="module")
def llama3_plain(tmp_path_factory) -> Path:
    """Llama-3's tokenizer folder (no FIM tokens)."""
    return llama3_folder(tmp_path_factory.mktemp("l3-plain"))


@pytest.fixture(scope="module")
def llama3_qwen_fim(llama3_plain, tmp_path_factory) -> Path:
    """Llama-3's tokenizer with Qwen2.5-Coder's FIM tokens added, not special."""
    import shutil

    from tokenizers import AddedToken, Tokenizer

    folder = tmp_path_factory.mktemp("l3") / "fim"
    shutil.copytree(llama3_plain, folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    names = list(MARKER_STYLES["qwen2.5-coder"].values())
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in names])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _recipe(out: Path, tokenizer: dict, srcs: list[dict], **fim) -> dict:
    return {
        "output": str(out),
        "seed": 5,
        "seq_len": 512,
        "tokenizer": tokenizer,
        "filters": NO_FILTERS,
        "pii": {"enabled": False},
        "dedup": {"exact": True, "near": False},
        "mix": {"ratio": {"code": 1000, "text": 1}},  # every code document packed once
        "executor": {"kind": "local", "tasks": 2, "workers": 1},
        "val_fraction": 0.0,
        "sources": srcs,
        "fim": {"rate": 0.5, "spm_rate": 0.5, **fim},
    }


def _documents(out: Path) -> tuple[dict, list[list[int]]]:
    manifest = json.loads((out / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    docs = []
    for shard in manifest["shards"]:
        tokens = np.fromfile(out / shard["file"], dtype=dtype)
        ends = np.fromfile(out / shard["index"], dtype="<u8").tolist()
        docs += [tokens[s:e].tolist() for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    return manifest, docs


def _check_documents(out: Path, code: list[str], texts: list[str]) -> dict:
    """Every shard document: a FIM one has each marker once, in PSM or SPM order, and its
    parts decode to a code file; the others (all text documents) have no marker id."""
    manifest, docs = _documents(out)
    tok = open_tokenizer(out / manifest["tokenizer"]["file"])
    m = find_code_markers(tok)
    head = 0 if manifest["tokenizer"]["bos_id"] is None else 1
    seen = {"psm": 0, "spm": 0, "plain": 0}
    for doc in docs:
        body = doc[head:-1]
        found = [i for i in body if i in m.ids]
        if not found:
            assert tok.decode(body) in code + texts
            seen["plain"] += 1
            continue
        spm = body[1] == m.suffix
        want = [m.prefix, m.suffix, m.middle] + ([m.eot] if m.eot is not None else [])
        assert found == want and body[0] == m.prefix and (m.eot is None or body[-1] == m.eot)
        s, mid = body.index(m.suffix), body.index(m.middle)
        end = len(body) - (m.eot is not None)
        if spm:
            suffix, joined = _continuing(tok, body[2:mid]), tok.decode(body[mid + 1 : end])
            assert any(c.endswith(suffix) and c.startswith(joined) for c in code)
            if m.joins_spm:  # the ids are the parts' encoding (the build splices SentencePiece's)
                assert encode_parts(tok, fim_parts(joined, "", suffix, m, spm=True)) == body
        else:
            prefix, suffix, middle = body[1:s], body[s + 1 : mid], body[mid + 1 : end]
            parts = tok.decode(prefix), _continuing(tok, middle), _continuing(tok, suffix)
            assert "".join(parts) in code
            assert encode_parts(tok, fim_parts(*parts, m, spm=False)) == body
        seen["spm" if spm else "psm"] += 1
    return seen


def _continuing(tok, ids: list[int]) -> str:
    """Text of ids encoded without a dummy prefix (decoded after a sentinel piece)."""
    if tok.kind != "sentencepiece":
        return tok.decode(ids)
    return tok.decode([tok.piece_id("\u263a"), *ids])[1:]


def _shard_hashes(out: Path) -> list[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() for s in manifest["shards"]]


def test_sentencepiece_build_appends_pieces_and_is_seeded(sources, llama2_tokenizer, tmp_path):
    srcs, code, texts = sources
    manifest = build(
        recipe_from_dict(_recipe(tmp_path / "a", {"model": str(llama2_tokenizer)}, srcs))
    )
    info = manifest["tokenizer"]
    assert info["vocab_size"] == 32004
    assert info["added_pieces"] == [
        {"piece": p, "id": 32000 + i}
        for i, p in enumerate(["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"])
    ]
    fim = manifest["fim"]
    assert fim["markers"] == {
        "style": "codellama",
        "prefix": 32000,
        "suffix": 32001,
        "middle": 32002,
        "eot": 32003,
    }
    counts = fim["counts"]
    assert counts["documents"] == len(code) and counts["fim"] == counts["psm"] + counts["spm"]
    assert 0 < counts["fim"] < len(code) and counts["psm"] and counts["spm"]
    assert counts["spliced"] == counts["fim"]  # every FIM document's ids spliced
    assert verify(tmp_path / "a") == []
    seen = _check_documents(tmp_path / "a", code, texts)
    assert seen["psm"] + seen["spm"] == counts["fim"]  # every code document is packed once
    again = build(recipe_from_dict(_recipe(tmp_path / "b", {"model": str(llama2_tokenizer)}, srcs)))
    assert _shard_hashes(tmp_path / "a") == _shard_hashes(tmp_path / "b")
    assert again["fim"] == fim


def test_tokenizer_json_build_and_rate_change(sources, llama3_qwen_fim, tmp_path):
    srcs, code, texts = sources
    out = tmp_path / "out"
    first = build(recipe_from_dict(_recipe(out, {"hf": str(llama3_qwen_fim)}, srcs)))
    assert first["fim"]["markers"]["style"] == "qwen2.5-coder"
    _check_documents(out, code, texts)
    # The file spelling <|fim_prefix|> keeps the ids of its characters, FIM or not.
    work = out / ".work"
    (run,) = work.glob("tokens-*")
    run_files = {
        p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and "fim-" not in str(p)
    }
    second = build(recipe_from_dict(_recipe(out, {"hf": str(llama3_qwen_fim)}, srcs, rate=0.9)))
    assert list(work.glob("tokens-*")) == [run]  # read, filter, dedup, tokenize kept
    assert {p: p.stat().st_mtime_ns for p in run_files} == run_files
    assert len(list(run.glob("fim-*"))) == 2
    assert second["fim"]["counts"]["fim"] > first["fim"]["counts"]["fim"]
    assert [r["fim"]["counts"]["spliced"] for r in (first, second)] == [
        r["fim"]["counts"]["fim"] for r in (first, second)
    ]
    assert second["fim"]["rate"] == 0.9
    _check_documents(out, code, texts)


def test_recipe_errors(sources, tmp_path, llama2_tokenizer):
    srcs, _, _ = sources
    raw = _recipe(tmp_path / "x", {"model": str(llama2_tokenizer)}, srcs, domains=["docs"])
    with pytest.raises(RecipeError, match="fim.domains: no source has domain 'docs'"):
        recipe_from_dict(raw)
    raw = _recipe(tmp_path / "x", {"model": str(llama2_tokenizer)}, srcs, rate=2)
    with pytest.raises(RecipeError, match=r"fim.rate must be a number in \[0, 1\], got 2"):
        recipe_from_dict(raw)


def test_tokenizer_json_without_markers_is_a_one_line_error(sources, llama3_plain, tmp_path):
    srcs, _, _ = sources
    with pytest.raises(RecipeError, match="no FIM tokens of a known code model.*fim.markers"):
        build(recipe_from_dict(_recipe(tmp_path / "o", {"hf": str(llama3_plain)}, srcs)))
    assert not (tmp_path / "o").exists()  # refused before the build makes anything


@pytest.mark.parametrize("kind", ["sentencepiece", "byte-bpe"])
def test_trained_tokenizers_get_markers(corpus_dir, tmp_path, kind):
    """A trained SentencePiece model gets CodeLlama's pieces appended, a trained byte-level
    BPE Qwen2.5-Coder's markers as special tokens; every code document is FIM at rate 1."""
    texts = sorted(corpus_dir.glob("*.jsonl*"))
    raw = base_recipe(tmp_path, corpus_dir / "code", texts, filters=NO_FILTERS)
    raw.update(dedup={"exact": False, "near": False}, pii={"enabled": False})
    raw["tokenizer"]["train"].update(kind=kind, sample_bytes=150_000)
    raw["fim"] = {"rate": 1.0, "split": "line"}
    manifest = build(recipe_from_dict(raw))
    fim, info = manifest["fim"], manifest["tokenizer"]
    assert fim["counts"]["fim"] == fim["counts"]["documents"] > 0
    if kind == "sentencepiece":
        v = info["vocab_size"] - 4
        assert [p["id"] for p in info["added_pieces"]] == [v, v + 1, v + 2, v + 3]
        assert fim["markers"] == {
            "style": "codellama",
            "prefix": v,
            "suffix": v + 1,
            "middle": v + 2,
            "eot": v + 3,
        }
    else:
        assert fim["markers"] == {
            "style": "qwen2.5-coder",
            "prefix": 2,
            "middle": 3,
            "suffix": 4,
            "pad": 5,
            "repo_name": 6,
            "file_sep": 7,
        }


def _cli_build(raw: dict, tmp_path: Path, capsys) -> tuple[int, str]:
    """`lemur-data build` of the recipe `raw` in this process: (exit code, stderr)."""
    import yaml

    from lemur.data.cli import main

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    try:
        code = main(["build", str(path)])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("tokenizer", "markers", "said"),
    [
        (  # ordinary words every Python file holds: text encodes to them (#44 item 14)
            "llama2",
            {"prefix": "def", "middle": "class", "suffix": "return"},
            "FIM markers: 'def' (fim.markers.prefix) is an ordinary token of the vocabulary "
            "(id 1270): text encodes to it; name added, special or control tokens, or leave "
            "fim.markers out to use the model's own",
        ),
        (
            "llama2",
            {"prefix": "<nope>", "middle": "class", "suffix": "return"},
            "FIM markers: the tokenizer has no token '<nope>' (fim.markers.prefix)",
        ),
        (
            "llama3",
            None,
            "no FIM tokens of a known code model (qwen2.5-coder, starcoder, deepseek-coder, "
            "codellama): name the model's with fim.markers (prefix, middle, suffix)",
        ),
        (
            "qwen",
            {"prefix": "<|end_of_text|>", "middle": "<|fim_middle|>", "suffix": "<|fim_pad|>"},
            "recipe: fim.markers: id 128001 is the tokenizer's EOS as well: each marker must be "
            "a token of its own",
        ),
        (
            "trained",
            {"prefix": "<PRE>", "middle": "<MID>", "suffix": "<SUF>"},
            "recipe: fim.markers: a trained tokenizer has only its own FIM tokens "
            "(\u2581<PRE>, \u2581<SUF>, \u2581<MID>, \u2581<EOT>): leave fim.markers out, or "
            "name the tokens of a given tokenizer.model or tokenizer.hf",
        ),
        ("hf-model", None, "a SentencePiece model, not a tokenizer.json"),
    ],
)
def test_refused_fim_tokenizers_exit_2_leaving_nothing(
    sources,
    llama2_tokenizer,
    llama3_plain,
    llama3_qwen_fim,
    tmp_path,
    capsys,
    tokenizer,
    markers,
    said,
):
    """A FIM build whose markers text encodes to, or that a tokenizer lacks, and a
    SentencePiece model given as `tokenizer.hf`: one line naming the key, exit 2, no output
    directory made (#44 items 14, 22)."""
    srcs, _, _ = sources
    given = {
        "llama2": {"model": str(llama2_tokenizer)},
        "llama3": {"hf": str(llama3_plain)},
        "qwen": {"hf": str(llama3_qwen_fim)},
        "hf-model": {"hf": str(llama2_tokenizer)},
        "trained": {"train": {"vocab_size": 600}},
    }[tokenizer]
    raw = _recipe(tmp_path / "out", given, srcs, **({"markers": markers} if markers else {}))
    code, err = _cli_build(raw, tmp_path, capsys)
    assert (code, err.count("\n")) == (2, 1), err
    assert err.startswith("lemur-data: error: recipe: ") and said in err, err
    assert not (tmp_path / "out").exists()

"""End-to-end builds on small real corpora: round trip, determinism, stats, bad input, verify."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from conftest import NO_FILTERS, base_recipe, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.demo import DEMO_TEXT_FILTERS
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.stats import compute_stats
from lemur.shards.verify import verify


def decode_directory(directory: Path) -> dict[str, list[str]]:
    """Decode every document of a shard directory exactly as docs/format.md describes."""
    manifest = json.loads((directory / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(directory / manifest["tokenizer"]["file"]))
    out: dict[str, list[str]] = {}
    for shard in manifest["shards"]:
        tokens = np.memmap(
            directory / shard["file"], dtype=np.dtype(manifest["dtype"]).newbyteorder("<"), mode="r"
        )
        ends = np.fromfile(directory / shard["index"], dtype="<u8")
        start = 0
        for end in ends.tolist():
            doc = tokens[start:end]
            assert (
                doc[0] == manifest["tokenizer"]["bos_id"]
                and doc[-1] == manifest["tokenizer"]["eos_id"]
            )
            key = f"{shard['split']}/{shard['domain']}"
            out.setdefault(key, []).append(sp.decode(doc[1:-1].tolist()))
            start = end
    return out


TRICKY_DOCS = [
    "def f(x):\n\treturn x  \n\n\n",
    "trailing spaces   \nand\r\nCRLF\r\nlines\r\n",
    "    four spaces\n        eight spaces\n\t\ttabs\n",
    "naïve café — 日本語のテキスト, Ελληνικά, русский, emoji 🙂🚀",
    "\n\nblank lines first\n\n",
]


def test_round_trip_text_to_shards_to_text(tmp_path, corpus_dir, tokenizer_model):
    code = tmp_path / "code"
    code.mkdir()
    texts = [p.read_text() for p in sorted((corpus_dir / "code").glob("*.py"))[:10]] + TRICKY_DOCS
    for i, t in enumerate(texts):
        (code / f"f{i:02d}.py").write_bytes(t.encode())
    raw = {
        "output": str(tmp_path / "out"),
        "filters": NO_FILTERS,
        "seq_len": 64,
        "val_fraction": 0.0,
        "shard_tokens": 4096,
        "tokenizer": {"model": str(tokenizer_model)},
        "mix": {"ratio": {"code": 1}},
        "executor": {"tasks": 3, "workers": 1},
        "sources": [{"name": "c", "domain": "code", "format": "files", "paths": [str(code)]}],
    }
    build(recipe_from_dict(raw))
    decoded = decode_directory(tmp_path / "out")
    assert list(decoded) == ["train/mixed"]
    assert Counter(decoded["train/mixed"]) == Counter(texts)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["shards"]) > 1  # small shard_tokens forces several shards
    assert manifest["dtype"] == "uint16"


def test_build_stats_determinism_and_rerun(tmp_path, corpus_dir):
    texts = [corpus_dir / "a.jsonl", corpus_dir / "b.jsonl.gz", corpus_dir / "c.jsonl.zst"]
    raw = base_recipe(
        tmp_path,
        corpus_dir / "code",
        texts,
        filters=NO_FILTERS,
        dedup={"exact": False, "near": False},
        pii={"enabled": False},  # token counts below are of the unredacted files
    )
    m1 = build(recipe_from_dict(raw))
    out = tmp_path / "out"
    assert verify(out) == []
    # contract keys
    assert m1["format"] == "lemur-shards/1"
    assert set(m1["tokenizer"]) == {"file", "sha256", "vocab_size", "bos_id", "eos_id"}
    for s in m1["shards"]:
        assert set(s) >= {"file", "index", "split", "domain", "tokens", "documents", "sha256"}
    assert {s["domain"] for s in m1["shards"] if s["split"] == "val"} == {"code", "text"}

    # independent count: every input document, tokenized by hand
    sp = spm.SentencePieceProcessor(model_file=str(out / m1["tokenizer"]["file"]))
    code_docs = [p.read_text() for p in sorted((corpus_dir / "code").glob("*.py"))]
    text_docs = [d["text"] for d in real_text_docs(60)]
    c = m1["counts"]
    assert c["read"] == len(code_docs) + len(text_docs)
    assert c["sources"]["py"]["read"] == len(code_docs)
    assert c["sources"]["docs"]["read"] == len(text_docs)
    assert c["read"] == c["kept"] + sum(c["dropped"].values()) and c["kept"] == c["tokenized"]
    expected_tokens = {
        "code": sum(len(sp.encode(t)) + 2 for t in code_docs),
        "text": sum(len(sp.encode(t)) + 2 for t in text_docs),
    }
    mix = m1["mix"]
    stats = compute_stats(out)
    for d in ("code", "text"):
        val = stats["splits"][f"val/{d}"]["tokens"]
        assert mix["available"][d] + val == expected_tokens[d]
    # the scarcer side (code at 10:1 here) is kept whole; text is sampled to the ratio
    assert mix["tokens"]["code"] == mix["available"]["code"]
    # the text budget is met to within one document (these docs are large, so check that)
    text_lengths = [len(sp.encode(t)) + 2 for t in text_docs]
    text_budget = sum(u["budget"] for u in mix["languages"]["text"].values())
    assert abs(mix["tokens"]["text"] - text_budget) <= max(text_lengths) / 2
    assert abs(text_budget - mix["tokens"]["code"] / 10) <= 1
    assert stats["splits"]["train/mixed"]["tokens"] == sum(mix["tokens"].values())
    groups = {(g["split"], g["source"]): g for g in stats["groups"]}
    assert groups[("train", "py")]["tokens"] == mix["tokens"]["code"]
    assert groups[("train", "py")]["language"] == "Python"
    n_docs = sum(v["documents"] for v in stats["splits"].values())
    assert n_docs == sum(g["documents"] for g in stats["groups"])
    # every tokenized document is a duplicate, val, selected for train, or not selected
    val_docs = sum(s["documents"] for s in m1["shards"] if s["split"] == "val")
    selected = sum(s["documents"] for s in mix["sources"].values())
    assert c["tokenized"] == c["duplicates"] + val_docs + selected + mix["unselected_documents"]
    assert mix["unselected_documents"] > 0  # text is sampled down

    # a second, fresh build gives byte-identical shards
    raw2 = dict(raw, output=str(tmp_path / "out2"))
    m2 = build(recipe_from_dict(raw2))
    assert [s["sha256"] for s in m1["shards"]] == [s["sha256"] for s in m2["shards"]]
    for s in m1["shards"]:
        assert (out / s["file"]).read_bytes() == (tmp_path / "out2" / s["file"]).read_bytes()

    # rerunning in place skips the finished build
    mtime = (out / "manifest.json").stat().st_mtime_ns
    stages = []
    build(recipe_from_dict(raw), report=lambda stage, d, t: stages.append(stage))
    # (the inputs are listed first: a changed input makes the build stale)
    assert stages == ["list inputs", "list inputs", "up to date"]
    assert (out / "manifest.json").stat().st_mtime_ns == mtime


def test_parallel_workers_give_identical_shards(tmp_path, corpus_dir):
    texts = [corpus_dir / "a.jsonl"]
    one = build(recipe_from_dict(base_recipe(tmp_path, corpus_dir / "code", texts)))
    two = build(
        recipe_from_dict(
            base_recipe(
                tmp_path,
                corpus_dir / "code",
                texts,
                output=str(tmp_path / "par"),
                executor={"kind": "local", "tasks": 2, "workers": 2},
            )
        )
    )
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]


def test_bad_inputs_are_skipped_counted_and_named(tmp_path, corpus_dir):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(
        corpus_dir / "code" / sorted(p.name for p in (corpus_dir / "code").glob("*.py"))[0],
        code / "good.py",
    )
    (code / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    (code / "blob.py").write_bytes(b"\x00\x01\x02binary")
    (code / "empty.py").write_bytes(b"")
    (code / "huge.py").write_bytes(b"x = 1\n" * 2000)
    docs = real_text_docs(3)
    lines = [
        json.dumps(docs[0]),
        "{not json",
        json.dumps({"id": "x", "body": "no text key"}),
        json.dumps(docs[1]),
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    full = gzip.compress(("".join(json.dumps(d) + "\n" for d in docs * 50)).encode())
    (tmp_path / "trunc.jsonl.gz").write_bytes(full[: len(full) // 2])
    write_jsonl(tmp_path / "ok.jsonl.zst", [docs[2]], "zst")
    raw = base_recipe(
        tmp_path,
        code,
        [tmp_path / "t.jsonl", tmp_path / "trunc.jsonl.gz", tmp_path / "ok.jsonl.zst"],
        val_fraction=0.0,
        # text is the scarce domain: the mix takes every text document (rate 1)
        mix={"ratio": {"code": 1, "text": 3}},
        # help-topic prose: the reference (web-tuned) C4 rules would drop it all
        filters={"text": DEMO_TEXT_FILTERS},
    )
    raw["sources"][0]["max_file_bytes"] = 10_000
    m = build(recipe_from_dict(raw))
    c = m["counts"]
    kinds = {(Path(e["file"]).name, e["kind"], e.get("line")) for e in c["errors"]}
    assert ("latin1.py", "invalid_utf8", None) in kinds
    assert ("blob.py", "binary", None) in kinds
    assert ("huge.py", "too_large", None) in kinds
    assert ("t.jsonl", "invalid_json", 2) in kinds
    assert ("t.jsonl", "missing_text", 3) in kinds
    assert any(name == "trunc.jsonl.gz" and kind == "corrupt_file" for name, kind, _ in kinds)
    assert c["error_kinds"]["invalid_utf8"] == 1 and c["error_kinds"]["binary"] == 1
    assert c["dropped"] == {"empty": 1}
    assert c["sources"]["py"]["read"] == 2 and c["sources"]["py"]["kept"] == 1
    # neighbours of bad lines survive, and the readable half of the truncated stream is kept
    assert c["sources"]["docs"]["read"] > 3
    decoded = decode_directory(tmp_path / "out")["train/mixed"]
    assert m["mix"]["sources"]["docs"]["rate"] == 1
    assert all(d["text"] in decoded for d in docs)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args], capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus_dir) -> Path:
    tmp = tmp_path_factory.mktemp("built")
    build(recipe_from_dict(base_recipe(tmp, corpus_dir / "code", [corpus_dir / "a.jsonl"])))
    return tmp / "out"


def _copy(built: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(built, dst, ignore=shutil.ignore_patterns(".work"))
    return dst


def test_verify_flipped_byte(built, tmp_path):
    d = _copy(built, tmp_path)
    shard = json.loads((d / "manifest.json").read_text())["shards"][0]
    data = bytearray((d / shard["file"]).read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / shard["file"]).write_bytes(bytes(data))
    res = _cli("verify", str(d))
    assert res.returncode == 1
    assert f"{d / shard['file']}: sha256 mismatch" in res.stderr


def test_verify_truncated_shard(built, tmp_path):
    d = _copy(built, tmp_path)
    shard = json.loads((d / "manifest.json").read_text())["shards"][1]
    data = (d / shard["file"]).read_bytes()
    (d / shard["file"]).write_bytes(data[:-10])
    problems = verify(d)
    assert len(problems) == 1 and problems[0].startswith(f"{d / shard['file']}:")
    assert "truncated" in problems[0]


def test_verify_wrong_index(built, tmp_path):
    d = _copy(built, tmp_path)
    shard = json.loads((d / "manifest.json").read_text())["shards"][0]
    ends = np.fromfile(d / shard["index"], dtype="<u8")
    ends[1] += 3
    ends.tofile(d / shard["index"])
    problems = verify(d)
    assert problems and all(p.startswith(f"{d / shard['index']}:") for p in problems)


def test_verify_ok_and_not_a_directory(built, tmp_path):
    res = _cli("verify", str(built))
    assert res.returncode == 0 and "OK" in res.stdout
    # No manifest: not a shard directory, a mistake in the argument as for `stats` (exit 2).
    res = _cli("verify", str(tmp_path))
    assert res.returncode == 2 and res.stderr == (
        f"lemur-data: error: {tmp_path}/manifest.json: no manifest (is this a lemur shard "
        "directory?)\n"
    )


def test_stats_cli_json_and_plots(built, tmp_path):
    res = _cli("stats", str(built), "--json", "--plots", str(tmp_path / "plots"))
    assert res.returncode == 0, res.stderr
    stats = json.loads(res.stdout)
    manifest = json.loads((built / "manifest.json").read_text())
    assert stats["splits"]["train/mixed"]["documents"] == sum(
        s["documents"] for s in manifest["shards"] if s["split"] == "train"
    )
    assert (tmp_path / "plots" / "document_lengths.png").stat().st_size > 1000
    res = _cli("stats", str(built))
    assert res.returncode == 0 and "mix (train tokens)" in res.stdout
    res = _cli("stats", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no manifest" in res.stderr and "Traceback" not in res.stderr


def test_languages_keeps_only_listed_languages(tmp_path, corpus_dir, tokenizer_model):
    rows = [
        {"id": f"d{i}", "text": f"document number {i} " * 20, "lang": lang}
        for i, lang in enumerate(["en", "fr", "en", "de", "en"])
    ]
    write_jsonl(tmp_path / "t.jsonl", rows)
    raw = {
        "output": str(tmp_path / "out"),
        "filters": NO_FILTERS,
        "val_fraction": 0.0,
        "tokenizer": {"model": str(tokenizer_model)},
        "mix": {"ratio": {"text": 1}},
        "executor": {"tasks": 1, "workers": 1},
        "sources": [
            {
                "name": "t",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "t.jsonl")],
                "languages": ["en"],
            }
        ],
    }
    m = build(recipe_from_dict(raw))
    assert m["counts"]["dropped"] == {"language": 2}
    src = m["counts"]["sources"]["t"]
    assert (src["read"], src["kept"], src["errors"]) == (5, 3, 0)
    assert src["dropped"] == {"language": 2}
    assert sorted(decode_directory(tmp_path / "out")["train/mixed"]) == sorted(
        r["text"] for r in rows if r["lang"] == "en"
    )


def test_rejects_are_written_with_their_reason(tmp_path, tokenizer_model):
    good = real_text_docs(3)
    rows = good + [
        {"id": "short", "text": "too short to keep."},
        {"id": "lorem", "text": "Lorem ipsum dolor sit amet. " * 40},
    ]
    write_jsonl(tmp_path / "t.jsonl", rows)
    raw = {
        "output": str(tmp_path / "out"),
        "val_fraction": 0.0,
        "rejects": str(tmp_path / "rejects"),
        "tokenizer": {"model": str(tokenizer_model)},
        "mix": {"ratio": {"text": 1}},
        "executor": {"tasks": 1, "workers": 1},
        "dedup": {"near": False},
        "sources": [
            {
                "name": "t",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "t.jsonl")],
                "language": "en",
            }
        ],
    }
    m = build(recipe_from_dict(raw))
    rejected = {}
    for f in (tmp_path / "rejects").rglob("*.jsonl.gz"):
        for line in gzip.decompress(f.read_bytes()).decode().splitlines():
            row = json.loads(line)
            rejected[row["id"]] = (f.parent.name, row["metadata"]["filter_reason"])
    assert rejected["t/short"] == ("c4", "too_few_sentences")
    assert rejected["t/lorem"] == ("c4", "lorem_ipsum")
    assert sum(m["counts"]["dropped"].values()) == len(rejected)


def test_the_build_summary_lists_every_drop_reason(capsys, monkeypatch):
    from lemur.data.cli import print_summary
    from lemur.data.counts import drops

    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    reasons = {
        "empty": 3,
        "language": 40,
        "code:long_line": 7,
        "code:alpha": 1,
        "gopher_quality:short": 12,
        "c4:curly_bracket": 2,
        "decontaminated": 5,
    }
    manifest = {
        "counts": {
            "read": 100,
            "errors_total": 0,
            "dropped": reasons,
            "duplicates": 0,
            "dedup": {"exact": 0, "near": 0},
        },
        "mix": {"unselected_documents": 0, "tokens": {"code": 10}, "achieved": {"code": 1.0}},
        "shards": [{"split": "train", "documents": 30}],
    }
    print_summary(manifest)
    [row] = [line for line in capsys.readouterr().out.splitlines() if "filtered out" in line]
    listed = "language 40, gopher_quality:short 12, code:long_line 7, decontaminated 5, "
    assert listed + "empty 3, c4:curly_bracket 2, code:alpha 1" in row
    assert "(language 40, gopher_quality:short 12" in drops(manifest["counts"])

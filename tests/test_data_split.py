"""Big inputs split across tasks: jsonl byte ranges and parquet row-group runs read exactly
the documents of the whole file, once each; builds with and without splitting agree."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm
from conftest import NO_FILTERS, real_text_docs, write_jsonl

from lemur.data.build import build
from lemur.data.read.listing import list_inputs
from lemur.data.read.sources import SourcesReader
from lemur.data.read.split import byte_ranges, part_lines, row_group_runs
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.stages.reading import inputs_sha256

# Lines with every awkward shape: multi-byte UTF-8, CRLF, blank lines, a bad line, and a
# last line with no newline.
LINES = [
    '{"text": "plain ascii line"}\n',
    '{"text": "naïve café — 日本語のテキスト 🙂🚀"}\n',
    '{"text": "crlf line"}\r\n',
    "\n",
    '{"text": "Ελληνικά and русский"}\r\n',
    "{not json\n",
    '{"text": "x"}\n',
    '{"text": "last line, no newline: ✓"}',
]
DATA = "".join(LINES).encode()


def whole_lines(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, line) of every line, as an unsplit read sees them."""
    out, pos = [], 0
    for raw in data.splitlines(keepends=True):
        out.append((pos, raw))
        pos += len(raw)
    return out


def read_parts(path: Path, cuts: list[int]) -> list[tuple[int, bytes]]:
    bounds = list(zip([0, *cuts], [*cuts, path.stat().st_size], strict=True))
    return [line for a, b in bounds for line in part_lines(str(path), a, b)]


def test_every_single_cut_reads_each_line_once(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(DATA)
    expected = whole_lines(DATA)
    starts = {pos for pos, _ in expected}
    inside_char = [i for i, b in enumerate(DATA) if 0x80 <= b <= 0xBF]  # continuation bytes
    crlf = DATA.index(b"\r\n") + 1  # between \r and \n
    assert inside_char and crlf not in starts  # the cuts below hit every kind of boundary
    for cut in range(len(DATA) + 1):
        assert read_parts(path, [cut]) == expected, cut


def test_many_cuts_including_empty_parts(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(DATA)
    expected = whole_lines(DATA)
    for size in (1, 2, 3, 5, 7, 16, 40):
        bounds = byte_ranges(len(DATA), size)
        assert bounds[0][0] == 0 and bounds[-1][1] == len(DATA)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        parts = [list(part_lines(str(path), a, b)) for a, b in bounds]
        assert [line for part in parts for line in part] == expected
        if size == 1:
            assert sum(not p for p in parts) > 0  # a part inside a line reads nothing
    # the same cut twice: an empty range between them
    assert read_parts(path, [10, 10, 60, 60]) == expected


def test_row_group_runs_are_even_and_whole():
    assert row_group_runs([10] * 12, 30) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert row_group_runs([100, 1, 1, 1, 100], 100) == [(0, 1), (1, 5)]  # 100 and 103
    assert row_group_runs([50] * 4 + [200], 100) == [(0, 2), (2, 4), (4, 5)]
    assert row_group_runs([5, 5], 1000) == [(0, 2)]
    runs = row_group_runs([7, 300, 2, 2, 2, 50, 50, 50, 1], 64)
    assert runs[0][0] == 0 and runs[-1][1] == 9
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(runs, runs[1:], strict=False))


def _recipe(tmp_path: Path, sources: list[dict], split_bytes: int, **kw) -> dict:
    return {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 400}},
        "mix": {"ratio": {s.get("domain", "chat"): 1 for s in sources}},
        "executor": {"tasks": 4, "workers": 1, "split_bytes": split_bytes},
        "filters": NO_FILTERS,
        **kw,
        "sources": sources,
    }


def _text(paths: list[Path], fmt: str = "jsonl", name: str = "t", **kw) -> dict:
    return {"name": name, "domain": "text", "format": fmt, "paths": [str(p) for p in paths], **kw}


def _read(tmp_path: Path, sources: list[dict], split_bytes: int):
    r = recipe_from_dict(_recipe(tmp_path, sources, split_bytes))
    listing = list_inputs(r)
    reader = SourcesReader(listing.files, r.sources, errors_dir="")
    return listing.files, [d for f in listing.files for d in reader.read(f)], reader.log


def test_split_jsonl_reads_the_same_documents_with_byte_ids(tmp_path):
    rows = real_text_docs(30)
    for r in rows:
        del r["id"]  # ids from positions: `file:line` whole, `file@byte` split
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
    lines[4], lines[9] = "{bad json\n", '["not", "an object"]\r\n'
    lines[12] = '{"body": "no text"}\n'
    data = b"\xef\xbb\xbf" + "".join(lines).encode()  # a BOM: the first line still parses
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    files0, whole, log0 = _read(tmp_path, [_text([path])], 0)
    files1, split, log1 = _read(tmp_path, [_text([path])], 1000)
    assert len(files0) == 1 and len(files1) == -(-len(data) // 1000)
    assert {f.unit for f in files1} == {"bytes"}
    assert [d.text for d in split] == [d.text for d in whole]
    assert len(whole) == 27 and len({d.id for d in split}) == 27
    assert whole[0].id == "t/big.jsonl:1" and split[0].id == "t/big.jsonl@0"
    for doc in split:  # a byte id points at the document's line
        at = int(doc.id.rsplit("@", 1)[1])
        assert json.loads(data[at:].split(b"\n", 1)[0].removeprefix(b"\xef\xbb\xbf")) == {
            "text": doc.text
        }
    assert log1.by_file == log0.by_file == Counter({str(path): 3})
    assert [(e["kind"], e["line"]) for e in log0.errors] == [
        ("invalid_json", 5),
        ("invalid_json", 10),
        ("missing_text", 13),
    ]
    for e, bad in zip(log1.errors, ("{bad json", '["not"', '{"body"'), strict=True):
        assert "line" not in e and e["file"] == str(path)
        assert data[e["byte"] :].startswith(bad.encode())
        assert e["error"].endswith(f"(line starting at byte {e['byte']})")


def test_what_is_never_split(tmp_path):
    rows = real_text_docs(20)
    write_jsonl(tmp_path / "a.jsonl.gz", rows, "gz")
    write_jsonl(tmp_path / "b.jsonl.zst", rows, "zst")
    (tmp_path / "c.jsonl").write_bytes("".join(json.dumps(r) + "\n" for r in rows).encode("utf-16"))
    write_jsonl(tmp_path / "small.jsonl", [{"text": "tiny"}])
    code = tmp_path / "code"
    code.mkdir()
    (code / "big.py").write_text("x = 1\n" * 2000)
    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), tmp_path / "one.parquet")
    sources = [
        _text([tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.zst", tmp_path / "c.jsonl"]),
        _text([tmp_path / "small.jsonl"], name="s"),
        {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
        _text([tmp_path / "one.parquet"], "parquet", name="p"),  # a single row group
    ]
    r = recipe_from_dict(_recipe(tmp_path, sources, 200))
    files = list_inputs(r).files
    assert len(files) == 6 and all(not f.unit for f in files)
    files, docs, log = _read(tmp_path, sources[:1], 200)
    assert len(docs) == 40  # the utf-16 file is one error, reported once
    assert [(Path(e["file"]).name, e["kind"]) for e in log.errors] == [
        ("c.jsonl", "unsupported_format")
    ]


def _parquet(path: Path, n: int, group: int) -> list[str]:
    texts = [f"row {i}: " + d["text"][:300] for i, d in enumerate(real_text_docs(n))]
    table = pa.table({"text": texts, "lang": ["en"] * n})
    pq.write_table(table, path, row_group_size=group, compression="zstd")
    return texts


def test_split_parquet_keeps_row_ids_and_reports_file_errors_once(tmp_path):
    path = tmp_path / "t.parquet"
    texts = _parquet(path, 60, 5)
    files0, whole, _ = _read(tmp_path, [_text([path], "parquet")], 0)
    files1, split, _ = _read(tmp_path, [_text([path], "parquet")], 2000)
    assert len(files0) == 1 and len(files1) > 2 and {f.unit for f in files1} == {"row_groups"}
    assert [(f.start, f.end) for f in files1][-1][1] == 12
    assert [d.text for d in split] == [d.text for d in whole] == texts
    assert [d.id for d in split] == [d.id for d in whole]  # `file:row` over the whole file
    assert [d.metadata for d in split] == [d.metadata for d in whole]
    # A file-wide problem (no text column) is one error, not one per part.
    files, docs, log = _read(tmp_path, [_text([path], "parquet", text_key="body")], 2000)
    assert len(files) > 2 and not docs
    assert [(e["kind"], e["error"]) for e in log.errors] == [("missing_text", "no column 'body'")]


def test_split_chat_jsonl_but_not_oasst1(tmp_path):
    conv = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
        for i in range(40)
    ]
    write_jsonl(tmp_path / "chat.jsonl", conv)
    write_jsonl(tmp_path / "tree.jsonl", [{"message_id": "1", "text": "x"}] * 40)
    chat = {"name": "c", "format": "chat", "schema": "messages"}
    oasst = {"name": "o", "format": "chat", "schema": "oasst1"}
    sources = [
        {**chat, "paths": [str(tmp_path / "chat.jsonl")]},
        {**oasst, "paths": [str(tmp_path / "tree.jsonl")]},
    ]
    r = recipe_from_dict(_recipe(tmp_path, sources, 300))
    files = list_inputs(r).files
    assert {f.unit for f in files if f.source == 0} == {"bytes"}
    assert [f.unit for f in files if f.source == 1] == [""]
    _, whole, _ = _read(tmp_path, sources[:1], 0)
    _, split, _ = _read(tmp_path, sources[:1], 300)
    assert [d.text for d in split] == [d.text for d in whole] and len(whole) == 40


def test_split_bytes_knob_is_validated(tmp_path):
    path = tmp_path / "a.jsonl"
    write_jsonl(path, real_text_docs(2))
    with pytest.raises(RecipeError, match=r"^recipe: executor.split_bytes must be >= 0 .* -1$"):
        recipe_from_dict(_recipe(tmp_path, [_text([path])], -1))
    with pytest.raises(RecipeError, match="executor.split_bytes"):
        recipe_from_dict(_recipe(tmp_path, [_text([path])], "big"))
    assert recipe_from_dict(_recipe(tmp_path, [_text([path])], 0)).executor.split_bytes == 0
    default = _recipe(tmp_path, [_text([path])], 0)
    del default["executor"]["split_bytes"]
    assert recipe_from_dict(default).executor.split_bytes == 256 << 20
    bad = tmp_path / "r.yaml"
    bad.write_text(json.dumps(_recipe(tmp_path, [_text([path])], -5)))
    res = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(bad)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "lemur-data: error: recipe: executor.split_bytes must be >= 0 (0: never split), got -5"
    ]


def test_inputs_digest_moves_with_the_split_not_for_whole_files(tmp_path):
    path = tmp_path / "a.jsonl"
    write_jsonl(path, real_text_docs(20))
    digest = {
        n: inputs_sha256(list_inputs(recipe_from_dict(_recipe(tmp_path, [_text([path])], n))).files)
        for n in (0, 10**9, 2000, 3000)
    }
    assert digest[0] == digest[10**9]  # unsplit either way: the digest is unchanged
    assert len({digest[0], digest[2000], digest[3000]}) == 3


def _decoded(out: Path) -> Counter[str]:
    manifest = json.loads((out / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(out / manifest["tokenizer"]["file"]))
    docs: Counter[str] = Counter()
    for shard in manifest["shards"]:
        tokens = np.fromfile(out / shard["file"], dtype=np.dtype(manifest["dtype"]))
        ends = np.fromfile(out / shard["index"], dtype="<u8").tolist()
        for a, b in zip([0, *ends], ends, strict=False):
            docs[sp.decode(tokens[a + 1 : b - 1].tolist())] += 1
    return docs


def _ids(out: Path) -> set[str]:
    return {
        line
        for p in (out / ".work").glob("tokens-*/tokens/*.ids.txt")
        for line in p.read_text().splitlines()
    }


BUILD = {
    "seq_len": 64,
    "val_fraction": 0.05,
    "shard_tokens": 4096,
    "dedup": {"near": False},
}


def test_build_with_splitting_matches_build_without(tmp_path, tokenizer_model):
    rows = real_text_docs(80)
    bare = [{"text": r["text"]} for r in rows[:40]]  # no id: ids from positions
    write_jsonl(tmp_path / "web.jsonl", bare[:20] + [{"body": "no text"}] + bare[20:])
    write_jsonl(tmp_path / "ided.jsonl", rows[40:60])
    _parquet(tmp_path / "t.parquet", 40, 4)
    sources = [
        _text([tmp_path / "web.jsonl"], name="web"),
        _text([tmp_path / "ided.jsonl"], name="ided"),
        _text([tmp_path / "t.parquet"], "parquet", name="tbl"),
    ]
    kw = {**BUILD, "tokenizer": {"model": str(tokenizer_model)}, "val_fraction": 0.0}
    off = build(recipe_from_dict(_recipe(tmp_path / "off", sources, 0, **kw)))
    on = build(recipe_from_dict(_recipe(tmp_path / "on", sources, 3000, **kw)))
    listed = list_inputs(recipe_from_dict(_recipe(tmp_path, sources, 3000)))
    assert len(listed.files) > 8  # every file split into parts
    c0, c1 = off["counts"], on["counts"]
    for key in ("read", "kept", "tokenized", "errors_total", "error_kinds", "errors_by_file"):
        assert c0[key] == c1[key], key
    assert c0["sources"] == c1["sources"]
    assert c0["errors_by_file"] == {str(tmp_path / "web.jsonl"): 1}
    assert [e.get("line") for e in c0["errors"]] == [21]
    assert "line" not in c1["errors"][0] and c1["errors"][0]["byte"] > 0
    assert _decoded(tmp_path / "off" / "out") == _decoded(tmp_path / "on" / "out")
    # Ids of parquet rows and of jsonl lines with an `id` are unchanged by splitting;
    # jsonl lines without one are named by byte offset instead of line number.
    ids0, ids1 = _ids(tmp_path / "off" / "out"), _ids(tmp_path / "on" / "out")
    same = {i for i in ids0 if not i.startswith("web/")}
    assert same == {i for i in ids1 if not i.startswith("web/")} and len(same) == 60
    assert all(":" in i for i in ids0 - same) and all("@" in i for i in ids1 - same)


def test_split_build_with_unchanged_ids_gives_identical_shards(tmp_path, tokenizer_model):
    write_jsonl(tmp_path / "ided.jsonl", real_text_docs(50))
    _parquet(tmp_path / "t.parquet", 40, 4)
    sources = [
        _text([tmp_path / "ided.jsonl"], name="ided"),
        _text([tmp_path / "t.parquet"], "parquet", name="tbl"),
    ]
    kw = {**BUILD, "tokenizer": {"model": str(tokenizer_model)}}
    off = build(recipe_from_dict(_recipe(tmp_path / "off", sources, 0, **kw)))
    on = build(recipe_from_dict(_recipe(tmp_path / "on", sources, 3000, **kw)))
    assert off["inputs_sha256"] != on["inputs_sha256"]  # the parts were read
    assert [s["sha256"] for s in off["shards"]] == [s["sha256"] for s in on["shards"]]
    assert len(off["shards"]) > 2 and off["counts"] == on["counts"]

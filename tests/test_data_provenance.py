"""Provenance per document (`output.provenance`) and the recipe's `exclude:` lists, on real
builds: every document of a shard maps, through its shard's documents.parquet, to the source
file and line it was read from (the text there is the document's text, decoded from the
shard's tokens); a build without provenance writes the same shards byte for byte; a killed
build's rerun writes the same rows; `stats --doc` shows them; an `exclude:` rebuild drops
exactly the listed documents."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
import zstandard
from conftest import NO_FILTERS, base_recipe

from lemur.data.build import build
from lemur.data.read.exclude import EXCLUDED, Exclusions, read_entries
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.verify import verify
from lemur.tokenizer import open_tokenizer

# A killed build (module docstring of test_data_resume.py): the gather task `at` dies once
# it has written its shard and documents.parquet, before its completion marker.
KILLER = """
import os, signal, sys
from lemur.data.build import build
from lemur.data.pack import steps
from lemur.data.recipe_loader import load_recipe
stage, at = sys.argv[2], int(sys.argv[3])
original = getattr(steps, f"{stage}_task")
def task(rank, *args):
    original(rank, *args)
    if rank == at:
        os.kill(os.getpid(), signal.SIGKILL)
setattr(steps, f"{stage}_task", task)
build(load_recipe(sys.argv[1]))
"""


def recipe(corpus: Path, out: Path, tokenizer: Path, provenance: bool = True, **extra) -> dict:
    """The two-domain recipe of conftest over real files, with nothing that rewrites text
    (no text filters, no PII redaction), so each document's text is its source's."""
    texts = [corpus / "a.jsonl", corpus / "b.jsonl.gz", corpus / "c.jsonl.zst"]
    raw = base_recipe(out.parent, corpus / "code", texts, **extra)
    raw["output"] = {"path": str(out), "provenance": provenance}
    raw["tokenizer"] = {"model": str(tokenizer)}
    raw.setdefault("filters", NO_FILTERS)
    raw.setdefault("pii", {"enabled": False})
    raw["mix"] = {"ratio": {"code": 3, "text": 1}}
    return raw


@pytest.fixture(scope="module")
def built(corpus_dir, tokenizer_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prov") / "out"
    build(recipe_from_dict(recipe(corpus_dir, out, tokenizer_model)))
    return out


@pytest.fixture(scope="module")
def plain(corpus_dir, tokenizer_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain") / "out"
    build(recipe_from_dict(recipe(corpus_dir, out, tokenizer_model, provenance=False)))
    return out


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def source_record(row: dict) -> dict:
    """What lies at the row's file and line, read straight from the file: the JSON object
    of that line, or a whole file's text as `{"text": ...}`."""
    path = Path(row["file"])
    if row["line"] is None:  # a whole file
        return {"text": path.read_text(encoding="utf-8")}
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return json.loads(data.decode().splitlines()[row["line"] - 1])


def documents(out: Path):
    """(shard, index, decoded text, provenance row) of every document, in shard order."""
    manifest = manifest_of(out)
    tok = open_tokenizer(out / manifest["tokenizer"]["file"])
    for shard in manifest["shards"]:
        tokens = np.fromfile(out / shard["file"], np.dtype(manifest["dtype"]))
        ends = np.fromfile(out / shard["index"], "<u8").astype(np.int64)
        rows = pq.read_table(out / shard["provenance"]).to_pylist()
        assert len(rows) == len(ends) == shard["documents"]
        starts = np.concatenate(([0], ends[:-1]))
        for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
            yield shard, i, tok.decode(tokens[s + 1 : e - 1].tolist()), rows[i]


def test_every_document_maps_to_its_source_file_and_line(built):
    seen = 0
    for shard, i, text, row in documents(built):
        found = source_record(row)
        assert text == found["text"], f"{shard['file']} document {i}: {row}"
        name = row["id"].split("/", 1)[1]
        if row["source"] == "docs":  # jsonl rows: their own id, their line
            assert row["line"] >= 1 and row["path"] is None and row["domain"] == "text"
            assert found["id"] == name
        else:  # a file of the tree: its path, no line, its checkout's repository
            assert row["line"] is None and row["path"] == name == Path(row["file"]).name
            assert row["repository"] == "code" and row["language"] == "Python"
        assert row["fim"] is False and row["cluster_size"] >= 1
        seen += 1
    assert seen == sum(s["documents"] for s in manifest_of(built)["shards"])


def test_rows_follow_the_global_shuffle(built):
    """The shuffle interleaves files and lines; the rows follow it, shard by shard."""
    order = [(row["file"], row["line"] or 0) for _, _, _, row in documents(built)]
    assert order != sorted(order)
    train = [s for s in manifest_of(built)["shards"] if s["split"] == "train"]
    assert len(train) > 1  # several shards, each with its own rows
    files = {row["file"] for _, _, _, row in documents(built)}
    assert {Path(f).name for f in files} >= {"a.jsonl", "b.jsonl.gz", "c.jsonl.zst"}


def test_provenance_off_writes_the_same_shards_byte_for_byte(built, plain):
    with_rows, without = manifest_of(built), manifest_of(plain)
    assert "provenance" not in json.dumps(without["shards"])
    assert len(with_rows["shards"]) == len(without["shards"])
    for a, b in zip(with_rows["shards"], without["shards"], strict=True):
        for key in ("file", "index"):
            da, db = (built / a[key]).read_bytes(), (plain / b[key]).read_bytes()
            assert hashlib.sha256(da).hexdigest() == hashlib.sha256(db).hexdigest()
        assert {
            k: v for k, v in a.items() if not k.startswith(("provenance", "file", "index"))
        } == {k: v for k, v in b.items() if k not in ("file", "index")}
        assert (
            a["provenance_sha256"]
            == hashlib.sha256((built / a["provenance"]).read_bytes()).hexdigest()
        )
    assert verify(built) == [] and verify(plain) == []
    assert "provenance" not in without["recipe"]


def test_verify_names_a_changed_documents_file(built, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns(".work"))
    shard = manifest_of(copy)["shards"][0]
    table = pq.read_table(copy / shard["provenance"])
    pq.write_table(table.slice(1), copy / shard["provenance"])
    assert verify(copy) == [
        f"{copy / shard['provenance']}: sha256 mismatch (corrupted or modified)"
    ]


@pytest.mark.parametrize("stage, at", [("scatter", 1), ("gather", 1)])
def test_a_killed_build_reruns_to_the_same_rows(
    built, corpus_dir, tokenizer_model, tmp_path, stage, at
):
    out = tmp_path / "out"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(corpus_dir, out, tokenizer_model)))
    res = subprocess.run([sys.executable, "-c", KILLER, str(path), stage, str(at)])
    assert res.returncode == -9 and not (out / "manifest.json").exists()
    build(recipe_from_dict(recipe(corpus_dir, out, tokenizer_model)))
    for a, b in zip(manifest_of(built)["shards"], manifest_of(out)["shards"], strict=True):
        assert (built / a["provenance"]).read_bytes() == (out / b["provenance"]).read_bytes()
        assert a["provenance_sha256"] == b["provenance_sha256"]


def stats_doc(out: Path, spec: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "stats", str(out), "--doc", spec, *extra],
        capture_output=True,
        text=True,
    )


def test_stats_doc_prints_where_a_document_came_from(built):
    shard, i, text, row = list(documents(built))[5]
    name = shard["file"].split("/", 1)[1].removesuffix(".bin")  # train/00000
    res = stats_doc(built, f"{name}:{i}")
    assert res.returncode == 0, res.stderr
    lines = dict(line.split(None, 1) for line in res.stdout.splitlines() if " " in line.strip())
    assert lines["id"] == row["id"] and lines["source"] == row["source"]
    assert lines["file"] == row["file"] and lines["shard"] == shard["file"]
    first = next(line for line in text.splitlines() if line.strip())
    assert res.stdout.splitlines()[-1].split(None, 2)[-1] == first.strip()
    as_json = json.loads(stats_doc(built, f"{shard['file']}:{i}", "--json").stdout)
    assert as_json["line"] == row["line"] and as_json["document"] == i
    bad = stats_doc(built, f"{name}:{shard['documents']}")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert f"holds {shard['documents']} documents" in bad.stderr


def test_stats_doc_on_a_build_without_provenance_says_how_to_turn_it_on(plain):
    res = stats_doc(plain, "train/00000:0")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "built without provenance" in line and "provenance: true" in line


def test_exclusions_match_ids_paths_globs_and_repositories(tmp_path):
    (tmp_path / "ids.txt").write_text("# opt-outs\ndocs/calls\n\nblob123\n")
    (tmp_path / "paths.txt").write_text("vendor/*\nsrc/exact.py\n")
    (tmp_path / "repos.txt").write_text("octo/cat\n")
    ex = Exclusions.load(
        {
            "ids": str(tmp_path / "ids.txt"),
            "paths": str(tmp_path / "paths.txt"),
            "repositories": str(tmp_path / "repos.txt"),
        }
    )
    assert read_entries(str(tmp_path / "ids.txt"), "ids") == ["docs/calls", "blob123"]
    assert ex.excluded("docs/calls", "calls", (), None)
    assert ex.excluded("stack/blob123", "blob123", (), None)  # the id its source gave
    assert ex.excluded("a/x", "x", ("vendor/lib/x.js",), None)
    assert ex.excluded("a/x", "x", (None, "src/exact.py"), None)
    assert ex.excluded("a/x", "x", ("src/y.py",), "octo/cat")
    assert not ex.excluded("a/x", "x", ("src/exact.py.bak", "other/vendor/x"), "octo/dog")
    assert not Exclusions() and ex.key() != Exclusions().key()


def test_an_exclude_rebuild_drops_exactly_the_listed_documents(
    built, corpus_dir, tokenizer_model, tmp_path
):
    rows = [row for _, _, _, row in documents(built)]
    ids = sorted({r["id"] for r in rows if r["source"] == "docs"})[:3]
    paths = sorted({r["path"] for r in rows if r["source"] == "py"})[:2]
    (tmp_path / "ids.txt").write_text("".join(i + "\n" for i in ids) + "docs/no-such-doc\n")
    (tmp_path / "paths.txt").write_text(f"{paths[0]}\n{paths[1][:3]}*\n")
    globbed = {p.name for p in (corpus_dir / "code").glob(f"{paths[1][:3]}*.py")}
    out = tmp_path / "out"
    exclude = {"ids": str(tmp_path / "ids.txt"), "paths": str(tmp_path / "paths.txt")}
    m = build(recipe_from_dict(recipe(corpus_dir, out, tokenizer_model, exclude=exclude)))
    before = manifest_of(built)["counts"]
    counts = m["counts"]
    listed = len(ids) + len({paths[0]} | globbed)
    assert counts["dropped"][EXCLUDED] == listed
    assert counts["sources"]["docs"]["dropped"][EXCLUDED] == len(ids)
    assert counts["sources"]["py"]["dropped"][EXCLUDED] == len({paths[0]} | globbed)
    assert counts["read"] == before["read"]  # read = kept + dropped
    assert counts["kept"] == before["kept"] - listed
    assert counts["read"] == counts["kept"] + sum(counts["dropped"].values())
    after = {row["id"] for _, _, _, row in documents(out)}
    gone = set(ids) | {f"py/{p}" for p in {paths[0]} | globbed}
    assert not after & gone
    assert after  # the rest is still built


def test_a_bad_exclude_file_is_one_line_naming_it(corpus_dir, tokenizer_model, tmp_path):
    missing = tmp_path / "nope.txt"
    raw = recipe(corpus_dir, tmp_path / "out", tokenizer_model, exclude={"ids": str(missing)})
    with pytest.raises(RecipeError, match=f"{missing}: exclude.ids file not found"):
        recipe_from_dict(raw)
    binary = tmp_path / "ids.bin"
    binary.write_bytes(b"ok\n\xff\xfe\n")
    raw["exclude"] = {"repositories": str(binary)}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    res = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)], capture_output=True, text=True
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"lemur-data: error: {binary}: exclude.repositories is not UTF-8 text "
        "(invalid byte at offset 3)"
    ]
    assert not (tmp_path / "out").exists()


REPO_FILES = {
    "alpha/.git/HEAD": "ref: refs/heads/main\n",
    "alpha/app/db.py": "import sqlite3\nCONNECTION = sqlite3.connect(':memory:')\n",
    "alpha/app/models.py": "from app import db\n\nclass User:\n    table = 'users'\n",
    "beta/src/a.c": '#include "a.h"\nint a(void) { return 1; }\n',
}
ALONE = "def lonely():\n    return 'a row of the table with no repository'\n"


def test_repository_documents_list_their_files(tokenizer_model, tmp_path):
    """With `repos:`, a repository document's row names its repository and its files' ids;
    a document copied as it was keeps its own row, with its duplicates counted."""
    for rel, text in REPO_FILES.items():
        (tmp_path / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / rel).write_text(text)
    rows = [
        {"id": "r1", "repo_name": "delta", "path": "lib/p.py", "text": "def p():\n    pass\n"},
        {"id": "alone", "path": "alone.py", "text": ALONE},
        {"id": "again", "path": "again.py", "text": ALONE},  # an exact copy: one is kept
    ]
    (tmp_path / "table.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = {
        "output": {"path": str(tmp_path / "out"), "provenance": True},
        "seq_len": 256,
        "tokenizer": {"model": str(tokenizer_model)},
        "mix": {"ratio": {"code": 1}},
        "executor": {"tasks": 2, "workers": 1},
        "val_fraction": 0,
        "dedup": {"near": False},
        "filters": {"code": {"enabled": False}},
        "pii": {"enabled": False},
        "sources": [
            {
                "name": "tree",
                "domain": "code",
                "format": "files",
                "paths": [str(tmp_path / "tree")],
            },
            {
                "name": "table",
                "domain": "code",
                "format": "jsonl",
                "paths": [str(tmp_path / "table.jsonl")],
                "path_key": "path",
                "metadata_keys": ["repo_name"],
            },
        ],
        "repos": {"order": "path"},
    }
    out = tmp_path / "out"
    build(recipe_from_dict(raw))
    found = {row["id"]: (text, row) for _, _, text, row in documents(out)}
    repos = {row["repository"]: row for _, row in found.values() if row["files"] is not None}
    assert sorted(repos) == ["alpha", "beta", "delta"]
    assert sorted(repos["alpha"]["files"]) == ["tree/alpha/app/db.py", "tree/alpha/app/models.py"]
    assert repos["delta"]["files"] == ["table/r1"] and repos["delta"]["source"] == "table"
    for row in repos.values():
        text = found[row["id"]][0]
        assert row["domain"] == "code" and row["file"] is None and row["cluster_size"] == 1
        for rel, content in REPO_FILES.items():
            if rel.split("/")[0] == row["repository"] and ".git" not in rel:
                assert content in text
    (kept,) = [i for i in ("table/alone", "table/again") if i in found]
    text, row = found[kept]
    assert text == ALONE and row["files"] is None and row["cluster_size"] == 2
    assert row["line"] == (2 if kept == "table/alone" else 3) and row["path"] == kept[6:] + ".py"


def test_fim_documents_are_marked(corpus_dir, tokenizer_model, tmp_path):
    """The `fim` column is True exactly where the shard holds a FIM rewrite: there the text
    differs from the source's (markers, the middle moved), elsewhere it is the source's."""
    out = tmp_path / "out"
    raw = recipe(corpus_dir, out, tokenizer_model, fim={"rate": 0.5, "spm_rate": 0.5})
    m = build(recipe_from_dict(raw))
    marked = 0
    for _, _, text, row in documents(out):
        same = text == source_record(row)["text"]
        assert same != row["fim"], row
        marked += row["fim"]
        assert not row["fim"] or row["domain"] == "code"
    assert 0 < marked <= m["fim"]["counts"]["fim"]


def test_exports_carry_the_rows(built, tmp_path):
    """Megatron's `PREFIX.meta.parquet` is the shard's rows by sequence index (one document,
    one sequence), nanotron's `NNNNN.ds.meta.parquet` by document (and datatrove's folder
    reader still lists only the `.ds` files); OLMo's `.csv.gz` names each document's own id
    and source file; parquet's rows carry the provenance columns beside `input_ids`."""
    import csv
    import io

    from datatrove.utils.dataset import DatatroveFolderDataset

    from lemur.export.megatron import read_index
    from lemur.export.nanotron import ds_parts
    from lemur.export.run import export

    for fmt in ("megatron", "nanotron", "olmo", "parquet"):
        export(built, fmt, tmp_path / fmt)
    manifest = manifest_of(built)
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    size = np.dtype(manifest["dtype"]).itemsize
    listed = DatatroveFolderDataset(str(tmp_path / "nanotron" / "train"), 16, token_size=size)
    assert [Path(f.file_path).name for f in listed.files] == [
        f"{n:05d}.ds" for n in range(len(train))
    ]
    for n, shard in enumerate(train):
        rows = pq.read_table(built / shard["provenance"]).to_pylist()
        ends = np.fromfile(built / shard["index"], "<u8").astype(np.int64)
        prefix = tmp_path / "megatron" / "train" / f"{n:05d}"
        assert pq.read_table(f"{prefix}.meta.parquet").to_pylist() == rows
        ds = tmp_path / "nanotron" / "train" / f"{n:05d}.ds"
        assert pq.read_table(f"{ds}.meta.parquet").to_pylist() == rows
        assert ds_parts(ds, size)[1] == len(rows)
        assert len(read_index(Path(f"{prefix}.idx")).lengths) == len(rows)
        table = gzip.decompress((tmp_path / "olmo" / "train" / f"{n:05d}.csv.gz").read_bytes())
        lines = list(csv.reader(io.StringIO(table.decode())))
        assert [int(e) for _, e, _, _ in lines] == ends.tolist()
        assert [(i, src) for _, _, i, src in lines] == [(r["id"], r["file"]) for r in rows]
        table = pq.read_table(tmp_path / "parquet" / "train" / f"{n:05d}.parquet")
        assert table.drop(["input_ids"]).to_pylist() == rows  # beside each document's ids
        assert [len(x) for x in table["input_ids"].to_pylist()] == np.diff(ends, prepend=0).tolist()


def test_output_provenance_in_yaml_and_set(tmp_path):
    """`output: {path, provenance}` and `--set output.provenance=true` (after `--set output=`
    too) turn it on; off, the recipe and its hash are a plain `output: DIR`'s."""
    from lemur.data.recipe_loader import load_recipe

    source = {"name": "c", "domain": "code", "format": "files", "paths": [str(tmp_path)]}
    raw = {"output": str(tmp_path / "o"), "tokenizer": {"train": {}}, "sources": [source]}
    raw["mix"] = {"ratio": {"code": 1}}
    path = tmp_path / "r.yaml"
    (tmp_path / "f.py").write_text("x = 1\n")
    path.write_text(yaml.safe_dump(raw))
    plain = load_recipe(path, check_paths=False)
    on = load_recipe(path, ["output=" + str(tmp_path / "p"), "output.provenance=true"], False)
    assert plain.provenance is None and on.provenance is True and on.output == str(tmp_path / "p")
    off = recipe_from_dict({**raw, "output": {"path": raw["output"], "provenance": False}})
    assert off.sha256() == plain.sha256() and "provenance" not in off.to_dict()
    assert recipe_from_dict(on.to_dict()).provenance is True  # the manifest's form reloads
    with pytest.raises(RecipeError, match="output.paht: unknown key"):
        recipe_from_dict({**raw, "output": {"paht": "x"}})


def test_a_missing_documents_file_is_a_damaged_directory(built, tmp_path):
    """Listed in the manifest, a documents.parquet is part of the structure: its absence is
    found by the cheap start-up check (a rerun rebuilds) and by verify."""
    import shutil

    from lemur.shards.check import check_structure
    from lemur.shards.format import ShardFormatError

    copy = tmp_path / "copy"
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns(".work"))
    shard = manifest_of(copy)["shards"][-1]
    (copy / shard["provenance"]).unlink()
    missing = f"{copy / shard['provenance']}: shard file listed in the manifest is missing"
    with pytest.raises(ShardFormatError, match="documents.parquet: shard file listed"):
        check_structure(copy)
    assert verify(copy) == [missing]


def test_a_split_jsonl_files_rows_give_the_byte_where_their_line_starts(
    corpus_dir, tokenizer_model, tmp_path
):
    """A jsonl file read in byte-range parts cannot number its lines: a row gives the byte
    offset where its document's line starts, and the line there is the document."""
    out = tmp_path / "out"
    raw = recipe(corpus_dir, out, tokenizer_model)
    raw["executor"] = {**raw["executor"], "split_bytes": 8192}
    build(recipe_from_dict(raw))
    split = 0
    for _, _, text, row in documents(out):
        if not row["file"].endswith("a.jsonl"):
            continue
        assert row["line"] is None and row["byte"] is not None
        with open(row["file"], "rb") as fh:
            fh.seek(row["byte"])
            assert json.loads(fh.readline())["text"] == text
        split += 1
    assert split > 0


def test_cluster_size_counts_the_copies_dedup_removed(corpus_dir, tokenizer_model, tmp_path):
    """A file and two exact copies of it: one is kept, with cluster size 3; the rest 1."""
    code = tmp_path / "code"
    code.mkdir()
    files = sorted((corpus_dir / "code").glob("*.py"))[:6]
    for p in files:
        (code / p.name).write_bytes(p.read_bytes())
    for copy in ("copy1.py", "copy2.py"):
        (code / copy).write_bytes(files[0].read_bytes())
    raw = recipe(corpus_dir, tmp_path / "out", tokenizer_model)
    raw["sources"] = raw["sources"][:1]
    raw["sources"][0]["paths"] = [str(code)]
    raw["mix"] = {"ratio": {"code": 1}}
    m = build(recipe_from_dict(raw))
    assert m["counts"]["duplicates"] == 2
    sizes = {row["path"]: row["cluster_size"] for _, _, _, row in documents(tmp_path / "out")}
    kept = [p for p in (files[0].name, "copy1.py", "copy2.py") if p in sizes]
    assert len(kept) == 1 and sizes[kept[0]] == 3
    assert sorted(sizes.values()) == [1] * (len(files) - 1) + [3]

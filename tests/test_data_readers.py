"""Readers on small real files: jsonl metadata, parquet (The Stack preset), notebooks,
file trees (.gitignore, vendored, binary), and a source that yields nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl

from lemur.data.build import BuildError, build
from lemur.data.notebooks import NotebookError, notebook_to_script
from lemur.data.readers import SourcesReader, list_inputs
from lemur.data.recipe import recipe_from_dict

NOTEBOOK = {
    "nbformat": 4,
    "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
    "cells": [
        {"cell_type": "markdown", "source": ["# Title\n", "Some *notes*."]},
        {
            "cell_type": "code",
            "source": ["import os\n", "print(os.sep)"],
            "outputs": [{"output_type": "stream", "text": ["/\n"]}],
        },
        {"cell_type": "code", "source": "", "outputs": []},
        {"cell_type": "code", "source": ["x = 1"], "outputs": []},
    ],
}
SCRIPT = "# # Title\n# Some *notes*.\n\nimport os\nprint(os.sep)\n\nx = 1\n"


def recipe(tmp_path: Path, sources: list[dict], **kw) -> dict:
    domains = {s["domain"] for s in sources}
    return {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 400}},
        "mix": {"ratio": {d: 1 for d in domains}},
        "executor": {"tasks": 1, "workers": 1},
        "filters": NO_FILTERS,
        **kw,
        "sources": sources,
    }


def read_all(raw: dict) -> tuple[list, SourcesReader]:
    r = recipe_from_dict(raw)
    listing = list_inputs(r)
    reader = SourcesReader(listing.files, r.sources, errors_dir="")
    docs = [d for f in listing.files for d in reader.read(f)]
    return docs, reader


def test_notebook_conversion():
    text, lang = notebook_to_script(json.dumps(NOTEBOOK))
    assert text == SCRIPT and lang == "python"
    js = dict(NOTEBOOK, metadata={"kernelspec": {"language": "javascript"}})
    assert notebook_to_script(js)[0].startswith("// # Title\n")
    with pytest.raises(NotebookError, match="invalid notebook JSON"):
        notebook_to_script("{not json")
    with pytest.raises(NotebookError, match="no 'cells' list"):
        notebook_to_script("{}")


def test_notebooks_as_files_and_inside_jsonl(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "analysis.ipynb").write_text(json.dumps(NOTEBOOK))
    (repo / "broken.ipynb").write_text("{oops")
    write_jsonl(tmp_path / "nb.jsonl", [{"id": "n1", "content": json.dumps(NOTEBOOK)}])
    docs, reader = read_all(
        recipe(
            tmp_path,
            [
                {"name": "repo", "domain": "code", "format": "files", "paths": [str(repo)]},
                {
                    "name": "stack-nb",
                    "domain": "code",
                    "format": "jsonl",
                    "paths": [str(tmp_path / "nb.jsonl")],
                    "text_key": "content",
                },
            ],
        )
    )
    assert [d.text for d in docs] == [SCRIPT, SCRIPT]
    assert all(d.metadata["language"] == "Jupyter Notebook" for d in docs)
    assert [(Path(e["file"]).name, e["kind"]) for e in reader._errors] == [
        ("broken.ipynb", "invalid_notebook")
    ]


def test_jsonl_metadata_passthrough(tmp_path):
    write_jsonl(
        tmp_path / "d.jsonl",
        [
            {
                "doc_id": "a1",
                "body": "hello world",
                "url": "https://x.org/a",
                "lang": "en",
                "junk": 1,
            },
            {"body": "no id here", "url": "https://x.org/b"},
        ],
    )
    docs, _ = read_all(
        recipe(
            tmp_path,
            [
                {
                    "name": "web",
                    "domain": "text",
                    "format": "jsonl",
                    "paths": [str(tmp_path / "d.jsonl")],
                    "text_key": "body",
                    "id_key": "doc_id",
                    "metadata_keys": ["url"],
                },
            ],
        )
    )
    assert [d.id for d in docs] == ["web/a1", "web/d.jsonl:2"]
    assert docs[0].metadata["url"] == "https://x.org/a" and docs[0].metadata["language"] == "en"
    assert "junk" not in docs[0].metadata and docs[0].metadata["path"] == "d.jsonl"


def test_parquet_the_stack_preset(tmp_path):
    files = real_python_files(5)
    table = pa.table(
        {
            "hexsha": [f"h{i}" for i in range(5)],
            "content": [p.read_text() for p in files],
            "lang": ["Python"] * 5,
            "max_stars_repo_path": [f"src/{p.name}" for p in files],
            "max_stars_repo_name": ["org/repo"] * 5,
            "ext": ["py"] * 5,
            "size": [p.stat().st_size for p in files],
            "unused": list(range(5)),
        }
    )
    pq.write_table(table, tmp_path / "stack.parquet", row_group_size=2)
    pq.write_table(pa.table({"url": ["u"], "content": ["web text here"]}), tmp_path / "rw.parquet")
    pq.write_table(pa.table({"other": ["x"]}), tmp_path / "nocol.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    docs, reader = read_all(
        recipe(
            tmp_path,
            [
                {
                    "name": "stack",
                    "domain": "code",
                    "preset": "the-stack",
                    "paths": [
                        str(tmp_path / "stack.parquet"),
                        str(tmp_path / "nocol.parquet"),
                        str(tmp_path / "bad.parquet"),
                    ],
                },
                {
                    "name": "rw",
                    "domain": "text",
                    "preset": "refinedweb",
                    "paths": [str(tmp_path / "rw.parquet")],
                },
            ],
        )
    )
    stack = [d for d in docs if d.metadata["source"] == "stack"]
    assert [d.text for d in stack] == [p.read_text() for p in files]
    assert stack[0].id == "stack/h0" and stack[0].metadata["path"] == f"src/{files[0].name}"
    assert (
        stack[0].metadata["language"] == "Python"
        and stack[0].metadata["max_stars_repo_name"] == "org/repo"
    )
    rw = [d for d in docs if d.metadata["source"] == "rw"]
    assert rw[0].id == "rw/u" and rw[0].metadata["url"] == "u"
    kinds = sorted((Path(e["file"]).name, e["kind"]) for e in reader._errors)
    assert kinds == [("bad.parquet", "corrupt_file"), ("nocol.parquet", "missing_text")]


def test_file_tree_gitignore_vendored_binary(tmp_path):
    repo = tmp_path / "repo"
    for d in ("src", "build", "vendor/lib", "node_modules/pkg", ".git", "sub"):
        (repo / d).mkdir(parents=True)
    (repo / ".gitignore").write_text("build/\n*.log\n")
    (repo / "sub" / ".gitignore").write_text("secret.py\n")
    (repo / "src" / "main.py").write_text("print('hi')\n")
    (repo / "sub" / "ok.py").write_text("x = 1\n")
    (repo / "sub" / "secret.py").write_text("x = 2\n")
    (repo / "build" / "gen.py").write_text("x = 3\n")
    (repo / "debug.log").write_text("log line\n")
    (repo / "vendor" / "lib" / "dep.py").write_text("x = 4\n")
    (repo / "node_modules" / "pkg" / "index.js").write_text("x = 5\n")
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00binary")
    r = recipe_from_dict(
        recipe(
            tmp_path, [{"name": "repo", "domain": "code", "format": "files", "paths": [str(repo)]}]
        )
    )
    listing = list_inputs(r)
    assert sorted(f.rel for f in listing.files) == ["logo.png", "src/main.py", "sub/ok.py"]
    assert listing.skipped["repo"] == {"gitignored": 3, "vendored": 1, "tool_directory": 2}
    reader = SourcesReader(listing.files, r.sources, errors_dir="")
    docs = [d for f in listing.files for d in reader.read(f)]
    assert sorted(d.metadata["path"] for d in docs) == ["src/main.py", "sub/ok.py"]
    assert [e["kind"] for e in reader._errors] == ["binary"]


def test_source_with_no_documents_is_fatal(tmp_path):
    (tmp_path / "bad.jsonl").write_text("{nope\n[1,2]\n")
    docs = real_text_docs(3)
    write_jsonl(tmp_path / "ok.jsonl", docs)
    raw = recipe(
        tmp_path,
        [
            {
                "name": "good",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "ok.jsonl")],
            },
            {
                "name": "broken",
                "domain": "text",
                "format": "jsonl",
                "paths": [str(tmp_path / "bad.jsonl")],
            },
        ],
    )
    with pytest.raises(
        BuildError,
        match=r"source 'broken' yielded no documents \(2 input errors; first error: .*bad.jsonl",
    ):
        build(recipe_from_dict(raw))


def test_jsonl_bad_streams_lines_and_paths(tmp_path):
    import zstandard

    docs = real_text_docs(79)  # ~470 KB: several 128 KB zstd blocks, so a cut keeps some
    full = zstandard.ZstdCompressor().compress("".join(json.dumps(d) + "\n" for d in docs).encode())
    (tmp_path / "trunc.jsonl.zst").write_bytes(full[: len(full) * 3 // 4])
    good = json.dumps(docs[0]).encode()
    (tmp_path / "utf8.jsonl").write_bytes(
        good + b"\n" + b'{"text": "caf\xe9"}\n' + json.dumps(docs[1]).encode() + b"\n"
    )
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "does-not-exist.jsonl")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    docs_read, reader = read_all(
        recipe(
            tmp_path,
            [
                {
                    "name": "t",
                    "domain": "text",
                    "format": "jsonl",
                    "paths": [str(tmp_path / "*.jsonl*")],
                },
            ],
        )
    )
    errors = sorted((Path(e["file"]).name, e["kind"], e.get("line")) for e in reader._errors)
    assert ("utf8.jsonl", "invalid_utf8", 2) in errors
    assert ("gone.jsonl", "unreadable", None) in errors
    assert any(name == "trunc.jsonl.zst" and kind == "corrupt_file" for name, kind, _ in errors)
    assert len(errors) == 3
    texts = [d.text for d in docs_read]
    assert docs[0]["text"] in texts and docs[1]["text"] in texts  # neighbours of the bad line
    from_trunc = [d for d in docs_read if d.metadata["path"] == "trunc.jsonl.zst"]
    assert 0 < len(from_trunc) < 79  # the readable part of the truncated stream is kept
    assert [d.text for d in from_trunc] == [d["text"] for d in docs[: len(from_trunc)]]

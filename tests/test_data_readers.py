"""Readers on small real files: jsonl metadata, parquet (The Stack preset), notebooks,
file trees (.gitignore, vendored, binary), and a source that yields nothing."""

from __future__ import annotations

import codecs
import gzip
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl

from lemur.data.build import BuildError, build
from lemur.data.corpus import corpus_of
from lemur.data.read.listing import list_inputs
from lemur.data.read.notebooks import NotebookError, notebook_to_script
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe_loader import recipe_from_dict

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
    assert [(Path(e["file"]).name, e["kind"]) for e in reader.log.errors] == [
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
    kinds = sorted((Path(e["file"]).name, e["kind"]) for e in reader.log.errors)
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
    assert [e["kind"] for e in reader.log.errors] == ["binary"]


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
    errors = sorted((Path(e["file"]).name, e["kind"], e.get("line")) for e in reader.log.errors)
    assert ("utf8.jsonl", "invalid_utf8", 2) in errors
    assert ("gone.jsonl", "unreadable", None) in errors
    assert any(name == "trunc.jsonl.zst" and kind == "corrupt_file" for name, kind, _ in errors)
    assert len(errors) == 3
    texts = [d.text for d in docs_read]
    assert docs[0]["text"] in texts and docs[1]["text"] in texts  # neighbours of the bad line
    from_trunc = [d for d in docs_read if d.metadata["path"] == "trunc.jsonl.zst"]
    assert 0 < len(from_trunc) < 79  # the readable part of the truncated stream is kept
    assert [d.text for d in from_trunc] == [d["text"] for d in docs[: len(from_trunc)]]


def test_a_lone_surrogate_escape_becomes_u_fffd_and_is_counted(tmp_path):
    """`"\\ud800"` is valid JSON but half a UTF-16 pair (orjson refuses it): the document is
    kept with U+FFFD there, in keys and metadata too, and counted; a line refused for
    another reason stays an error, and a repaired line that makes no document (no text) is
    not counted among the documents kept after a repair (it was, beside its error)."""
    lines = [
        r'{"text": "before \ud800 after", "url": "u\udfff"}',  # lone high, lone low
        r'{"text": "pair \ud83d\ude00 ok"}',  # a pair escaped in halves: orjson reads it
        r'{"text": "key", "k\udc00": 1}',
        r'{"text": "\ud800 and NaN", "n": NaN}',  # NaN is not JSON: still invalid
        r'{"text": "escaped \\ud800 backslash", }',  # no surrogate: its error stays
        r'{"te\ud800xt": "no text"}',  # repaired, but no document: not counted as kept
    ]
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    source = {
        "name": "s",
        "domain": "text",
        "format": "jsonl",
        "paths": [str(tmp_path / "s.jsonl")],
    }
    docs, reader = read_all(recipe(tmp_path, [{**source, "metadata_keys": ["url"]}]))
    assert [d.text for d in docs] == ["before \ufffd after", "pair \U0001f600 ok", "key"]
    assert docs[0].metadata["url"] == "u\ufffd"
    stats = {k: v.total for k, v in reader.stats.stats.items()}
    assert stats["repaired:s:lone_surrogate"] == 2
    assert _errors(reader) == [
        ("s.jsonl", "invalid_json", 4),
        ("s.jsonl", "invalid_json", 5),
        ("s.jsonl", "missing_text", 6),
    ]


# ------------------------------------------------------------------ bad input (issue 12)


def _errors(reader: SourcesReader) -> list[tuple[str, str, int | None]]:
    return sorted((Path(e["file"]).name, e["kind"], e.get("line")) for e in reader.log.errors)


@pytest.mark.parametrize(
    "nb, message",
    [
        ({"nbformat": 4, "metadata": "x", "cells": []}, "'metadata' is not a mapping"),
        (
            {"nbformat": 4, "metadata": {"kernelspec": "py"}, "cells": []},
            "'metadata.kernelspec' is not a mapping",
        ),
        (
            {"nbformat": 4, "metadata": {"kernelspec": {"language": 3}}, "cells": []},
            "'metadata.kernelspec.language' is not a string",
        ),
        ({"nbformat": 4, "cells": [{"cell_type": "code", "source": [1, 2]}]}, "cell 0: 'source'"),
        ({"nbformat": 4, "cells": [{"cell_type": "code", "source": None}]}, "cell 0: 'source'"),
        ({"nbformat": 4, "cells": ["x"]}, "cell 0 is not a mapping"),
        ('{"nbformat": 4, "cells": []' + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "JSON"),
    ],
)
def test_malformed_notebook_is_a_notebook_error(nb, message):
    with pytest.raises(NotebookError, match=message):
        notebook_to_script(nb if isinstance(nb, str) else json.dumps(nb))


def test_malformed_notebooks_skip_only_their_document(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "good.ipynb").write_text(json.dumps(NOTEBOOK))
    (repo / "meta.ipynb").write_text(json.dumps(dict(NOTEBOOK, metadata="x")))
    (repo / "deep.ipynb").write_text('{"cells": [], "nbformat": 4, "x": ' + "[" * 50_000 + "}")
    bad_cell = dict(NOTEBOOK, cells=[{"cell_type": "code", "source": [1]}])
    write_jsonl(
        tmp_path / "nb.jsonl",
        [
            {"content": json.dumps(bad_cell)},
            {"content": json.dumps(NOTEBOOK)},
            {"content": json.dumps(dict(NOTEBOOK, metadata={"kernelspec": [1]}))},
        ],
    )
    sources = [
        {"name": "repo", "domain": "code", "format": "files", "paths": [str(repo)]},
        {
            "name": "rows",
            "domain": "code",
            "format": "jsonl",
            "paths": [str(tmp_path / "nb.jsonl")],
            "text_key": "content",
        },
    ]
    docs, reader = read_all(recipe(tmp_path, sources))
    assert [d.text for d in docs] == [SCRIPT, SCRIPT]
    assert _errors(reader) == [
        ("deep.ipynb", "invalid_notebook", None),
        ("meta.ipynb", "invalid_notebook", None),
        ("nb.jsonl", "invalid_notebook", 1),
        ("nb.jsonl", "invalid_notebook", 3),
    ]


@pytest.mark.parametrize("skip_vendored", [True, False])
def test_non_utf8_file_name_is_kept_with_an_escaped_id(tmp_path, skip_vendored):
    from lemur.data.encode.prepare import sample_texts

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "ok.py").write_text("x = 1\n")
    with open(os.path.join(os.fsencode(repo), b"caf\xe9_name.py"), "w") as fh:
        fh.write("print('caf\u00e9')\n")
    source = {"name": "repo", "domain": "code", "format": "files", "paths": [str(repo)]}
    raw = recipe(tmp_path, [dict(source, skip_vendored=skip_vendored)])
    docs, reader = read_all(raw)
    assert sorted(d.id for d in docs) == ["repo/caf\\xe9_name.py", "repo/ok.py"]
    for d in docs:  # what the tokenize step and the manifest do with names
        d.id.encode()
        json.dumps(d.metadata["path"]).encode()
    assert "print('caf\u00e9')\n" in [d.text for d in docs] and not reader.log.errors
    r = recipe_from_dict(raw)
    assert len(list(sample_texts(r, list_inputs(r).files, 1000))) == 2


def test_non_utf8_name_with_a_backslash_is_escaped_losslessly():
    from lemur.data.read.listing import display_name

    raw = b"a\\x\xff.py"
    shown = display_name(os.fsdecode(raw))
    assert shown == "a\\\\x\\xff.py"
    assert shown.encode().decode("unicode_escape").encode("latin-1") == raw
    assert display_name("plain/caf\u00e9.py") == "plain/caf\u00e9.py"


def test_invalid_gitignore_lines_are_skipped_with_one_warning(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "build").mkdir(parents=True)
    (repo / ".gitignore").write_text("build/\n!\n[z-a]\n*.log\n")
    (repo / "main.py").write_text("x = 1\n")
    (repo / "debug.log").write_text("log\n")
    (repo / "build" / "gen.py").write_text("x = 2\n")
    r = recipe_from_dict(
        recipe(tmp_path, [{"name": "r", "domain": "code", "format": "files", "paths": [str(repo)]}])
    )
    for _ in range(2):
        listing = list_inputs(r)
        assert [f.rel for f in listing.files] == ["main.py"]
        assert listing.skipped["r"] == {"gitignored": 2}
    warnings = capsys.readouterr().err.strip().splitlines()
    gitignore = repo / ".gitignore"
    assert len(warnings) == 2
    assert warnings[0].startswith(f"lemur-data: warning: {gitignore}:2: invalid .gitignore pattern")
    assert warnings[1].startswith(f"lemur-data: warning: {gitignore}:3: invalid .gitignore pattern")


def test_unreadable_subdirectory_is_counted_and_named(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "secret").mkdir(parents=True)
    (repo / "secret" / "a.py").write_text("x = 1\n")
    (repo / "main.py").write_text("x = 2\n")
    scandir = os.scandir

    def denied(path="."):
        # We run as root in CI, where chmod 000 does not stop reading: fail like EACCES.
        if str(path) == str(repo / "secret"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    docs, reader = read_all(
        recipe(tmp_path, [{"name": "r", "domain": "code", "format": "files", "paths": [str(repo)]}])
    )
    assert [d.metadata["path"] for d in docs] == ["main.py"]
    assert [(e["file"], e["kind"]) for e in reader.log.errors] == [
        (str(repo / "secret"), "unreadable")
    ]
    assert "Permission denied" in reader.log.errors[0]["error"]


def _text_source(tmp_path: Path, pattern: str, fmt: str = "jsonl") -> dict:
    return recipe(
        tmp_path,
        [{"name": "t", "domain": "text", "format": fmt, "paths": [str(tmp_path / pattern)]}],
    )


def test_bom_xz_and_utf16_jsonl(tmp_path):
    import lzma

    rows = real_text_docs(3)
    body = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "bom.jsonl").write_bytes(codecs.BOM_UTF8 + body.encode())
    (tmp_path / "data.jsonl.xz").write_bytes(lzma.compress(body.encode()))
    (tmp_path / "utf16.jsonl").write_bytes(body.encode("utf-16"))
    (tmp_path / "utf16le.jsonl").write_bytes(body.encode("utf-16-le"))
    (tmp_path / "gzip-named-plain.jsonl").write_bytes(gzip.compress(body.encode()))
    docs, reader = read_all(_text_source(tmp_path, "*.jsonl*"))
    assert [d.text for d in docs] == [r["text"] for r in rows] * 2  # bom.jsonl, gzip-named...
    assert _errors(reader) == [
        ("data.jsonl.xz", "unsupported_format", None),
        ("utf16.jsonl", "unsupported_format", None),
        ("utf16le.jsonl", "unsupported_format", None),
    ]
    messages = {Path(e["file"]).name: e["error"] for e in reader.log.errors}
    assert messages["utf16.jsonl"].startswith("UTF-16 text is not supported")
    assert messages["utf16le.jsonl"].startswith("UTF-16 or UTF-32 text is not supported")
    assert messages["data.jsonl.xz"].startswith("xz compression is not supported")


def test_damaged_zstd_frames_keep_the_readable_ones(tmp_path):
    import zstandard

    rows = real_text_docs(40)
    frames = [rows[i : i + 10] for i in range(0, 40, 10)]
    blobs = [
        zstandard.ZstdCompressor(write_checksum=True).compress(
            "".join(json.dumps(r) + "\n" for r in frame).encode()
        )
        for frame in frames
    ]
    damaged = bytearray(blobs[1])
    for i in range(len(damaged) // 2, len(damaged) // 2 + 64):
        damaged[i] ^= 0xFF
    (tmp_path / "multi.jsonl.zst").write_bytes(blobs[0] + bytes(damaged) + blobs[2] + blobs[3])
    # One frame damaged near its end: everything before the damage is still read.
    single = zstandard.ZstdCompressor(write_checksum=True).compress(
        "".join(json.dumps(r) + "\n" for r in rows).encode()
    )
    single = bytearray(single)
    single[-200] ^= 0xFF
    (tmp_path / "single.jsonl.zst").write_bytes(bytes(single))
    docs, reader = read_all(_text_source(tmp_path, "*.zst"))
    from_multi = [d.text for d in docs if d.metadata["path"] == "multi.jsonl.zst"]
    for frame in (frames[0], frames[2], frames[3]):
        assert all(r["text"] in from_multi for r in frame)
    damage = [e for e in reader.log.errors if e["kind"] == "corrupt_file"]
    assert [Path(e["file"]).name for e in damage] == ["multi.jsonl.zst", "single.jsonl.zst"]
    assert f"zstd frame at byte {len(blobs[0])} is damaged" in damage[0]["error"]
    assert "resumed at byte" in damage[0]["error"]
    from_single = [d.text for d in docs if d.metadata["path"] == "single.jsonl.zst"]
    assert len(from_single) >= 20 and from_single == [r["text"] for r in rows[: len(from_single)]]


def test_damaged_parquet_row_group_keeps_the_others(tmp_path):
    texts = [f"row {i} " + "text " * 200 for i in range(30)]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10, compression="zstd")
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    for i in range(start + 8, start + 40):  # the first page's header
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    docs, reader = read_all(_text_source(tmp_path, "t.parquet", "parquet"))
    assert [d.text for d in docs] == texts[:10] + texts[20:]
    assert _errors(reader) == [("t.parquet", "corrupt_file", 11)]
    assert "row group 1 (rows 11-20) unreadable" in reader.log.errors[0]["error"]


def test_per_file_error_totals_survive_the_error_list_cap(tmp_path):
    from lemur.data.counts import collect_counts
    from lemur.data.read.sources import MAX_ERRORS_PER_TASK

    n = MAX_ERRORS_PER_TASK + 200
    (tmp_path / "a.jsonl").write_text("{bad\n" * n)
    (tmp_path / "b.jsonl").write_text('{"text": "ok"}\n{bad\n{bad\n')
    r = recipe_from_dict(_text_source(tmp_path, "*.jsonl"))
    listing = list_inputs(r)
    work = tmp_path / "work"
    reader = SourcesReader(listing.files, r.sources, errors_dir=str(work / "errors"))
    assert len(list(reader.run())) == 1
    (work / "logs" / "stats").mkdir(parents=True)
    (work / "logs" / "stats" / "00000.json").write_text("[]")
    counts = collect_counts(work, r, corpus_of(r), 1, listing)
    assert len(counts["errors"]) == MAX_ERRORS_PER_TASK  # b.jsonl's errors are past the cap
    assert counts["errors_by_file"] == {str(tmp_path / "a.jsonl"): n, str(tmp_path / "b.jsonl"): 2}


def test_the_tokenizer_sample_does_not_depend_on_the_corpus_folder(tmp_path):
    """The same files under two folders give the same tokenizer sample, in the same order."""
    from lemur.data.encode.prepare import sample_texts

    samples = []
    for folder in ("first_copy", "elsewhere/second"):
        root = tmp_path / folder / "repo"
        root.mkdir(parents=True)
        for i in range(30):
            (root / f"mod_{i:02d}.py").write_text(f"VALUE_{i} = {i}\n" * 20)
        source = {"name": "repo", "domain": "code", "format": "files", "paths": [str(root)]}
        r = recipe_from_dict(recipe(tmp_path / folder, [source]))
        samples.append(list(sample_texts(r, list_inputs(r).files, 2000)))
    assert 1 < len(samples[0]) < 30  # the budget takes a part: the order decides which
    assert samples[0] == samples[1]

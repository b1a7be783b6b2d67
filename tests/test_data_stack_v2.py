"""The Stack v2 reader against a local S3 server: Stack-v2-shaped metadata parquet, gzip blobs
by id; filters before any fetch; bad blobs counted by reason with their URL named."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import NO_FILTERS, real_python_files

pytest.importorskip("moto", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the base install) reads s3:// paths")

from s3_local import FaultProxy, moto_s3, options, upload  # noqa: E402

from lemur.data.build import build  # noqa: E402
from lemur.data.read.exclude import exclusions_of  # noqa: E402
from lemur.data.read.listing import list_inputs  # noqa: E402
from lemur.data.read.sources import SourcesReader  # noqa: E402
from lemur.data.read.stack_v2 import skip_reason  # noqa: E402
from lemur.data.recipe.errors import RecipeError  # noqa: E402
from lemur.data.recipe_loader import recipe_from_dict  # noqa: E402

BUCKET = "swh"
LATIN1 = "# caf\u00e9 cr\u00e8me\nprint('na\u00efve')\n"


def row(blob: str, repo: str, path: str, **kw) -> dict:
    """A metadata row of The Stack v2's shape (the columns the reader reads, and more)."""
    return {
        "blob_id": blob,
        "directory_id": "d" + blob,
        "path": path,
        "content_id": "c" + blob,
        "detected_licenses": ["MIT"],
        "license_type": "permissive",
        "repo_name": repo,
        "src_encoding": "UTF-8",
        "language": "Python",
        "is_vendor": False,
        "is_generated": False,
        "length_bytes": 100,
        "extension": "py",
        "star_events_count": 3,
        **kw,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(server endpoint, metadata parquet path, expected good texts by blob id)."""
    root = tmp_path_factory.mktemp("stack-v2")
    good = {f"{i:040x}": p.read_text() for i, p in enumerate(real_python_files(8), start=1)}
    rows = [row(b, f"org/repo{i % 2}", f"src/m{i}.py") for i, b in enumerate(good)]
    blobs = {f"content/{b}": gzip.compress(t.encode()) for b, t in good.items()}
    # A file in Latin-1, named so: decoded right.
    blobs["content/" + "a" * 40] = gzip.compress(LATIN1.encode("latin-1"))
    rows.append(row("a" * 40, "org/latin", "l.py", src_encoding="ISO-8859-1"))
    good["a" * 40] = LATIN1
    # Bad blobs: missing, not gzip, bytes not in their encoding, an unknown encoding.
    rows.append(row("b" * 40, "org/bad", "missing.py"))
    blobs["content/" + "c" * 40] = b"not gzip at all"
    rows.append(row("c" * 40, "org/bad", "corrupt.py"))
    blobs["content/" + "d" * 40] = gzip.compress("caf\u00e9".encode("latin-1"))
    rows.append(row("d" * 40, "org/bad", "mislabelled.py", src_encoding="UTF-8"))
    blobs["content/" + "e" * 40] = gzip.compress(b"x = 1\n")
    rows.append(row("e" * 40, "org/bad", "odd.py", src_encoding="no-such-codec"))
    # Filtered from metadata: their blobs exist but must never be requested.
    for blob, kw in (
        ("f" * 40, {"license_type": "no_license", "detected_licenses": []}),
        ("1" * 40, {"is_vendor": True}),
        ("2" * 40, {"is_generated": True}),
    ):
        blobs[f"content/{blob}"] = gzip.compress(b"print('filtered')\n")
        rows.append(row(blob, "org/filtered", f"{blob[:4]}.py", **kw))
    meta = root / "python.parquet"
    pq.write_table(pa.Table.from_pylist(rows), meta, row_group_size=4)
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        upload(endpoint, BUCKET, blobs)
        yield endpoint, meta, good


def source(paths: list[str], content_opts: dict, **kw) -> dict:
    """A stack-v2 source over the test bucket."""
    return {
        "name": "stack",
        "domain": "code",
        "format": "stack-v2",
        "paths": paths,
        "content_url": f"s3://{BUCKET}/content/{{blob_id}}",
        "content_storage_options": content_opts,
        "licenses": ["permissive"],
        **kw,
    }


def recipe(tmp: Path, src: dict, **kw) -> dict:
    """A build recipe of one stack-v2 source and a small text source."""
    text = tmp / "text.jsonl"
    text.write_text('{"text": "A small English text about reading code from a bucket."}\n' * 3)
    return {
        "output": str(tmp / "out"),
        "seq_len": 128,
        "tokenizer": {"train": {"vocab_size": 400}},
        "mix": {"ratio": {"code": 1, "text": 1}},
        "executor": {"tasks": 2, "workers": 1},
        "filters": NO_FILTERS,
        "sources": [src, {"name": "t", "domain": "text", "paths": [str(text)], "format": "jsonl"}],
        **kw,
    }


def read_all(raw: dict) -> tuple[list, Counter, list]:
    """Documents, stat counts and error records of reading every input of a recipe."""
    r = recipe_from_dict(raw)
    files = [f for f in list_inputs(r).files if f.source == 0]
    stats: Counter[str] = Counter()
    reader = SourcesReader(files, r.sources, errors_dir="", exclusions=exclusions_of(r))
    reader.log.stat_update = lambda *labels, value=1: stats.update(dict.fromkeys(labels, value))
    reader.log.remote.stat_update = reader.log.stat_update
    docs = [d for f in files for d in reader.read(f)]
    return docs, stats, reader.log.errors


def test_blobs_fetched_decoded_and_filtered_before_any_fetch(stack, tmp_path):
    """Kept rows become documents with their text, language, repo_name and path, in metadata
    order; filtered rows are counted and their blobs never requested; bad blobs are counted
    by reason, each error naming the blob's URL."""
    endpoint, meta, good = stack
    with FaultProxy(endpoint) as proxy:
        docs, stats, errors = read_all(
            recipe(tmp_path, source([str(meta)], options(proxy.endpoint)))
        )
        requested = [p for m, p in proxy.requests if m == "GET"]
    assert [d.text for d in docs] == list(good.values())
    first = docs[0].metadata
    assert first["repo_name"] == "org/repo0" and first["path"] == "src/m0.py"
    assert first["language"] == "Python" and first["blob_id"] == f"{1:040x}"
    assert docs[0].id == f"stack/{1:040x}"
    assert not any(b * 40 in p for b in "f12" for p in requested)  # filtered: never fetched
    assert len(requested) == len(good) + 4  # each kept blob once, the bad ones included
    assert stats["read:stack"] == len(good) + 3  # the dropped are read, then dropped
    assert {k: v for k, v in stats.items() if k.startswith("dropped:")} == {
        "dropped:stack:license": 1,
        "dropped:stack:vendored": 1,
        "dropped:stack:generated": 1,
    }
    by_kind = Counter(e["kind"] for e in errors)
    assert by_kind == {"blob_missing": 1, "blob_corrupt": 1, "blob_undecodable": 2}
    for e in errors:
        assert f"s3://{BUCKET}/content/" in e["error"] and e["file"] == str(meta)
    assert stats["remote_failures:stack"] == 1  # the missing object
    assert stats["remote_requests:stack"] == len(requested)


def test_opted_out_rows_are_dropped_before_their_blob_is_fetched(stack, tmp_path):
    """The recipe's `exclude:` lists (an opt-out): a listed repository's rows and a listed
    blob id's are counted `excluded` and their blobs never requested."""
    endpoint, meta, good = stack
    blobs = list(good)[:8]  # rows i of repository org/repo{i % 2}
    (tmp_path / "repos.txt").write_text("org/repo1\n")
    (tmp_path / "ids.txt").write_text(blobs[0] + "\n")
    gone = {blobs[0], *blobs[1::2]}
    exclude = {"repositories": str(tmp_path / "repos.txt"), "ids": str(tmp_path / "ids.txt")}
    with FaultProxy(endpoint) as proxy:
        raw = recipe(tmp_path, source([str(meta)], options(proxy.endpoint)), exclude=exclude)
        docs, stats, _ = read_all(raw)
        requested = [p for m, p in proxy.requests if m == "GET"]
    assert [d.text for d in docs] == [t for b, t in good.items() if b not in gone]
    assert not any(b in p for b in gone for p in requested)  # never fetched
    assert stats["dropped:stack:excluded"] == len(gone) == 5
    assert stats["read:stack"] == len(good) + 3  # as without the lists: read, then dropped


def test_remote_metadata_split_by_row_groups(stack, tmp_path):
    """Metadata read from s3:// too, in row-group parts, gives the same documents."""
    endpoint, meta, good = stack
    upload(endpoint, BUCKET, {"meta/python.parquet": meta.read_bytes()})
    src = source([f"s3://{BUCKET}/meta/"], options(endpoint), storage_options=options(endpoint))
    raw = recipe(tmp_path, src)
    raw["executor"]["split_bytes"] = 600
    r = recipe_from_dict(raw)
    assert {f.unit for f in list_inputs(r).files if f.source == 0} == {"row_groups"}
    docs, _, errors = read_all(raw)
    assert [d.text for d in docs] == list(good.values()) and len(errors) == 4


def test_stack_v2_build_and_recipe_checks(stack, tmp_path):
    """A whole build of a stack-v2 source; its keys are checked like every recipe key."""
    endpoint, meta, good = stack
    manifest = build(recipe_from_dict(recipe(tmp_path, source([str(meta)], options(endpoint)))))
    counts = manifest["counts"]["sources"]["stack"]
    assert counts["read"] == len(good) + 3 and counts["errors"] == 4
    assert counts["dropped"] == {"license": 1, "vendored": 1, "generated": 1}
    with pytest.raises(RecipeError, match=r"sources\[0\].content_url must contain"):
        recipe_from_dict(recipe(tmp_path, {**source([str(meta)], {}), "content_url": "s3://x/"}))
    with pytest.raises(RecipeError, match=r"sources\[1\].licenses is only for format stack-v2"):
        bad = recipe(tmp_path, source([str(meta)], {}))
        bad["sources"][1]["licenses"] = ["permissive"]
        recipe_from_dict(bad)


def test_skip_reason_defaults():
    """Vendored and generated files are skipped unless asked for; licenses only if listed."""
    r = recipe_from_dict(
        {
            "output": "o",
            "tokenizer": {"train": {}},
            "mix": {"ratio": {"code": 1}},
            "sources": [
                {"name": "s", "domain": "code", "preset": "the-stack-v2", "paths": ["s3://b/m"]}
            ],
        },
        check_paths=False,
    )
    s = r.sources[0]
    assert s.format == "stack-v2" and s.content_url is None  # Software Heritage's bucket
    assert skip_reason(row("x", "r", "p"), s) is None
    assert skip_reason(row("x", "r", "p", license_type="no_license"), s) is None
    assert skip_reason(row("x", "r", "p", is_generated=True), s) == "generated"
    assert skip_reason(row("x", "r", "p", is_vendor=True), s) == "vendored"

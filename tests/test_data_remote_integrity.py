"""Remote sources: security and integrity (issue #44 items 13, 15, 16, 17, 18), against a real
S3 server on 127.0.0.1 (moto's): no credential in a printed traceback or a task log, a build
that met a remote failure is not complete and a rerun redoes it, an object rewritten since it
was listed is named and never read as a mix of versions, a Stack v2 blob is gunzipped with a
cap, and a content_url template is checked against its fields up front."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tracemalloc
import zlib
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl

pytest.importorskip("moto", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the base install) reads s3:// paths")

from s3_local import FaultProxy, moto_s3, options, upload  # noqa: E402

from lemur.data.build import BuildError, build  # noqa: E402
from lemur.data.read.listing import list_inputs  # noqa: E402
from lemur.data.read.remote import Remote  # noqa: E402
from lemur.data.read.sources import SourcesReader  # noqa: E402
from lemur.data.read.stack_v2 import decode_blob  # noqa: E402
from lemur.data.recipe.errors import RecipeError  # noqa: E402
from lemur.data.recipe.sources import RemoteSettings, StorageOptions  # noqa: E402
from lemur.data.recipe_loader import recipe_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "integrity"
# Planted credentials: each must never appear on stderr, in a log or in any file.
PLANTED = {
    "key": "AKIAPLANTEDKEYID00042",
    "secret": "planted-secret-0f9e8d7c6b5a49382716",
    "token": "planted-session-token-ZXhhbXBsZQ",
}


def blob_id(i: int) -> str:
    """The blob id of the i-th test blob."""
    return f"{i:040x}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(endpoint, metadata parquet, texts by blob id): 6 gzip blobs of real code in S3."""
    root = tmp_path_factory.mktemp("integrity")
    texts = {blob_id(i): p.read_text() for i, p in enumerate(real_python_files(6), start=1)}
    rows = [
        {"blob_id": b, "repo_name": "org/r", "path": f"m{i}.py", "src_encoding": "UTF-8"}
        | {"language": "Python", "license_type": "permissive", "length_bytes": len(t)}
        for i, (b, t) in enumerate(texts.items())
    ]
    meta = root / "meta.parquet"
    pq.write_table(pa.Table.from_pylist(rows), meta)
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        upload(
            endpoint, BUCKET, {f"content/{b}": gzip.compress(t.encode()) for b, t in texts.items()}
        )
        yield endpoint, meta, texts


def stack_recipe(
    tmp: Path, meta: Path, content_url: str, content_opts: dict, tok: Path, **remote
) -> dict:
    """A build of one stack-v2 source (local metadata, blobs at `content_url`) and a text one,
    with a given tokenizer `tok`."""
    text = write_jsonl(tmp / "text.jsonl", real_text_docs(6))
    return {
        "output": str(tmp / "out"),
        "seq_len": 64,
        "tokenizer": {"model": str(tok)},
        "mix": {"ratio": {"code": 1, "text": 1}},
        "executor": {"tasks": 1, "workers": 1},
        "filters": NO_FILTERS,
        "dedup": {"near": False},
        "sources": [
            {
                "name": "stack",
                "domain": "code",
                "format": "stack-v2",
                "paths": [str(meta)],
                "content_url": content_url,
                "content_storage_options": content_opts,
                **({"remote": remote} if remote else {}),
            },
            {"name": "t", "domain": "text", "format": "jsonl", "paths": [str(text)]},
        ],
    }


def lemur_build(recipe: dict, tmp: Path) -> subprocess.CompletedProcess:
    """`lemur-data build` of `recipe` (written as YAML), as a user runs it."""
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEMUR_SECRET_")}
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", "build", str(path)],
        env={**env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def leaks(text: str) -> list[str]:
    """The planted credentials `text` holds."""
    return [name for name, value in PLANTED.items() if value in text]


def files_leaking(root: Path) -> list[str]:
    """Every file under `root` holding a planted credential."""
    return [
        str(p)
        for p in root.rglob("*")
        if p.is_file() and any(v.encode() in p.read_bytes() for v in PLANTED.values())
    ]


# -- item 13: credentials in a traceback ------------------------------------------------------


def test_content_client_that_cannot_be_made_is_one_line_before_any_task(
    store, tokenizer_model, tmp_path
):
    """`gs://` content without gcsfs (or a misspelt protocol) and credentials in
    content_storage_options: one line naming the key and the fix, exit 2, before any task
    (no task log), and the credentials nowhere: not on stderr, not in any file."""
    _, meta, _ = store
    for url, says in (
        ("gs://bucket/{blob_id}", "install gcsfs"),
        ("s4://bucket/{blob_id}", "no filesystem for protocol 's4'"),
    ):
        out = tmp_path / url[:2]
        out.mkdir()
        done = lemur_build(stack_recipe(out, meta, url, PLANTED, tokenizer_model), out)
        assert done.returncode == 2, done.stderr[-2000:]
        [line] = done.stderr.splitlines()
        assert (
            line.startswith(f"lemur-data: error: recipe: sources[0].content_url '{url}': ")
            and says in line
        ), line
        assert leaks(done.stderr + done.stdout) == []
        assert list(out.rglob("task_*.log")) == [] and files_leaking(out / "out") == []


class Unmakeable:
    """A filesystem whose client cannot be made (a bad option, an unreachable auth server)."""

    protocol = "lemur-unmakeable"

    def __init__(self, **options) -> None:
        raise RuntimeError("could not reach the credentials service")


def test_a_client_that_fails_carries_no_secret_into_a_printed_traceback(monkeypatch):
    """loguru prints each frame's variables (datatrove's task logs do): an error making a
    client, or finding its class, shows no credential in any frame, and is one RemoteError
    line naming the URL."""
    from fsspec.registry import known_implementations
    from loguru import logger

    from lemur.data.read.remote import RemoteError

    monkeypatch.setitem(
        known_implementations,
        Unmakeable.protocol,
        {"class": f"{__name__}.Unmakeable"},
    )
    monkeypatch.setitem(
        known_implementations,
        "lemur-absent",
        {"class": "lemur_no_such_module.FileSystem", "err": "install lemur-no-such-module"},
    )
    opts = StorageOptions(PLANTED | {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}})
    remote = Remote(opts, RemoteSettings(retries=0))
    for url, says in (
        ("lemur-unmakeable://b/x", "could not reach the credentials service"),
        ("lemur-absent://b/x", "install lemur-no-such-module"),
    ):
        sink = io.StringIO()
        handler = logger.add(sink, backtrace=True, diagnose=True, colorize=False)
        try:
            remote.cat(url)
        except Exception as e:  # noqa: BLE001 - what datatrove does with a task's error
            logger.exception(f"task failed: {e}")
            error = e
        finally:
            logger.remove(handler)
        printed = sink.getvalue()
        assert "Traceback" in printed and leaks(printed) == [], printed
        assert isinstance(error, RemoteError) and says in str(error)
        assert str(error).startswith(url) and "\n" not in str(error)


# -- items 13 and 15: a remote failure fails the build loudly; a rerun redoes it --------------


def test_failed_remote_reads_fail_the_build_and_a_rerun_retries_them(
    store, tokenizer_model, tmp_path
):
    """Two blobs answered 503 past `remote.retries`: the build fails (exit 1) with one line
    saying how many reads failed and naming the first; no credential in stderr or in any task
    log. The same recipe rerun with the store healthy is not "up to date": it reads the
    failed blobs again and the build has every document."""
    endpoint, meta, texts = store
    with FaultProxy(endpoint) as proxy:
        opts = PLANTED | {"client_kwargs": {"endpoint_url": proxy.endpoint}}
        url = f"s3://{BUCKET}/content/{{blob_id}}"
        raw = stack_recipe(
            tmp_path, meta, url, opts, tokenizer_model, retries=1, backoff_s=0.01, concurrency=1
        )
        proxy.faults = ["503"] * 4  # the first two blobs, each tried twice
        done = lemur_build(raw, tmp_path)
        assert done.returncode == 1, done.stderr[-3000:]
        assert proxy.faulted == 4
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "lemur-data: error: 2 remote reads failed (source 'stack': "
            f"s3://{BUCKET}/content/{blob_id(1)}: GET failed after 2 tries: HTTP 503"
        ), last
        assert last.endswith(
            "; the build is not complete: run it again when the store answers (the task that "
            "met them is redone, finished work is kept)"
        ), last
        assert leaks(done.stderr + done.stdout) == []
        logs = list(tmp_path.rglob("task_*.log"))
        assert logs and files_leaking(tmp_path / "out") == []
        assert not (tmp_path / "out" / "manifest.json").exists()
        before = len(proxy.requests)
        again = lemur_build(raw, tmp_path)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "up to date" not in again.stdout + again.stderr
        fetched = [p for m, p in proxy.requests[before:] if m == "GET"]
    assert len(fetched) == len(texts)  # the task that met the failures read all its blobs again
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["sources"]["stack"]["read"] == len(texts)
    assert manifest["counts"]["errors_total"] == 0


# -- item 16: an object rewritten between listing and reading --------------------------------


def jsonl_recipe(tmp: Path, endpoint: str, tok: Path) -> dict:
    """A build of one remote jsonl object (text) and local code."""
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    for p in real_python_files(4):
        (code / p.name).write_text(p.read_text())
    return {
        "output": str(tmp / "out"),
        "seq_len": 64,
        "tokenizer": {"model": str(tok)},
        "mix": {"ratio": {"code": 1, "text": 1}},
        "executor": {"tasks": 1, "workers": 1},
        "filters": NO_FILTERS,
        "dedup": {"near": False},
        "sources": [
            {"name": "py", "domain": "code", "format": "files", "paths": [str(code)]},
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": [f"s3://{BUCKET}/text/docs.jsonl"],
                "storage_options": options(endpoint),
            },
        ],
    }


def jsonl_bytes(docs: list[dict]) -> bytes:
    """JSON lines of `docs`."""
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


@pytest.mark.parametrize("change", ["same size", "grown"])
def test_an_object_rewritten_since_listing_is_named_never_mixed(
    store, tokenizer_model, tmp_path, change
):
    """An object rewritten after its listing was recorded (as a resumed build finds it) is
    one line naming it (HTTP If-Match with the listed ETag), never its new bytes read as
    the old object's; the listing is dropped, so the next run lists it again and builds
    from the new version."""
    endpoint = store[0]
    docs = real_text_docs(8)
    upload(endpoint, BUCKET, {"text/docs.jsonl": jsonl_bytes(docs)})
    raw = jsonl_recipe(tmp_path, endpoint, tokenizer_model)
    r = recipe_from_dict(raw)
    [listed] = [f for f in list_inputs(r).files if f.source == 1]  # recorded in the work dir
    new = [{**d, "text": d["text"].swapcase()} for d in docs]
    if change == "grown":
        new.append({"id": "extra", "text": "A document added after the listing."})
    upload(endpoint, BUCKET, {"text/docs.jsonl": jsonl_bytes(new)})
    assert (len(jsonl_bytes(new)) == listed.size) == (change == "same size")
    with pytest.raises(BuildError) as failed:
        build(r)
    message = str(failed.value)
    assert "\n" not in message and message.startswith("1 remote read failed"), message
    assert f"s3://{BUCKET}/text/docs.jsonl changed since it was listed" in message
    assert "listed again" in message
    manifest = build(recipe_from_dict(raw))  # lists again: the new version, whole
    assert manifest["counts"]["sources"]["docs"]["read"] == len(new)
    assert manifest["counts"]["errors_total"] == 0


def test_reading_sends_the_listed_etag(store, tmp_path):
    """Every ranged read of a listed S3 object carries `If-Match: <listed ETag>`."""
    endpoint = store[0]
    upload(endpoint, BUCKET, {"text/e.jsonl": jsonl_bytes(real_text_docs(3))})
    with FaultProxy(endpoint) as proxy:
        raw = jsonl_recipe(tmp_path, proxy.endpoint, tmp_path / "tok.model")
        raw["sources"][1]["paths"] = [f"s3://{BUCKET}/text/e.jsonl"]
        r = recipe_from_dict(raw, check_paths=False)
        files = [f for f in list_inputs(r).files if f.source == 1]
        seen: list[str] = []
        handle = proxy.handle

        def spy(h) -> None:
            if h.command == "GET" and "Range" in h.headers:
                seen.append(h.headers.get("If-Match", ""))
            handle(h)

        proxy.handle = spy
        reader = SourcesReader(files, r.sources, errors_dir="")
        assert len([d for f in files for d in reader.read(f)]) == 3
    assert seen and set(seen) == {f'"{files[0].version}"'}


# -- item 17: a Stack v2 blob gunzipped with a cap -------------------------------------------


def test_a_blob_bigger_than_max_file_bytes_once_gunzipped_is_dropped(
    store, tokenizer_model, tmp_path
):
    """A blob whose metadata says 50 bytes but which holds 12 MiB is counted `too_large`
    (its URL named), not kept, under the default max_file_bytes (10,000,000)."""
    endpoint, meta, texts = store
    big = "b" * 40
    upload(endpoint, BUCKET, {f"content/{big}": gzip.compress(b"x = 0\n" * (2 << 20))})
    rows = pq.read_table(meta).to_pylist()
    rows.append(rows[0] | {"blob_id": big, "path": "big.py", "length_bytes": 50})
    meta2 = tmp_path / "meta.parquet"
    pq.write_table(pa.Table.from_pylist(rows), meta2)
    raw = stack_recipe(
        tmp_path, meta2, f"s3://{BUCKET}/content/{{blob_id}}", options(endpoint), tokenizer_model
    )
    r = recipe_from_dict(raw)
    files = [f for f in list_inputs(r).files if f.source == 0]
    stats: Counter[str] = Counter()
    reader = SourcesReader(files, r.sources, errors_dir="")
    reader.log.stat_update = lambda *labels, value=1: stats.update(dict.fromkeys(labels, value))
    reader.log.remote.stat_update = reader.log.stat_update
    docs = [d for f in files for d in reader.read(f)]
    assert [d.text for d in docs] == list(texts.values())
    [error] = reader.log.errors
    assert error["kind"] == "too_large" and stats["error_too_large:stack"] == 1
    assert error["error"] == (
        f"s3://{BUCKET}/content/{big}: more than 10000000 bytes once gunzipped "
        "(> max_file_bytes; its metadata says 50)"
    )


def zeros_gzip(n: int) -> bytes:
    """A gzip stream of `n` zero bytes, made in 1 MiB steps."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    return b"".join(c.compress(chunk) for _ in range(n >> 20)) + c.flush()


def test_gunzip_is_streamed_and_capped():
    """A 100 MiB bomb of zeros (~100 KB gzipped) stops at the cap: the memory held stays
    near the cap, not the blob's full size; blobs under the cap are read whole, several
    gzip members and trailing zero padding included, as gzip.decompress reads them."""
    bomb = zeros_gzip(100 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="more than 1000000 bytes once gunzipped"):
            decode_blob(bomb, None, 1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the old whole-blob gunzip held 100 MiB here
    two = gzip.compress("caf\u00e9 ".encode()) + gzip.compress(b"ok\n") + bytes(16)
    assert decode_blob(two, "UTF-8", 100) == "caf\u00e9 ok\n"
    assert decode_blob(gzip.compress(b"x" * 100), None, 100) == "x" * 100
    with pytest.raises(ValueError, match="more than 99 bytes"):
        decode_blob(gzip.compress(b"x" * 100), None, 99)
    with pytest.raises(EOFError):
        decode_blob(gzip.compress(b"x" * 100)[:-9], None, 1000)
    with pytest.raises((zlib.error, gzip.BadGzipFile)):
        decode_blob(b"not gzip", None, 1000)


# -- item 18: content_url placeholders --------------------------------------------------------


@pytest.mark.parametrize(
    "url, says",
    [
        ("s3://b/{blob_id}{ext}", "names '{ext}': the only field is {blob_id}"),
        ("s3://b/{blob_id}/{0}", "names '{0}': the only field is {blob_id}"),
        ("s3://b/{blob_id.upper}", "names '{blob_id.upper}': the only field is {blob_id}"),
        ("s3://b/{blob_id", "is not a template (expected '}' before end of string)"),
    ],
)
def test_content_url_fields_are_checked_when_the_recipe_loads(tmp_path, url, says):
    """A content_url naming a field the reader does not fill in (or not a template at all)
    is a recipe mistake when the recipe loads, not a task's KeyError."""
    raw = stack_recipe(tmp_path, tmp_path / "m.parquet", url, {}, tmp_path / "t.model")
    with pytest.raises(RecipeError) as bad:
        recipe_from_dict(raw, check_paths=False)
    assert str(bad.value) == f"recipe: sources[0].content_url {url!r} {says}"


def _tagged_memory() -> type:
    """fsspec's in-memory filesystem whose info tells an ETag (a hash of the bytes), as a
    store without conditional reads does (gcsfs, the Hub)."""
    import hashlib

    from fsspec.implementations.memory import MemoryFileSystem

    class TaggedMemory(MemoryFileSystem):
        protocol = "lemur-tagged"
        store: dict = {}  # its own objects, apart from the plain memory filesystem's
        pseudo_dirs = [""]

        def info(self, path, **kwargs):
            out = super().info(path, **kwargs)
            return out | {"ETag": hashlib.md5(self.cat_file(path)).hexdigest()}

    return TaggedMemory


TaggedMemory = _tagged_memory()


def test_other_filesystems_compare_the_listed_version_before_reading(monkeypatch):
    """Where no conditional read exists, one HEAD compares the listed version when the object
    is opened: a rewritten object is RemoteChanged naming it, counted `changed`."""
    import hashlib

    from fsspec.registry import known_implementations

    from lemur.data.read.remote import RemoteChanged

    monkeypatch.setitem(
        known_implementations, TaggedMemory.protocol, {"class": f"{__name__}.TaggedMemory"}
    )
    url = f"{TaggedMemory.protocol}://b/x.txt"
    TaggedMemory().pipe_file(url, b"first version\n")
    counts: Counter[str] = Counter()
    remote = Remote(None, RemoteSettings(retries=0), lambda kind, n: counts.update({kind: n}))
    listed = hashlib.md5(b"first version\n").hexdigest()
    with remote.open(url, 14, version=listed) as fh:
        assert fh.read() == b"first version\n"
    TaggedMemory().pipe_file(url, b"other version\n")  # same size
    with pytest.raises(RemoteChanged) as changed:
        remote.open(url, 14, version=listed)
    assert str(changed.value).startswith(f"{url} changed since it was listed (version {listed}")
    assert counts["changed"] == 1

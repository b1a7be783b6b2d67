"""Builds that read their inputs from object storage: a real S3 server on 127.0.0.1 (moto's).

A build from `s3://` gives the shards of the same build from local copies; a build killed
(SIGKILL) and resumed lists nothing again; throttling and broken connections are retried
and counted; no credential is written anywhere.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import NO_FILTERS, real_python_files, real_text_docs, slurm_executor, write_jsonl

pytest.importorskip("moto", reason="moto[server] (the dev extra) runs the local S3 server")
pytest.importorskip("s3fs", reason="s3fs (the base install) reads s3:// paths")

from s3_local import KEY, SECRET, FaultProxy, moto_s3, options, upload_tree  # noqa: E402

from lemur.data.build import BuildError, build  # noqa: E402
from lemur.data.read.listing import list_inputs  # noqa: E402
from lemur.data.read.sources import SourcesReader  # noqa: E402
from lemur.data.recipe.errors import RecipeError  # noqa: E402
from lemur.data.recipe.sources import SECRET_ENV_PREFIX, SECRET_REF  # noqa: E402
from lemur.data.recipe_loader import recipe_from_dict  # noqa: E402

BUCKET = "corpus"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Local inputs: a code tree, text as jsonl.zst and plain jsonl, parquet of 6 row groups."""
    root = tmp_path_factory.mktemp("remote-corpus")
    (root / "code" / "pkg").mkdir(parents=True)
    (root / "code" / "node_modules").mkdir()
    for i, p in enumerate(real_python_files(16)):
        (root / "code" / ("pkg" if i % 2 else "") / p.name).write_bytes(p.read_bytes())
    (root / "code" / "node_modules" / "x.py").write_text("print('vendored')\n")
    (root / "code" / ".gitignore").write_text("skip_*.py\n")
    (root / "code" / "skip_me.py").write_text("print('ignored')\n")
    docs = real_text_docs(90)
    (root / "text").mkdir()
    write_jsonl(root / "text" / "a.jsonl.zst", docs[:30], "zst")
    write_jsonl(root / "text" / "b.jsonl", docs[30:60])
    table = pa.table({"id": [d["id"] for d in docs[60:]], "text": [d["text"] for d in docs[60:]]})
    pq.write_table(table, root / "text" / "c.parquet", row_group_size=5)
    return root


@pytest.fixture(scope="module")
def s3(corpus, tmp_path_factory):
    """The local S3 server with the corpus uploaded; started and stopped by this module."""
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        upload_tree(endpoint, BUCKET, corpus)
        yield endpoint


@pytest.fixture(scope="module")
def local_build(corpus, tokenizer_model, tmp_path_factory) -> dict:
    """The manifest of the build over the local copies (its folder under `out`)."""
    out = tmp_path_factory.mktemp("local-build") / "l"
    return {**build(recipe_from_dict(local_recipe(out, corpus, tokenizer_model))), "out": out}


def recipe(out: Path, code: str, text: list[str], tok: Path, opts: dict | None = None) -> dict:
    """Two sources (a code tree, text files) read from `code` and `text`, a given tokenizer."""
    extra = {"storage_options": opts} if opts else {}
    return {
        "output": str(out),
        "seed": 3,
        "seq_len": 128,
        "tokenizer": {"model": str(tok)},
        "mix": {"ratio": {"code": 3, "text": 1}},
        "executor": {"kind": "local", "tasks": 3, "workers": 1, "split_bytes": 6000},
        "filters": NO_FILTERS,
        "val_fraction": 0.05,
        "shard_tokens": 20_000,
        "sources": [
            {
                "name": "py",
                "domain": "code",
                "format": "files",
                "paths": [code],
                "include": ["*.py"],
                "language": "Python",
                **extra,
            },
            {
                "name": "docs",
                "domain": "text",
                "format": "jsonl",
                "paths": text[:2],
                "language": "en",
                **extra,
            },
            {
                "name": "tbl",
                "domain": "text",
                "format": "parquet",
                "paths": text[2:],
                "language": "en",
                **extra,
            },
        ],
    }


def local_recipe(out: Path, corpus: Path, tok: Path) -> dict:
    """The build over the local copies."""
    t = corpus / "text"
    return recipe(
        out,
        str(corpus / "code"),
        [str(t / "*.jsonl*"), str(t / "b.jsonl"), str(t / "c.parquet")],
        tok,
    )


def remote_recipe(out: Path, endpoint: str, tok: Path) -> dict:
    """The same build over `s3://` (a prefix, a glob, an object)."""
    t = f"s3://{BUCKET}/text"
    return recipe(
        out,
        f"s3://{BUCKET}/code",
        [f"{t}/*.jsonl*", f"{t}/b.jsonl", f"{t}/c.parquet"],
        tok,
        options(endpoint),
    )


def shard_bytes(manifest: dict, out: Path) -> list[bytes]:
    """Every shard's tokens and index, in manifest order."""
    return [(out / s[key]).read_bytes() for s in manifest["shards"] for key in ("file", "index")]


def test_listing_matches_local_and_splits_remote_files(s3, corpus, tokenizer_model, tmp_path):
    """The remote listing has the local one's files and parts, with sizes and ETags."""
    local = list_inputs(recipe_from_dict(local_recipe(tmp_path / "l", corpus, tokenizer_model)))
    remote = list_inputs(recipe_from_dict(remote_recipe(tmp_path / "r", s3, tokenizer_model)))
    key = [(f.source, f.rel, f.unit, f.start, f.end) for f in local.files]
    assert [(f.source, f.rel, f.unit, f.start, f.end) for f in remote.files] == key
    assert {f.unit for f in remote.files} == {"", "bytes", "row_groups"}
    assert all(f.size > 0 and f.version for f in remote.files)
    assert remote.skipped == local.skipped == {"py": {"gitignored": 1, "tool_directory": 1}}


def test_remote_build_is_byte_identical_to_local(
    s3, corpus, tokenizer_model, local_build, tmp_path
):
    """Shards from s3:// equal the shards from local copies; bytes and requests counted."""
    local = local_build
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    raw["executor"]["workers"] = 2  # tasks in worker processes: each makes its own clients
    remote = build(recipe_from_dict(raw))
    assert shard_bytes(remote, tmp_path / "r") == shard_bytes(local, local["out"])
    assert len(local["shards"]) >= 2
    counts = remote["counts"]
    assert counts["read"] == local["counts"]["read"] and counts["errors_total"] == 0
    total = sum(p.stat().st_size for p in corpus.rglob("*") if p.is_file())
    assert counts["remote"]["bytes"] >= total - 100  # every object read (ignored ones not)
    assert counts["remote"]["failures"] == 0 and "remote" not in local["counts"]
    assert counts["sources"]["tbl"]["remote"]["requests"] > 0
    assert remote["recipe"]["sources"][0]["storage_options"]["secret"] == "<redacted>"


def files_holding(root: Path, secret: str) -> list[Path]:
    """Every file under `root` whose bytes hold `secret`."""
    return [p for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_no_credential_in_any_output_file(s3, tokenizer_model, tmp_path):
    """The planted secret key is in no file of the output or work directory (manifest,
    executor.json, logs, listing record), not even in an error message."""
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    raw["sources"].append(
        {
            "name": "gone",
            "domain": "text",
            "format": "jsonl",
            "language": "en",
            "paths": [f"s3://{BUCKET}/text/b.jsonl"],
            "storage_options": {**options(s3), "token": "tok-" + SECRET[::-1]},
        }
    )
    manifest = build(recipe_from_dict(raw))
    assert manifest["recipe"]["sources"][3]["storage_options"]["token"] == "<redacted>"
    assert (tmp_path / "r" / ".work").is_dir() and list((tmp_path / "r").rglob("executor.json"))
    assert files_holding(tmp_path, SECRET) == []
    assert files_holding(tmp_path, SECRET[::-1]) == []


BUILD_SCRIPT = """
import json, sys
from lemur.data.build import build
from lemur.data.recipe_loader import recipe_from_dict
build(recipe_from_dict(json.loads(open(sys.argv[1]).read())))
"""


def kill_when(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    """SIGKILL `proc` as soon as `ready()` holds (fails if it ends or times out first)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, "the build ended before it could be killed"
        assert time.monotonic() < deadline, "the build never got there"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_resume_after_sigkill_lists_nothing_and_stays_identical(
    s3, tokenizer_model, local_build, tmp_path
):
    """A build killed in its tokenize stage and run again reads the recorded listing: not
    one LIST (or HEAD) request, and shards byte-identical to the local build's."""
    local = local_build
    with FaultProxy(s3) as proxy:
        raw = remote_recipe(tmp_path / "r", proxy.endpoint, tokenizer_model)
        (tmp_path / "recipe.json").write_text(json.dumps(raw))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", BUILD_SCRIPT, str(tmp_path / "recipe.json")], env=env
        )
        work = tmp_path / "r" / ".work"
        kill_when(proc, lambda: any(work.glob("tokens-*/logs/completions/*")))
        assert len(list(work.glob("listing-*.json"))) == 3  # one per remote source
        lists = proxy.count("GET", "list-type=2")
        assert lists > 0
        before = len(proxy.requests)
        resumed = build(recipe_from_dict(raw))
        after = proxy.requests[before:]
        assert [r for r in after if "list-type=2" in r[1] or r[0] == "HEAD"] == []
        assert len(after) > 0  # the inputs were read again, by ranged GETs
        assert shard_bytes(resumed, tmp_path / "r") == shard_bytes(local, local["out"])
        # A rerun of the finished build lists nothing and reads nothing: it is up to date.
        before = len(proxy.requests)
        assert build(recipe_from_dict(raw))["inputs_sha256"] == resumed["inputs_sha256"]
        assert proxy.requests[before:] == []


def test_throttled_build_survives_and_counts_its_retries(
    s3, tokenizer_model, local_build, tmp_path
):
    """503 SlowDown, 429 and connection resets on the object reads are retried: the build
    equals the local one, every retry is counted, and `lemur-data stats` shows them."""
    local = local_build
    with FaultProxy(s3) as proxy:
        raw = remote_recipe(tmp_path / "r", proxy.endpoint, tokenizer_model)
        for source in raw["sources"]:
            source["remote"] = {"backoff_s": 0.01, "concurrency": 2}
        list_inputs(recipe_from_dict(raw))  # the listing, recorded: the faults hit the tasks
        proxy.only_reads = True
        # A reset of a pooled connection is retried once by aiohttp itself: two in a row
        # reach our retries.
        proxy.faults = ["503", "429", "reset", "reset", "503", None, "429", "503", "503"]
        remote = build(recipe_from_dict(raw))
        assert proxy.faults == [] and proxy.faulted == 8
    assert shard_bytes(remote, tmp_path / "r") == shard_bytes(local, local["out"])
    counts = remote["counts"]["remote"]
    assert counts["retries"] == 7 and counts["failures"] == 0
    per_source = [s["remote"]["retries"] for s in remote["counts"]["sources"].values()]
    assert sum(per_source) == 7
    shown = " ".join(lemur_data("stats", str(tmp_path / "r")).split())  # rich wraps lines
    assert "remote reading:" in shown and "7 retries, 0 failures" in shown
    as_json = json.loads(lemur_data("stats", str(tmp_path / "r"), "--json"))
    assert as_json["counts"]["remote"]["retries"] == 7


def lemur_data(*args: str) -> str:
    """The output of `lemur-data ARGS` (this checkout's code)."""
    run = subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_exhausted_retries_fail_in_one_line_naming_the_url(s3, tokenizer_model, tmp_path):
    """Past `retries`, a read fails with one line naming the URL and the last error, counted
    as a failure and as the file's `remote_failed` error; a stalled request is cut off at
    `timeout_s` and retried."""
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    with FaultProxy(s3) as proxy:
        for source in raw["sources"]:
            source["storage_options"] = options(proxy.endpoint)
            source["remote"] = {"retries": 2, "backoff_s": 0.01, "timeout_s": 1}
        r = recipe_from_dict(raw)
        files = [f for f in list_inputs(r).files if f.rel == "a.jsonl.zst"]
        stats: Counter[str] = Counter()
        reader = SourcesReader(files, r.sources, errors_dir="")
        reader.log.stat_update = lambda label, value=1: stats.update({label: value})
        reader.log.remote.stat_update = reader.log.stat_update
        proxy.only_reads, proxy.stall_s = True, 3
        proxy.faults = ["stall", "503"]  # cut off after 1 s, throttled, then served
        assert len(list(reader.read(files[0]))) == 30
        assert stats["remote_retries:docs"] == 2 and stats["remote_failures:docs"] == 0
        proxy.faults = ["503", "429", "503", "503"]
        assert list(reader.read(files[0])) == []
    assert proxy.faults == ["503"]  # three tries: the first and `retries` more
    assert stats["remote_failures:docs"] == 1 and stats["error_remote_failed:docs"] == 1
    [error] = reader.log.errors
    assert error["kind"] == "remote_failed" and "\n" not in error["error"]
    assert error["error"].startswith(
        f"s3://{BUCKET}/text/a.jsonl.zst: GET bytes 0-{files[0].size} failed after 3 tries: "
        "HTTP 503 SlowDown"
    )


def test_a_source_whose_reads_all_fail_names_its_url_once(s3, tokenizer_model, tmp_path):
    """A source every read of which fails stops the build with its first error, which
    names the object once (the remote error starts with the URL already): a remote failure,
    not a source without documents (a rerun redoes the task, read/remote_outcome.py)."""
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    with FaultProxy(s3) as proxy:
        raw["sources"][1]["paths"] = [f"s3://{BUCKET}/text/b.jsonl"]
        raw["sources"][1]["storage_options"] = options(proxy.endpoint)  # the others: direct
        raw["sources"][1]["remote"] = {"retries": 0}
        proxy.only_reads, proxy.faults = True, ["503"] * 100
        with pytest.raises(BuildError) as failed:
            build(recipe_from_dict(raw))
    message = str(failed.value)
    url = f"s3://{BUCKET}/text/b.jsonl"
    assert message.startswith(f"1 remote read failed (source 'docs': {url}: GET bytes 0-")
    assert message.count(url) == 1, message


def test_reader_and_settings_pickle_without_clients(s3, tokenizer_model, tmp_path, monkeypatch):
    """The reader step ships to Ray and Slurm tasks: it pickles after reading remote files
    (each process makes its own clients), and the copy reads the same documents."""
    r = recipe_from_dict(remote_recipe(tmp_path / "r", s3, tokenizer_model))
    files = list_inputs(r).files
    reader = SourcesReader(files, r.sources, errors_dir="")
    first = [d.text for f in files[:4] for d in reader.read(f)]
    assert first  # read through this process's clients and thread pool, which never pickle
    blob = pickle.dumps(reader)
    # What a Slurm array unpickles from disk holds no credential: each secret travels as
    # the name of an environment variable the jobs inherit.
    assert SECRET.encode() not in blob and KEY.encode() not in blob
    copy = pickle.loads(blob)
    assert [d.text for f in files[:4] for d in copy.read(f)] == first
    assert SECRET.encode() not in json.dumps(r.to_dict()).encode()
    for name in [n for n in os.environ if n.startswith("LEMUR_SECRET_")]:
        monkeypatch.delenv(name)  # a node that did not inherit them
    stranger = pickle.loads(blob)
    assert list(stranger.read(files[0])) == []
    [error] = stranger.log.errors
    assert (
        error["kind"] == "remote_failed" and "credentials are not in this process" in error["error"]
    )
    assert SECRET not in error["error"] and "LEMUR_SECRET_" in error["error"]


@pytest.mark.parametrize(
    "path, message",
    [
        (f"s3://{BUCKET}/no/such/prefix/", "path 's3://corpus/no/such/prefix/' matches nothing"),
        ("s3://no-such-bucket/x.jsonl", "path 's3://no-such-bucket/x.jsonl' matches nothing"),
        ("nosuch://bucket/x.jsonl", "cannot list 'nosuch://bucket/x.jsonl': Protocol not known"),
    ],
)
def test_listing_mistakes_are_one_line_recipe_errors(s3, tmp_path, path, message):
    """A remote path that names nothing, or a filesystem that does not exist, is a recipe
    mistake naming the source and the path (one line, exit 2 from `lemur-data build`)."""
    raw = remote_recipe(tmp_path / "r", s3, tmp_path / "tok.model")
    raw["sources"][1]["paths"] = [path]
    r = recipe_from_dict(raw, check_paths=False)
    with pytest.raises(RecipeError, match=f"^recipe: source 'docs': {re.escape(message)}"):
        list_inputs(r)


def test_read_ahead_stays_inside_a_byte_range_part(s3, corpus, tokenizer_model, tmp_path):
    """Parts of a remote jsonl file read ahead only to their own end: all parts together
    fetch the file about once, not once plus `concurrency` blocks per part."""
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    raw["executor"]["split_bytes"] = 40_000
    raw["sources"][1]["remote"] = {"concurrency": 8, "block_bytes": 4096}
    raw["sources"][1]["paths"] = [f"s3://{BUCKET}/text/b.jsonl"]
    r = recipe_from_dict(raw)
    parts = [f for f in list_inputs(r).files if f.rel == "b.jsonl"]
    assert len(parts) == 3
    stats: Counter[str] = Counter()
    reader = SourcesReader(parts, r.sources, errors_dir="")
    reader.log.stat_update = lambda label, value=1: stats.update({label: value})
    reader.log.remote.stat_update = reader.log.stat_update
    assert sum(1 for f in parts for _ in reader.read(f)) == 30
    size = (corpus / "text" / "b.jsonl").stat().st_size
    # Each part may read one block past its end, and its last line (< 30 KB) on demand.
    assert size <= stats["remote_bytes:docs"] < size + 3 * 4096 + 2 * 30_000


def test_any_fsspec_filesystem_sync_ones_too(corpus, tokenizer_model, tmp_path):
    """A filesystem that is not async (as the Hub's `hf://` is) is read the same way: here
    fsspec's in-memory one, holding copies of the text files."""
    import fsspec

    memory = fsspec.filesystem("memory")
    for p in sorted((corpus / "text").iterdir()):
        memory.pipe(f"memory://lemur-test/text/{p.name}", p.read_bytes())
    local = local_recipe(tmp_path / "l", corpus, tokenizer_model)
    remote = local_recipe(tmp_path / "m", corpus, tokenizer_model)
    t = "memory://lemur-test/text"
    remote["sources"][1]["paths"] = [f"{t}/*.jsonl*", f"{t}/b.jsonl"]
    remote["sources"][2]["paths"] = [f"{t}/c.parquet"]

    def texts(raw: dict) -> list[str]:
        r = recipe_from_dict(raw)
        files = [f for f in list_inputs(r).files if f.source > 0]
        reader = SourcesReader(files, r.sources, errors_dir="")
        return [d.text for f in files for d in reader.read(f)]

    got = texts(remote)
    assert got == texts(local) and len(got) > 90  # b.jsonl twice (the glob and by name)


def test_ray_build_reads_remote_inputs(s3, tokenizer_model, local_build, tmp_path):
    """On the Ray executor every task opens its own clients (the secrets through the
    environment the local Ray instance inherits): the shards are the local build's."""
    pytest.importorskip("ray")
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model)
    raw["executor"] = {**raw["executor"], "kind": "ray", "workers": 2, "address": "local"}
    remote = build(recipe_from_dict(raw))
    assert shard_bytes(remote, tmp_path / "r") == shard_bytes(local_build, local_build["out"])
    assert remote["counts"]["remote"]["bytes"] > 0 and remote["counts"]["errors_total"] == 0
    assert files_holding(tmp_path, SECRET) == []


@pytest.mark.cluster
def test_slurm_build_reads_remote_inputs(s3, corpus, tokenizer_model, slurm, tmp_path):
    """On Slurm the array tasks unpickle the reader from `executor.pik`, which names the
    recipe's secrets (`LEMUR_SECRET_<hash>`) but holds none, and find them in the job's
    environment (sbatch --export=ALL): the shards are the local build's, and the secret is
    in no file of the output, the work directory or the Slurm logs."""
    partition, name = slurm
    # Few Slurm jobs (each takes seconds to start): no near-dedup (26 bucket tasks), and
    # shards of up to 200k tokens (a gather task per shard).
    small = {"dedup": {"near": False}, "shard_tokens": 200_000}
    local = local_recipe(tmp_path / "l", corpus, tokenizer_model) | small
    local_build = {**build(recipe_from_dict(local)), "out": tmp_path / "l"}
    raw = remote_recipe(tmp_path / "r", s3, tokenizer_model) | small
    refs = recipe_from_dict(raw).sources[0].storage_options.__getstate__()["refs"]
    names = sorted(refs[k][SECRET_REF] for k in ("key", "secret"))
    # Each job prints which LEMUR_SECRET_ variables it got (names only) before its task.
    found = f"env | grep -o '^{SECRET_ENV_PREFIX}[0-9A-F]*' | sort | sed 's/^/job has /'"
    raw["executor"] = {
        **slurm_executor(partition, name),
        "split_bytes": raw["executor"]["split_bytes"],
        "env_command": f"export PATH={Path(sys.executable).parent}:$PATH; {found}",
    }
    (tmp_path / "recipe.json").write_text(json.dumps(raw))
    # The build's process alone knows the credentials: no AWS_* secret, no inherited
    # LEMUR_SECRET_ variable, so the jobs can only get them from what the build exports.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SECRET_ENV_PREFIX)
        and k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    done = subprocess.run(
        [sys.executable, "-c", BUILD_SCRIPT, str(tmp_path / "recipe.json")],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    remote = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert shard_bytes(remote, tmp_path / "r") == shard_bytes(local_build, local_build["out"])
    assert remote["counts"]["remote"]["bytes"] > 0 and remote["counts"]["errors_total"] == 0
    assert len(remote["shards"]) >= 2
    outs = sorted((tmp_path / "r").glob(".work/tokens-*/logs/slurm_logs/*.out"))
    assert len(outs) == 2  # one per array task
    for out in outs:
        got = [line.split()[-1] for line in out.read_text().splitlines() if "job has" in line]
        assert got == names, out.read_text()[-3000:]
    pickled = next((tmp_path / "r").glob(".work/tokens-*/logs/executor.pik")).read_bytes()
    assert all(n.encode() in pickled for n in names)
    output = tmp_path / "r"  # the output, its work directory and the Slurm logs in it
    assert files_holding(output, SECRET) == [] and files_holding(output, KEY) == []

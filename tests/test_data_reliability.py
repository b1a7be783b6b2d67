"""A finished corpus is never damaged, stale or shared.

- a failed or killed rebuild leaves the previous complete build valid (verify OK, the
  trainer accepts it); a bad tokenizer model is refused before anything is copied;
- two builds into one directory: the second is refused with the holder named;
- a missing shuffle bucket is an error, never an empty shard, and a rerun redoes it;
- adding an input file makes the build stale;
- a full disk is a one-line error and leaves no temporary file.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import NO_FILTERS, base_recipe, real_python_files, real_text_docs, write_jsonl
from test_data_resume import KILLER

from lemur.data.build import BuildError, build
from lemur.data.pack.shuffle import KEYREC
from lemur.data.recipe_loader import recipe_from_dict
from lemur.data.run.lock import DirectoryLock
from lemur.shards.check import check_compatible
from lemur.shards.verify import verify


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rel_src")
    (root / "code").mkdir()
    for p in real_python_files(50):
        (root / "code" / p.name).write_bytes(p.read_bytes())
    write_jsonl(root / "text.jsonl", real_text_docs(60))
    return root


def raw_recipe(src: Path, out: Path, **kw) -> dict:
    raw = base_recipe(
        src,
        src / "code",
        [src / "text.jsonl"],
        filters=NO_FILTERS,
        output=str(out),
        shard_tokens=20_000,
    )
    raw.update(kw)
    return raw


def cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args], capture_output=True, text=True, **kw
    )


def write_recipe(raw: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of the directory's current build (manifest and what it references)."""
    m = json.loads((out / "manifest.json").read_text())
    files = ["manifest.json", m["tokenizer"]["file"]]
    files += [f for s in m["shards"] for f in (s["file"], s["index"])]
    return {f: (out / f).read_bytes() for f in files}


def assert_valid(out: Path, before: dict[str, bytes]) -> None:
    assert snapshot(out) == before
    assert verify(out) == []
    m = json.loads((out / "manifest.json").read_text())
    check_compatible(
        out,
        vocab_size=m["tokenizer"]["vocab_size"],
        tokenizer_sha256=m["tokenizer"]["sha256"],
        seq_len=64,
    )


@pytest.fixture
def built(sources, tmp_path) -> tuple[Path, Path, dict[str, bytes]]:
    out = tmp_path / "out"
    recipe = write_recipe(raw_recipe(sources, out), tmp_path / "recipe.yaml")
    res = cli(["build", str(recipe)])
    assert res.returncode == 0, res.stderr
    return out, recipe, snapshot(out)


def test_failed_rebuild_keeps_the_previous_build(built):
    out, recipe, before = built
    res = cli(
        [
            "build",
            str(recipe),
            "--set",
            "tokenizer.train.vocab_size=700",
            "--set",
            "mix.total_tokens=1e12",
        ]
    )
    assert res.returncode == 2 and "mix infeasible" in res.stderr, res.stderr
    assert_valid(out, before)


def test_bad_tokenizer_model_is_refused_before_any_copy(built, sources, tmp_path):
    out, _, before = built
    bogus = tmp_path / "passwd"
    bogus.write_text("root:x:0:0:root:/root:/bin/bash\n")
    raw = raw_recipe(sources, out, tokenizer={"model": str(bogus)})
    res = cli(["build", str(write_recipe(raw, tmp_path / "bogus.yaml"))])
    assert res.returncode == 2 and "Traceback" not in res.stderr  # a recipe mistake
    assert f"{bogus}: not a SentencePiece model" in res.stderr.strip().splitlines()[-1]
    assert_valid(out, before)


@pytest.mark.parametrize("stage, at", [("task", 1), ("shuffle: write", 1)])
def test_killed_rebuild_keeps_the_previous_build(built, sources, tmp_path, stage, at):
    out, _, before = built
    # another seed, and another tokenize batch so that the tokenize tasks rerun too
    other = write_recipe(
        raw_recipe(sources, out, seed=99, tokenize_batch_docs=7), tmp_path / "seed99.yaml"
    )
    res = subprocess.run(
        [sys.executable, "-c", KILLER, str(other), stage, str(at)], capture_output=True, text=True
    )
    assert res.returncode == -9, res.stderr[-2000:]
    assert_valid(out, before)
    # and the rerun completes the new build, removing the old one's files
    res = cli(["build", str(other)])
    assert res.returncode == 0, res.stderr
    assert verify(out) == []
    after = snapshot(out)
    assert after["manifest.json"] != before["manifest.json"]
    old_only = set(before) - set(after)
    assert old_only and not any((out / f).exists() for f in old_only)
    assert sorted(p.name for p in out.glob("build-*")) == [
        json.loads(after["manifest.json"])["tokenizer"]["file"].split("/")[0]
    ]


def test_a_second_build_into_the_same_directory_is_refused(sources, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    recipe = write_recipe(raw_recipe(sources, out), tmp_path / "recipe.yaml")
    with DirectoryLock(out):
        res = cli(["build", str(recipe)])
    assert res.returncode != 0 and "Traceback" not in res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert f"{out}: another build is writing here (pid {os.getpid()} on " in line, line
    assert not (out / "manifest.json").exists()


# `lemur-data build RECIPE` into OUTPUT that, once it holds the lock of OUTPUT, says so on stdout
# and waits for a line on stdin before it goes on.
HOLDER = """
import sys
from pathlib import Path
from lemur.data.cli import main
from lemur.data.run.lock import DirectoryLock

out, recipe = Path(sys.argv[1]).resolve(), sys.argv[2]
acquire = DirectoryLock.acquire

def acquire_and_wait(self):
    acquire(self)
    if self.path.parent.resolve() == out:
        print("holding the lock", flush=True)
        sys.stdin.readline()

DirectoryLock.acquire = acquire_and_wait
sys.exit(main(["build", recipe]))
"""


def test_concurrent_builds_one_wins_one_is_refused(sources, tmp_path):
    out = tmp_path / "out"
    recipes = [
        write_recipe(raw_recipe(sources, out, seed=seed), tmp_path / f"r{seed}.yaml")
        for seed in (1, 2)
    ]
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), str(recipes[0])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        for line in first.stdout:  # until the first build holds the lock (or ends)
            if line.strip() == "holding the lock":
                break
        else:
            pytest.fail(f"the first build never took the lock: {first.communicate()[1][-3000:]}")
        second = cli(["build", str(recipes[1])], timeout=300)  # while the first holds it
        _, first_err = first.communicate("go on\n", timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    line = second.stderr.strip().splitlines()[-1]
    assert f"{out}: another build is writing here (pid {first.pid} on " in line, line
    assert verify(out) == []
    m = json.loads((out / "manifest.json").read_text())
    assert m["recipe"]["seed"] == 1  # the first build's
    assert all(s["tokens"] > 0 for s in m["shards"])


def test_stale_lock_file_of_a_dead_build_is_taken_over(sources, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text(json.dumps({"pid": 999_999_999, "host": "x", "started": 0}))
    build(recipe_from_dict(raw_recipe(sources, out)))
    assert verify(out) == [] and not (out / ".lock").exists()


def killed_in_the_shuffle(sources, tmp_path) -> Path:
    """The output folder of a build killed (SIGKILL) as it writes its first shard."""
    out = tmp_path / "out"
    recipe = write_recipe(raw_recipe(sources, out), tmp_path / "recipe.yaml")
    res = subprocess.run(
        [sys.executable, "-c", KILLER, str(recipe), "shuffle: write", "1"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == -9, res.stderr[-2000:]
    return out


def test_missing_shuffle_bucket_is_an_error(sources, tmp_path):
    out = killed_in_the_shuffle(sources, tmp_path)
    buckets = sorted(out.glob(".work/shuffle-*/buckets/scatter-*.bin"))
    assert buckets
    buckets[-1].unlink()
    with pytest.raises(BuildError, match=rf"{buckets[-1].name}: shuffle bucket missing"):
        build(recipe_from_dict(raw_recipe(sources, out)))
    assert not (out / "manifest.json").exists()
    # the error names the damaged scatter task, and a plain rerun redoes it alone
    build(recipe_from_dict(raw_recipe(sources, out)))
    assert verify(out) == []


def test_scatter_keys_that_disagree_with_their_offsets_are_an_error(sources, tmp_path):
    out = killed_in_the_shuffle(sources, tmp_path)
    for keys in out.glob(".work/shuffle-*/buckets/scatter-*.keys"):
        rows = np.fromfile(keys, KEYREC)
        rows["length"] += 1  # same size, wrong lengths: a shard would be cut in the wrong places
        rows.tofile(keys)
    with pytest.raises(BuildError, match=r"copy lengths disagree with the offsets"):
        build(recipe_from_dict(raw_recipe(sources, out)))
    assert not (out / "manifest.json").exists()


def test_an_added_input_file_makes_the_build_stale(tmp_path):
    src = tmp_path / "src"
    (src / "code").mkdir(parents=True)
    files = real_python_files(21)
    for p in files[:20]:
        (src / "code" / p.name).write_bytes(p.read_bytes())
    write_jsonl(src / "text.jsonl", real_text_docs(40))
    raw = raw_recipe(src, tmp_path / "out")
    first = build(recipe_from_dict(raw))
    (src / "code" / files[20].name).write_bytes(files[20].read_bytes())
    stages: list[str] = []
    second = build(recipe_from_dict(raw), report=lambda s, d, t: stages.append(s))
    assert "up to date" not in stages
    assert second["counts"]["read"] == first["counts"]["read"] + 1


class _FullDisk:
    """A writable file object that fails like a full disk after `room` bytes."""

    def __init__(self, fh, room: list[int]):
        self.fh, self.room = fh, room

    def write(self, data) -> int:
        self.room[0] -= len(data)
        if self.room[0] < 0:
            raise OSError(errno.ENOSPC, "No space left on device", self.fh.name)
        return self.fh.write(data)

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.write(chunk)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


@pytest.mark.parametrize("kind", ["scatter", "shard"])
def test_full_disk_is_one_line_and_leaves_no_temporary_file(sources, tmp_path, monkeypatch, kind):
    from lemur import atomic_files  # every file is written through its atomic_open

    room = [50_000]

    def full_open(path, mode="r", *args, **kw):
        fh = open(path, mode, *args, **kw)
        name = Path(path).name
        shard = ".tmp-" in name and "/train/" in str(path)
        hit = name.startswith(".scatter-") if kind == "scatter" else shard
        return _FullDisk(fh, room) if "w" in mode and hit else fh

    monkeypatch.setattr(atomic_files, "open", full_open, raising=False)
    out = tmp_path / "out"
    with pytest.raises(BuildError, match="no space left on device") as e:
        build(recipe_from_dict(raw_recipe(sources, out)))
    assert "\n" not in str(e.value)
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name]
    monkeypatch.undo()
    build(recipe_from_dict(raw_recipe(sources, out)))  # with space again, the rerun completes
    assert verify(out) == []


def test_a_rerun_removes_the_temporaries_of_dead_writers_only(built, sources):
    import socket
    import time

    out, _, before = built
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    host = socket.gethostname()
    try:
        time.sleep(0.05)  # the live writer started before its file was written
        work = out / ".work"
        planted = {
            work / f".00003.bin.tmp-{dead.pid}": False,  # as byte_bpe and atomic_files named it
            work / f".00004.bin.tmp-{dead.pid}@{host}": False,
            work / f".tokenizer.tmp-{dead.pid}@{host}": False,  # a directory, removed whole
            out / f".manifest.json.tmp-{dead.pid}@{host}": False,
            work / f".00005.bin.tmp-{live.pid}@{host}": True,  # a live writer's
            work / f".00006.bin.tmp-{os.getpid()}@{host}": True,  # this test process: alive
            work / ".00007.bin.tmp-1@a-node-of-the-cluster": True,  # fresh, another host's
            work / ".00008.bin.tmp-1@a-node-of-the-cluster": False,  # untouched for 2 days
            work / f".00009.bin.tmp-1@{host}": False,  # pid 1 reused: it started after this
        }
        for path in planted:
            if "tokenizer" in path.name:
                path.mkdir()
                (path / "tokenizer.json").write_text("{}")
            else:
                path.write_bytes(b"partial")
        two_days_ago = time.time() - 2 * 24 * 3600
        os.utime(work / ".00008.bin.tmp-1@a-node-of-the-cluster", (two_days_ago,) * 2)
        os.utime(work / f".00009.bin.tmp-1@{host}", (0, 0))
        res = cli(["build", str(out.parent / "recipe.yaml")])  # up to date: nothing rebuilt
        assert res.returncode == 0, res.stderr
        assert {p: p.exists() for p in planted} == planted
        assert_valid(out, before)
    finally:
        live.kill()
        live.wait()

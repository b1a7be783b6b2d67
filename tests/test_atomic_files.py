"""`atomic_open`: a file appears whole on a clean exit, never after an error or a kill."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from lemur import atomic_files
from lemur.atomic_files import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temporaries,
    temp_name,
)
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, sha256_file
from lemur.shards.verify import verify

REPO = Path(__file__).resolve().parents[1]


def test_content_appears_only_on_clean_exit(tmp_path):
    dest = tmp_path / "sub" / "file.bin"
    with atomic_open(dest) as fh:
        fh.write(b"hello ")
        fh.flush()
        assert not dest.exists()  # nothing at the name while the block runs
        assert Path(fh.name) == temp_name(dest)
        fh.write(b"world")
    assert dest.read_bytes() == b"hello world"
    assert os.listdir(dest.parent) == ["file.bin"]


def test_text_mode_writes_with_the_encoding(tmp_path):
    dest = tmp_path / "t.jsonl"
    with atomic_open(dest, "w", encoding="utf-8") as fh:
        fh.write("café\n")
    assert dest.read_bytes() == "café\n".encode()


def test_an_exception_leaves_no_temp_and_no_destination(tmp_path):
    dest = tmp_path / "file.bin"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_open(dest) as fh:
            fh.write(b"half")
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_an_exception_leaves_an_existing_destination_unchanged(tmp_path):
    dest = tmp_path / "file.bin"
    atomic_write_bytes(dest, b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(dest) as fh:
            fh.write(b"new, but never finished")
            raise KeyboardInterrupt
    assert dest.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]


@pytest.mark.parametrize("durable, calls", [(True, 2), (False, 0)])
def test_fsync_when_asked(tmp_path, monkeypatch, durable, calls):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    atomic_write_bytes(tmp_path / "f", b"x", durable=durable)
    assert len(synced) == calls  # the file, then its directory after the rename
    assert (tmp_path / "f").read_bytes() == b"x"


def test_durable_is_the_default(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(atomic_files, "_fsync_dir", lambda d: synced.append(d))
    with atomic_open(tmp_path / "f") as fh:
        fh.write(b"x")
    assert synced == [tmp_path]


def test_a_library_writing_by_name_gets_the_temp_name(tmp_path):
    from safetensors.numpy import load_file, save_file

    dest = tmp_path / "sub" / "model.safetensors"
    with atomic_path(dest) as tmp:
        assert tmp == temp_name(dest) and not dest.exists()
        save_file({"w": np.arange(6, dtype=np.float32)}, str(tmp))
    assert np.array_equal(load_file(str(dest))["w"], np.arange(6, dtype=np.float32))
    assert os.listdir(dest.parent) == ["model.safetensors"]
    with pytest.raises(OSError):  # a writer that fails half-way: the old file stays, no temp
        with atomic_path(dest) as tmp:
            tmp.write_bytes(b"half")
            raise OSError("disk full")
    assert os.listdir(dest.parent) == ["model.safetensors"]
    assert "w" in load_file(str(dest))


def test_text_is_written_whole_in_utf8(tmp_path):
    dest = tmp_path / "summary.json"
    atomic_write_text(dest, '{"task": "caf\u00e9"}\n')
    assert dest.read_bytes() == '{"task": "café"}\n'.encode()
    assert os.listdir(tmp_path) == ["summary.json"]


def test_a_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode 'ab' is not 'wb' or 'w'"):
        with atomic_open(tmp_path / "f", "ab"):
            pass


# A writer that replaces `path` and is SIGKILLed halfway: it says "ready" once half the
# new content is on disk under the temporary name, then waits to be killed.
KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from lemur.atomic_files import atomic_open
    with atomic_open(sys.argv[1]) as fh:
        fh.write(b"\\xff" * 4096)
        fh.flush()
        print("ready", flush=True)
        time.sleep(60)
    """
)


def killed_while_writing(path: Path) -> Path:
    """SIGKILL a process in the middle of replacing `path`; the temporary file it left."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return path.with_name(f".{path.name}.tmp-{proc.pid}@{socket.gethostname()}")


def test_a_killed_writer_leaves_the_old_file_and_only_a_dot_temp(tmp_path):
    dest = tmp_path / "file.bin"
    atomic_write_bytes(dest, b"old")
    tmp = killed_while_writing(dest)
    assert dest.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == [tmp.name, "file.bin"]
    assert tmp.name.startswith(".file.bin.tmp-") and tmp.stat().st_size == 4096


def small_shard_dir(root: Path) -> Path:
    """A sound two-shard directory written directly (no build)."""
    (root / "tokenizer.model").write_bytes(b"stands in for a model: verify checks its sha256")
    writer = ShardWriter(root, "train", "train", "mixed", np.dtype("<u2"), shard_tokens=20)
    for n in (5, 8, 12, 6):
        writer.add(np.array([1, *range(10, 10 + n), 2]))
    shards = [s.to_json() for s in writer.close()]
    tok = {"file": "tokenizer.model", "sha256": sha256_file(root / "tokenizer.model")}
    manifest = {
        "format": FORMAT,
        "dtype": "uint16",
        "seq_len": 16,
        "tokenizer": {**tok, "vocab_size": 800, "bos_id": 1, "eos_id": 2},
        "shards": shards,
    }
    atomic_write_json(root / "manifest.json", manifest)
    assert verify(root) == []
    return root


def test_verify_ignores_a_killed_writers_temp_and_the_old_shard_stays_whole(tmp_path):
    root = small_shard_dir(tmp_path)
    shard = root / "train" / "00000.bin"
    before = shard.read_bytes()
    tmp = killed_while_writing(shard)
    assert tmp.is_file() and shard.read_bytes() == before
    assert verify(root) == []  # readers open the names the manifest lists, never a temp


# A scatter task SIGKILLed as it writes its bucket file (one copy per write, so it is
# caught after two of them): the pack stage's reader must not take the temp for output.
KILLED_SCATTER = textwrap.dedent(
    """
    import pickle, sys, time
    from pathlib import Path
    from lemur.data.pack import shuffle
    shuffle.CHUNK = 1
    slices = shuffle._slices
    def slow(*args):
        for i, chunk in enumerate(slices(*args)):
            yield chunk
            if i == 1:
                print("ready", flush=True)
                time.sleep(60)
    shuffle._slices = slow
    settings = pickle.loads(Path(sys.argv[3]).read_bytes())
    shuffle.scatter_task(0, Path(sys.argv[1]), None, Path(sys.argv[2]), settings)
    """
)


def one_tokenize_task(tok_dir: Path, n: int = 40, train_shards: int = 2):
    """Tokenize-stage files of one task of `n` code documents; pack settings that take all
    into `train_shards` shards (tests/test_data_runs.py uses it too)."""
    import json

    from lemur.data.pack.select import N_BINS, Groups
    from lemur.data.pack.settings import PackSettings
    from lemur.data.runs.format import DOC_RECORD

    rng = np.random.default_rng(0)
    tok_dir.mkdir(parents=True)
    rec = np.zeros(n, DOC_RECORD)
    rec["tokens"] = rng.integers(3, 50, n)
    rec["id_hash"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    rec["end"] = np.cumsum(rec["tokens"])
    np.save(tok_dir / "00000.docs.npy", rec)
    (tok_dir / "00000.json").write_text(json.dumps({"languages": ["Python"]}))
    rng.integers(3, 800, int(rec["end"][-1]), dtype=np.uint16).tofile(tok_dir / "00000.bin")
    none = np.packbits(np.zeros(N_BINS, bool)).tobytes()  # one whole pass, no partial one
    groups = Groups(seed=1, val_fraction=0.0, domains=("code",), groups=("code",))
    units = (("code", "Python", 1, none),)
    return PackSettings(groups, {"code": 0}, units, train_shards, {}, "<u2", False)


def test_the_pack_stage_does_not_trust_a_killed_scatter_tasks_temp(tmp_path):
    import pickle

    from lemur.data.pack.shuffle import check_scatter, scatter_task

    settings = one_tokenize_task(tmp_path / "tok")
    (tmp_path / "settings.pkl").write_bytes(pickle.dumps(settings))
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-c", KILLED_SCATTER, str(tmp_path / "tok"), str(work)]
    proc = subprocess.Popen(
        [*argv, str(tmp_path / "settings.pkl")], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert os.listdir(work / "buckets") == [
        f".scatter-00000.bin.tmp-{proc.pid}@{socket.gethostname()}"
    ]
    [(task, problem)] = check_scatter(work, 1, np.dtype("<u2"), masks=False)
    assert task == 0 and "scatter-00000.offsets" in problem  # the task is redone, not read
    scatter_task(0, tmp_path / "tok", None, work, settings)  # the rerun
    assert check_scatter(work, 1, np.dtype("<u2"), masks=False) == []
    scatter_task(0, tmp_path / "tok", None, tmp_path / "clean", settings)
    for ext in ("bin", "keys", "offsets", "json"):
        name = f"scatter-00000.{ext}"
        assert (work / "buckets" / name).read_bytes() == (
            tmp_path / "clean/buckets" / name
        ).read_bytes()


KILLED_SIGNER = """
import os, sys, time
from datatrove.data import Document
from lemur.data.dedup.signer import DedupSigner
from lemur.data.recipe.recipe import DedupConfig

def docs():
    for i in range(3):
        yield Document(text=f"def f{i}(): return {i}", id=str(i), metadata={"domain": "code"})
    open(sys.argv[2], "w").close()  # every scratch file is open and written: kill me now
    time.sleep(600)

for _ in DedupSigner(DedupConfig(), sys.argv[1]).run(docs()):
    pass
"""


def test_a_killed_dedup_signers_scratch_goes_at_the_next_resume(tmp_path):
    """SIGKILL a dedup signer mid-task: every file it leaves is a `temp_name` that
    `remove_stale_temporaries` (a build's resume) deletes; its domain scratch file was a
    `NamedTemporaryFile` that survived every rerun (#44 item 20)."""
    out, ready = tmp_path / "dedup", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SIGNER, str(out), str(ready)])
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), "the signer never reached its documents"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    left = sorted(os.listdir(out))
    assert len(left) == 5 and all(n.startswith(".00000.") for n in left), left  # 4 + domains
    remove_stale_temporaries(out)
    assert sorted(os.listdir(out)) == []


# The modules that may make temporaries outside atomic_files, and why: a sandbox's run
# directory is a fresh private temporary directory whose leftovers eval's own sweep finds.
OUTSIDE_ATOMIC_FILES = {
    "lemur/eval/sandbox/run.py": "a sandboxed run's private directory (leftovers.py sweeps)",
    "lemur/eval/sandbox/leftovers.py": "finds the sandbox directories a killed run left",
}


def test_every_temporary_goes_through_atomic_files():
    """No module of lemur makes a temporary with `tempfile` (whose names no resume
    recognises: a SIGKILL leaves them forever) but those listed, each with its reason."""
    import ast

    root = Path(atomic_files.__file__).resolve().parents[1]
    users = set()
    for path in sorted((root / "lemur").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if "tempfile" in names:
                users.add(path.relative_to(root).as_posix())
    assert users == set(OUTSIDE_ATOMIC_FILES)

"""Bad input at the command line: one-line errors (exit 2, no traceback) for damaged shard
directories, wrong manifest fields, unusable output paths and tokenizer settings, and a
demo dry run that writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import NO_FILTERS, real_python_files, real_text_docs, write_jsonl

from lemur.data.cli import main
from lemur.data.encode.tokenizer import BOS_ID, EOS_ID
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, sha256_file


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args], capture_output=True, text=True, cwd=cwd
    )


@pytest.fixture
def run(capsys):
    """`lemur-data ARGS` in this process (fast); any traceback fails the test."""

    def call(*args: str) -> subprocess.CompletedProcess:
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return call


def one_line_error(res: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single `lemur-data: error:` line of a failed command."""
    assert res.returncode == code, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lemur-data: error: "), res.stderr
    return lines[0]


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory, tokenizer_model) -> Path:
    """A small, sound shard directory written directly (no build): two shards of 3 docs."""
    root = tmp_path_factory.mktemp("shards")
    shutil.copy(tokenizer_model, root / "tokenizer.model")
    writer = ShardWriter(root, "train", "train", "mixed", np.dtype("<u2"), shard_tokens=30)
    for n in (5, 8, 12, 6, 9, 7):
        writer.add(np.array([BOS_ID, *range(10, 10 + n), EOS_ID]))
    shards = [s.to_json() for s in writer.close()]
    tokens = sum(s["tokens"] for s in shards)
    atomic_write_json(
        root / "manifest.json",
        {
            "format": FORMAT,
            "dtype": "uint16",
            "seq_len": 16,
            "tokenizer": {
                "file": "tokenizer.model",
                "sha256": sha256_file(root / "tokenizer.model"),
                "vocab_size": 800,
                "bos_id": BOS_ID,
                "eos_id": EOS_ID,
            },
            "shards": shards,
            "mix": {"target": {"code": 1}, "tokens": {"code": tokens}, "sources": {}},
            "counts": {},
        },
    )
    assert main(["verify", str(root)]) == 0
    return root


def damaged_copy(shard_dir: Path, tmp_path: Path) -> tuple[Path, dict]:
    d = tmp_path / "copy"
    shutil.copytree(shard_dir, d)
    return d, json.loads((d / "manifest.json").read_text())


def test_stats_is_sound_on_a_sound_directory(run, shard_dir, tmp_path):
    res = run("stats", str(shard_dir), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["lengths"]["train/mixed"]["p0"] == 7
    (tmp_path / "afile").write_text("x")
    line = one_line_error(
        run("stats", str(shard_dir), "--json", "--plots", str(tmp_path / "afile"))
    )
    assert line.startswith(f"lemur-data: error: --plots {tmp_path / 'afile'}: ")


@pytest.mark.parametrize("damage", ["missing_bin", "odd_idx", "decreasing_idx", "short_bin"])
def test_stats_refuses_a_damaged_directory_and_points_to_verify(run, shard_dir, tmp_path, damage):
    d, manifest = damaged_copy(shard_dir, tmp_path)
    shard = manifest["shards"][1]
    idx = d / shard["index"]
    if damage == "missing_bin":
        (d / shard["file"]).unlink()
    elif damage == "odd_idx":
        idx.write_bytes(idx.read_bytes() + b"\x01\x02\x03")
    elif damage == "decreasing_idx":
        ends = np.fromfile(idx, dtype="<u8")
        ends[0], ends[1] = ends[1], ends[0]
        ends.tofile(idx)
    else:
        (d / shard["file"]).write_bytes((d / shard["file"]).read_bytes()[:-2])
    # One real process, to see exactly what a user sees; the rest in this process.
    line = one_line_error(cli("stats", str(d)) if damage == "missing_bin" else run("stats", str(d)))
    assert f"{d}: damaged shard directory: " in line
    assert f"run `lemur-data verify {d}`" in line
    res = run("verify", str(d))
    assert res.returncode == 1 and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda m: m["shards"][0].update(tokens="12"), "shards[0].tokens must be an integer"),
        (lambda m: m.update(shards={"a": 1}), "shards must be a list"),
        (lambda m: m.update(tokenizer="tokenizer.model"), "tokenizer must be a mapping"),
        (lambda m: m["shards"][1].update(index="/etc/passwd"), "shards[1].index '/etc/passwd'"),
        (lambda m: m["shards"][0].update(documents=-1), "shards[0].documents must be"),
        (lambda m: m.update(seq_len="16"), "seq_len must be an integer"),
        (lambda m: m["mix"].update(tokens={"code": "x"}), "mix.tokens must map"),
    ],
)
def test_wrong_manifest_field_types_are_named(run, shard_dir, tmp_path, change, field):
    d, manifest = damaged_copy(shard_dir, tmp_path)
    change(manifest)
    (d / "manifest.json").write_text(json.dumps(manifest))
    res = run("verify", str(d))
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert field in res.stderr
    assert field in one_line_error(run("stats", str(d)))


# ------------------------------------------------------------------------------ build


def small_recipe(tmp_path: Path, **changes) -> dict:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    for p in real_python_files(3):
        (code / p.name).write_bytes(p.read_bytes())
    text = write_jsonl(tmp_path / "t.jsonl", real_text_docs(3))
    raw = {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 1000, "sample_bytes": 200_000}},
        "executor": {"tasks": 1, "workers": 1},
        "filters": NO_FILTERS,
        "sources": [
            {"name": "c", "domain": "code", "format": "files", "paths": [str(code)]},
            {"name": "t", "domain": "text", "format": "jsonl", "paths": [str(text)]},
        ],
    }
    return {**raw, **changes}


def write_recipe(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(small_recipe(tmp_path, **changes)))
    return path


def test_output_that_is_a_file_or_under_one_is_refused_up_front(run, tmp_path):
    recipe = write_recipe(tmp_path)
    (tmp_path / "afile").write_text("x")
    line = one_line_error(run("build", str(recipe), "--set", f"output={tmp_path / 'afile'}"))
    assert line.endswith(f"recipe: output '{tmp_path / 'afile'}' exists and is not a directory")
    under = tmp_path / "afile" / "out"
    line = one_line_error(run("build", str(recipe), "--dry-run", "--set", f"output={under}"))
    assert f"output '{under}' cannot be created: '{tmp_path / 'afile'}' is a file" in line
    line = one_line_error(run("build", str(recipe), "--set", "output="))
    assert line == "lemur-data: error: recipe: output is empty"
    line = one_line_error(run("build", str(recipe), "--set", f"rejects={tmp_path / 'afile'}"))
    assert "recipe: rejects" in line


def test_output_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    import os

    raw = small_recipe(tmp_path)
    # Tests run as root, for whom every directory is writable: let access() say no.
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
    with pytest.raises(
        RecipeError, match=r"output '.*out' cannot be written: '.*' is not writable"
    ):
        recipe_from_dict(raw)


def test_vocab_size_sentencepiece_refuses_is_one_line(tmp_path):
    recipe = write_recipe(tmp_path, tokenizer={"train": {"vocab_size": 300}})
    line = one_line_error(cli("build", str(recipe)))
    assert "recipe: tokenizer.train.vocab_size 300 is too small for this corpus" in line


def test_tokenizer_train_cli_checks_vocab_size_and_out(run, tmp_path):
    recipe = write_recipe(tmp_path)
    line = one_line_error(
        run(
            "tokenizer",
            "train",
            str(recipe),
            "--out",
            str(tmp_path / "t.model"),
            "--vocab-size",
            "10",
        )
    )
    assert line == "lemur-data: error: --vocab-size 10: must be > 256 and <= 2^32"
    (tmp_path / "afile").write_text("x")
    line = one_line_error(
        run("tokenizer", "train", str(recipe), "--out", str(tmp_path / "afile" / "t.model"))
    )
    assert f"--out {tmp_path / 'afile' / 't.model'}: " in line
    outdir = tmp_path / "models"
    outdir.mkdir()
    res = run("tokenizer", "train", str(recipe), "--out", str(outdir), "--vocab-size", "400")
    assert res.returncode == 0, res.stderr
    assert (outdir / "tokenizer.model").stat().st_size > 1000


def test_demo_dry_run_writes_nothing(tmp_path):
    res = cli("build", "--dry-run", "--set", f"output={tmp_path / 'demo'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout)["output"] == str(tmp_path / "demo")
    assert list(tmp_path.iterdir()) == []
    line = one_line_error(cli("build", "--dry-run", "--set", "output=", cwd=tmp_path))
    assert line == "lemur-data: error: recipe: output is empty"
    assert list(tmp_path.iterdir()) == []

"""`lemur-data export`'s driver (#48 items 1, 2, 7): the command end to end, reruns that give
the same bytes, a SIGKILLed export that leaves no OUT, an existing OUT kept without --force,
a corpus a format cannot hold refused in one line, linked (not copied) token files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import base_recipe

from lemur.data.cli import main
from lemur.shards.format import make_manifest, tokenizer_entry, write_manifest, write_shard

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory, corpus_dir) -> Path:
    """A small code + text build: several train shards, a val shard per domain."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("build")
    text = [corpus_dir / "a.jsonl"]
    build(recipe_from_dict(base_recipe(tmp, corpus_dir / "code", text, shard_tokens=20_000)))
    return tmp / "out"


@pytest.fixture
def run(capsys):
    """`lemur-data ARGS` in this process: (exit code, stdout, stderr)."""

    def call(*args: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return call


def one_line(err: str) -> str:
    """The one error line of a refused command (no traceback)."""
    assert "Traceback" not in err
    lines = [x for x in err.strip().splitlines() if x.startswith("lemur-data")]
    assert len(lines) == 1, err
    return lines[0]


def contents(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path -> sha256 of its bytes."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fmt", ["megatron", "nanotron", "olmo"])
def test_export_command_writes_the_layout_and_reruns_byte_identical(run, build_dir, tmp_path, fmt):
    out = tmp_path / "out"
    code, stdout, err = run("export", build_dir, "--format", fmt, "--out", out)
    assert code == 0, err
    manifest = json.loads((build_dir / "manifest.json").read_text())
    info = json.loads((out / "export.json").read_text())
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    assert info["train"] == [f"train/{n:05d}" for n in range(len(train))]
    assert set(info["val"]) == {"code", "text"}
    assert info["format"] == fmt and info["eos_id"] == manifest["tokenizer"]["eos_id"]
    sha = hashlib.sha256((build_dir / "manifest.json").read_bytes()).hexdigest()
    assert info["source_manifest_sha256"] == sha
    listed = {f["path"]: f["sha256"] for f in info["files"]}
    assert listed == {k: v for k, v in contents(out).items() if k != "export.json"}
    # TRAINING.md is what the command printed, and names this export's paths
    assert (out / "TRAINING.md").read_text() in stdout + "\n"
    assert str(out / "tokenizer") in stdout
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    ext = {"megatron": ".bin", "nanotron": ".ds", "olmo": ".npy"}[fmt]
    # zero copy: the token files are the shards themselves (same filesystem)
    for n, s in enumerate(train):
        assert os.path.samefile(out / f"train/{n:05d}{ext}", build_dir / s["file"])
    before = contents(out)
    code, _, err = run("export", build_dir, "--format", fmt, "--out", out, "--force")
    assert code == 0, err
    assert contents(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left beside it


def test_split_train_exports_only_the_train_shards(run, build_dir, tmp_path):
    out = tmp_path / "train-only"
    code, stdout, err = run(
        "export", build_dir, "--format", "megatron", "--out", out, "--split", "train"
    )
    assert code == 0, err
    assert not (out / "val").exists() and json.loads((out / "export.json").read_text())["val"] == {}
    assert "--train-data-path" in stdout and "--valid-data-path" not in stdout


def test_existing_export_refused_without_force(run, build_dir, tmp_path):
    out = tmp_path / "out"
    assert run("export", build_dir, "--format", "olmo", "--out", out)[0] == 0
    before = contents(out)
    code, _, err = run("export", build_dir, "--format", "nanotron", "--out", out)
    assert code == 2
    assert one_line(err).endswith(f"{out}: an export is already there; --force replaces it")
    assert contents(out) == before
    # a folder that is not an export is never replaced, even with --force
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _, err = run("export", build_dir, "--format", "olmo", "--out", mine, "--force")
    assert code == 2 and "is not a lemur export" in one_line(err)
    assert (mine / "notes.txt").read_text() == "keep me"


def test_bad_input_is_one_line(run, tmp_path):
    code, _, err = run("export", tmp_path, "--format", "megatron", "--out", tmp_path / "x")
    assert code == 2 and "no manifest" in one_line(err)
    code, _, err = run("export", tmp_path, "--format", "bogus", "--out", tmp_path / "x")
    assert code == 2 and "invalid choice: 'bogus'" in one_line(err)


def forged_uint32_dir(root: Path, tokenizer_model: Path, ids: list[int], vocab: int) -> Path:
    """A shard folder of uint32 ids (one train shard of one document), as a build writes."""
    root.mkdir()
    (root / "tokenizer.model").write_bytes(tokenizer_model.read_bytes())
    tokens = np.array([1, *ids, 2], np.uint32)
    shard = write_shard(root, "train/00000", tokens, [len(tokens)], np.dtype("<u4"), "train", "x")
    tok = tokenizer_entry(root, "tokenizer.model", vocab, 1, 2)
    write_manifest(root, make_manifest(np.dtype("<u4"), 8, tok, [shard]))
    return root


def test_ids_that_do_not_fit_megatrons_int32_are_refused(run, tmp_path, tokenizer_model):
    big = forged_uint32_dir(tmp_path / "big", tokenizer_model, [5, 2**31 + 7, 9], 2**31)
    code, _, err = run("export", big, "--format", "megatron", "--out", tmp_path / "m")
    line = one_line(err)
    assert code == 2 and f"{big / 'train/00000.bin'}: token id {2**31 + 7} at offset 2" in line
    assert "does not fit Megatron's int32" in line
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == [big]
    huge = forged_uint32_dir(tmp_path / "huge", tokenizer_model, [5], 3_000_000_000)
    code, _, err = run("export", huge, "--format", "megatron", "--out", tmp_path / "m")
    assert code == 2 and "vocab_size 3,000,000,000 does not fit" in one_line(err)
    # ids below 2^31 in a uint32 build: int32 (code 4), the same bytes, linked
    ok = forged_uint32_dir(tmp_path / "ok", tokenizer_model, [5, 70_000, 9], 80_000)
    assert run("export", ok, "--format", "megatron", "--out", tmp_path / "m")[0] == 0
    assert (tmp_path / "m/train/00000.idx").read_bytes()[17] == 4
    assert os.path.samefile(tmp_path / "m/train/00000.bin", ok / "train/00000.bin")


# An export whose format stops after its first shard, says so, and waits to be killed: the
# planted point is in this script, not in lemur.
KILLED_EXPORT = textwrap.dedent(
    """
    import sys, time
    from lemur.export import nanotron
    from lemur.export.run import export

    write = nanotron.EXPORTER.write_part
    def write_then_wait(part, info, out):
        files = write(part, info, out)
        print("ready", flush=True)
        time.sleep(120)
        return files
    nanotron.EXPORTER.write_part = write_then_wait
    export(sys.argv[1], "nanotron", sys.argv[2])
    """
)


def test_sigkilled_export_leaves_no_out_and_a_rerun_redoes_it(run, build_dir, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_EXPORT, str(build_dir), str(out)],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    (left,) = tmp_path.iterdir()  # the dead export's temporary, nothing a rerun trusts
    assert left.name.startswith(f".out.tmp-{proc.pid}@")
    assert (left / "train" / "00000.ds").is_file() and not (left / "export.json").exists()
    code, _, err = run("export", build_dir, "--format", "nanotron", "--out", out)
    assert code == 0, err
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the temporary is gone
    clean = tmp_path.parent / f"{tmp_path.name}-clean"
    assert run("export", build_dir, "--format", "nanotron", "--out", clean)[0] == 0
    assert contents(out).keys() == contents(clean).keys()


def test_recipe_exports_are_the_builds_last_stage(tmp_path, corpus_dir):
    """`export:` in a recipe: written after the build, not part of it (an up-to-date build
    only exports), redone only where missing; a bad entry is the recipe's one line."""
    from lemur.data.build import build
    from lemur.data.recipe.errors import RecipeError
    from lemur.data.recipe_loader import recipe_from_dict

    raw = base_recipe(tmp_path, corpus_dir / "code", [corpus_dir / "a.jsonl"], shard_tokens=20_000)
    plain = build(recipe_from_dict(raw))
    exports = [
        {"format": "nanotron", "out": str(tmp_path / "nano")},
        {"format": "olmo", "out": str(tmp_path / "olmo"), "split": "train"},
    ]
    again = build(recipe_from_dict({**raw, "export": exports}))
    assert again["shards"] == plain["shards"]  # the same build: nothing rebuilt
    assert again["recipe_sha256"] == plain["recipe_sha256"]
    sha = hashlib.sha256((tmp_path / "out" / "manifest.json").read_bytes()).hexdigest()
    for e in exports:
        info = json.loads((Path(e["out"]) / "export.json").read_text())
        assert info["source_manifest_sha256"] == sha and info["format"] == e["format"]
    assert json.loads((tmp_path / "olmo" / "export.json").read_text())["val"] == {}
    kept = (tmp_path / "nano" / "export.json").stat().st_ino
    shutil.rmtree(tmp_path / "olmo")
    build(recipe_from_dict({**raw, "export": exports}))
    assert (tmp_path / "nano" / "export.json").stat().st_ino == kept  # up to date: untouched
    assert (tmp_path / "olmo" / "export.json").is_file()  # missing: redone
    with pytest.raises(RecipeError, match=r"^recipe: export.format 'gpt' is not one of"):
        recipe_from_dict({**raw, "export": [{"format": "gpt", "out": "x"}]})
    with pytest.raises(RecipeError, match=r"overlaps the build's output"):
        recipe_from_dict({**raw, "export": [{"format": "olmo", "out": str(tmp_path / "out/x")}]})

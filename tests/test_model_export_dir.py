"""lemur-convert's destinations (lemur.model.export_dir): a non-empty DST needs --force and is
then replaced whole, a file or a source is refused, a killed export leaves nothing that a
rerun trusts; a source of the wrong kind names the command that reads it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file

from lemur.convert import cli as convert
from lemur.model import checkpoint, hf, pretrained
from lemur.model.config import LlamaConfig, Params, param_shapes

CONFIG = LlamaConfig(
    vocab_size=800, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64
)
ROOT = Path(__file__).resolve().parents[1]
SMALL_SHARDS = str(40e3 / 2**30)  # --shard-gb giving several files for CONFIG in fp32


def _params(seed: int) -> Params:
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: rng.standard_normal(s).astype(np.float32),
        param_shapes(CONFIG),
        is_leaf=lambda x: isinstance(x, tuple),
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tokenizer_model: Path) -> Path:
    """`a` (with the tokenizer) and `b` (another model, no tokenizer): lemur checkpoints."""
    root = tmp_path_factory.mktemp("ckpts")
    checkpoint.save_params(root / "a", _params(0), CONFIG, tokenizer_model)
    checkpoint.save_params(root / "b", _params(1), CONFIG)
    return root


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _tensors(directory: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_a_second_export_replaces_the_first_whole(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "hf"
    argv_a = ["to-hf", str(checkpoints / "a"), str(out), "--dtype", "float32"]
    assert convert.main([*argv_a, "--shard-gb", SMALL_SHARDS]) == 0
    first = _files(out)
    assert "model.safetensors.index.json" in first and "tokenizer.json" in first
    # Another model into the same folder: refused, the first export untouched.
    argv_b = ["to-hf", str(checkpoints / "b"), str(out), "--dtype", "float32"]
    assert convert.main(argv_b) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0] and "--force" in err[0], err
    assert _files(out) == first
    # With --force: only the second model's files, nothing of the first left beside them.
    assert convert.main([*argv_b, "--force"]) == 0
    assert _files(out) == ["config.json", "model.safetensors"]
    assert _files(tmp_path) == ["hf"]  # no partial or old folder left beside it
    model = transformers.LlamaForCausalLM.from_pretrained(out)
    want = dict(hf.params_to_hf(_params(1), CONFIG, "float32"))
    got = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)


def test_every_command_refuses_a_non_empty_destination(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert convert.main(["to-hf", str(checkpoints / "b"), str(out)]) == 2
    assert convert.main(["to-hf", str(checkpoints / "b"), str(tmp_path / "hf")]) == 0
    assert convert.main(["to-lemur", str(tmp_path / "hf"), str(out)]) == 2
    assert (out / "notes.txt").read_text() == "mine" and _files(out) == ["notes.txt"]
    assert "not empty (1 entries: notes.txt)" in capsys.readouterr().err
    assert convert.main(["to-lemur", str(tmp_path / "hf"), str(out), "--force"]) == 0
    assert _files(out) == ["config.json", "hf_token_ids.json", "params"]
    (tmp_path / "empty").mkdir()  # an empty directory is no export to lose
    assert convert.main(["to-lemur", str(tmp_path / "hf"), str(tmp_path / "empty")]) == 0


def test_a_file_or_a_source_as_destination_is_one_line(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("keep")
    for force in ([], ["--force"]):  # a file is no export, to replace or not
        assert convert.main(["to-hf", str(checkpoints / "b"), str(tmp_path / "file"), *force]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "exists and is not a directory" in err[0], err
        assert (tmp_path / "file").read_text() == "keep"
    assert convert.main(["to-hf", str(checkpoints / "b"), str(tmp_path / "file" / "x")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    # DST is the source, or holds it: replacing it would delete the source.
    for dst in (checkpoints / "b", checkpoints):
        assert convert.main(["to-hf", str(checkpoints / "b"), str(dst), "--force"]) == 2
        assert "is or holds the source" in capsys.readouterr().err
    assert checkpoint.load_checkpoint_config(checkpoints / "b") == CONFIG


def test_a_source_of_another_kind_names_the_command(
    checkpoints: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 1\n")
    assert convert.main(["to-hf", str(run), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lemur-train run directory" in err[0], err
    assert "`lemur-convert from-run` (then to-hf its output)" in err[0]
    assert convert.main(["to-lemur", str(checkpoints / "b"), str(tmp_path / "x")]) == 2
    assert "a lemur checkpoint (config.json + params/)" in capsys.readouterr().err
    assert convert.main(["to-hf", str(tmp_path / "missing"), str(tmp_path / "x")]) == 2
    assert "missing: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_one_test_tells_every_kind_of_model_folder(tmp_path: Path) -> None:
    """pretrained.folder_kind names each kind by its files (what lemur-eval and lemur-convert
    read); pretrained.kind, what a model starts from, takes only a checkpoint or HF folder."""
    layouts = {
        "lemur": ("config.json", "params/"),
        "hf": ("config.json", "model.safetensors.index.json"),
        "step": ("state/", "meta/"),
        "run": ("config.yaml",),
        "run-without-config": ("checkpoints/",),
        "other": ("config.json",),
    }
    for name, files in layouts.items():
        for f in files:
            (tmp_path / name / f).parent.mkdir(parents=True, exist_ok=True)
            if f.endswith("/"):
                (tmp_path / name / f).mkdir()
            else:
                (tmp_path / name / f).write_text("{}")
    kinds = {name: pretrained.folder_kind(tmp_path / name) for name in layouts}
    assert kinds == {
        "lemur": "lemur",
        "hf": "hf",
        "step": "step",
        "run": "run",
        "run-without-config": "run",
        "other": None,
    }
    assert [pretrained.kind(tmp_path / k) for k in ("lemur", "hf")] == ["lemur", "hf"]
    for name in ("step", "run", "other"):
        with pytest.raises(pretrained.PretrainedError, match="neither a lemur checkpoint"):
            pretrained.kind(tmp_path / name)


# Run in a child: the export is killed (SIGKILL, nothing to clean up) at a chosen moment.
KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from lemur.convert import cli as convert
    from lemur.model import export_dir, hf

    moment, *argv = sys.argv[1:]
    if moment == "mid-write":  # after the first safetensors file of several
        save = hf._save_shard
        def kill_after_first(path, tensors):
            save(path, tensors)
            os.kill(os.getpid(), signal.SIGKILL)
        hf._save_shard = kill_after_first
    else:  # between moving the old DST aside and moving the new one in
        replace = os.replace
        def kill_at_swap(src, dst):
            if str(src).endswith(export_dir.PARTIAL):
                os.kill(os.getpid(), signal.SIGKILL)
            replace(src, dst)
        os.replace = kill_at_swap
    sys.exit(convert.main(argv))
    """
)


@pytest.mark.parametrize("moment", ["mid-write", "mid-swap"])
def test_a_killed_export_leaves_nothing_a_rerun_trusts(
    moment: str, checkpoints: Path, tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    base = ["to-hf", str(checkpoints / "a"), str(out), "--dtype", "float32"]
    assert convert.main(base) == 0  # the previous export, one file
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv = ["to-hf", str(checkpoints / "b"), str(out), "--shard-gb", SMALL_SHARDS, "--force"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, moment, *argv], env=env, capture_output=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-2000:]
    # What a reader of DST sees: nothing (mid-swap) or the previous export, never a mix.
    if moment == "mid-write":
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()
    # A rerun without --force finds the previous export back in place (and refuses it)...
    assert convert.main(argv[:-1]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _files(tmp_path) == ["hf"]
    # ... and with --force writes the new one whole.
    assert convert.main(argv) == 0
    assert "model.safetensors.index.json" in _files(out) and "tokenizer.json" not in _files(out)
    want = dict(hf.params_to_hf(_params(1), CONFIG, "bfloat16"))
    got = _tensors(out)
    assert set(got) == set(want)
    assert _files(tmp_path) == ["hf"]

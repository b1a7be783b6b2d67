"""lemur-convert with the HF folders users actually have: what their config.json says is carried
through to-lemur and back out by to-hf (a Qwen2's null bos, its initializer_range). No torch:
the folders are written by lemur's own writer and then edited as a user's would be."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lemur.convert import cli as convert
from lemur.model import hf, pretrained
from lemur.model.config import LlamaConfig, param_shapes


def tiny_config(arch: str = "llama") -> LlamaConfig:
    """A two-layer model of `arch` small enough to convert in well under a second."""
    return LlamaConfig(
        vocab_size=64,
        d_model=16,
        n_layers=2,
        n_heads=2,
        n_kv_heads=1,
        d_ff=32,
        max_seq_len=64,
        arch=arch,
        qkv_bias=arch == "qwen2",
    )


def write_hf_folder(folder: Path, config: LlamaConfig, **config_json: object) -> Path:
    """An HF model folder of random fp32 weights; `config_json` keys replace config.json's."""
    rng = np.random.default_rng(0)

    def build(shapes: object) -> object:
        if isinstance(shapes, dict):
            return {k: build(v) for k, v in shapes.items()}
        return rng.standard_normal(shapes).astype(np.float32)

    params = build(param_shapes(config))
    hf.write_hf_checkpoint(folder, config, hf.params_to_hf(params, config, "float32"), "float32")
    written = json.loads((folder / "config.json").read_text())
    for key, value in config_json.items():
        if value is ...:
            written.pop(key, None)
        else:
            written[key] = value
    (folder / "config.json").write_text(json.dumps(written))
    return folder


def _round_trip(tmp_path: Path, src: Path) -> dict:
    """config.json after to-lemur then to-hf of `src`."""
    assert convert.main(["to-lemur", str(src), str(tmp_path / "lemur")]) == 0
    assert convert.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "back")]) == 0
    return json.loads((tmp_path / "back" / "config.json").read_text())


@pytest.mark.parametrize(
    "arch, written, expected",
    [
        # Qwen2.5-like: no bos token (id 1 is the ordinary token '"'), its own init range.
        ("qwen2", {"bos_token_id": None, "eos_token_id": 7, "initializer_range": 0.01}, (None, 7)),
        # Qwen2's config class has no bos/eos: a config.json without the keys means none.
        (
            "qwen2",
            {"bos_token_id": ..., "eos_token_id": ..., "initializer_range": 0.01},
            (None, None),
        ),
        # Llama-2: bos 1, eos 2, whether written or left to the family's defaults.
        ("llama", {"bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.01}, (1, 2)),
        ("llama", {"bos_token_id": ..., "eos_token_id": ..., "initializer_range": 0.01}, (1, 2)),
    ],
)
def test_to_hf_carries_token_ids_and_initializer_range(
    tmp_path: Path, arch: str, written: dict, expected: tuple
) -> None:
    src = write_hf_folder(tmp_path / "src", tiny_config(arch), **written)
    back = _round_trip(tmp_path, src)
    assert (back["bos_token_id"], back["eos_token_id"]) == expected
    assert back["initializer_range"] == 0.01


def test_generation_config_ids_still_fill_what_config_json_leaves_to_defaults(
    tmp_path: Path,
) -> None:
    # A lemur checkpoint without recorded ids (from-run, or written before they were recorded)
    # exports the carried generation_config.json's ids, as before.
    src = write_hf_folder(tmp_path / "src", tiny_config("llama"), bos_token_id=5, eos_token_id=6)
    (src / "generation_config.json").write_text(json.dumps({"bos_token_id": 9, "eos_token_id": 6}))
    back = _round_trip(tmp_path, src)
    assert (back["bos_token_id"], back["eos_token_id"]) == (5, 6)  # config.json's own
    (tmp_path / "lemur" / "hf_token_ids.json").unlink()
    assert convert.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "b2")]) == 0
    again = json.loads((tmp_path / "b2" / "config.json").read_text())
    assert (again["bos_token_id"], again["eos_token_id"]) == (9, 6)


def test_source_token_ids_follow_the_files_to_their_model(tmp_path: Path) -> None:
    # from-run finds the ids through the tokenizer files of the run's init_from: an HF
    # folder's config.json, or the ids a lemur checkpoint recorded beside `hf_tokenizer/`.
    src = write_hf_folder(tmp_path / "src", tiny_config("qwen2"), bos_token_id=None)
    (src / "tokenizer_config.json").write_text("{}")
    assert pretrained.source_token_ids(pretrained.tokenizer_files(src))["bos_token_id"] is None
    assert convert.main(["to-lemur", str(src), str(tmp_path / "lemur")]) == 0
    files = pretrained.tokenizer_files(tmp_path / "lemur")
    assert list(files) == ["tokenizer_config.json"]
    assert pretrained.source_token_ids(files) == {"bos_token_id": None, "eos_token_id": 2}
    assert pretrained.source_token_ids({}) == {}


TENSOR = "model.layers.1.mlp.up_proj.weight"


def corrupt(folder: Path, how: str) -> str:
    """Damage the folder's model.safetensors as downloads and disks do; what the one-line
    error must say."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
        return f"{path}: truncated ({len(data) * 2 // 3:,} bytes; its header describes"
    if how == "garbage":
        path.write_bytes(b"<html>404 Not Found</html>\n" * 20)
        return f"{path}: not a safetensors file, or truncated"
    if how == "bad-header":
        path.write_bytes((24).to_bytes(8, "little") + b'{"a": {"dtype": "F32",}}' + data[:64])
        return f"{path}: not a safetensors file (header:"
    tensors = load_file(path)
    if how == "missing":
        del tensors[TENSOR]
        message = f"{folder}: tensor {TENSOR} missing"
    else:  # "shape": a transposed matrix
        tensors[TENSOR] = np.ascontiguousarray(tensors[TENSOR].T)
        message = f"{path}: tensor {TENSOR} has shape [16, 32], config.json gives [32, 16]"
    save_file(tensors, path, metadata={"format": "pt"})
    return message


@pytest.mark.parametrize("how", ["truncated", "garbage", "bad-header", "missing", "shape"])
def test_to_lemur_of_a_damaged_folder_is_one_line_and_writes_nothing(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_hf_folder(tmp_path / "src", tiny_config())
    message = corrupt(src, how)
    capsys.readouterr()
    assert convert.main(["to-lemur", str(src), str(tmp_path / "dst")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lemur-convert: {message}"), err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no DST, no partial one


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 KiB tmpfs (root only: tests run as root here and in CI), unmounted after."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_one_line_exit_1_and_leaves_nothing(
    tmp_path: Path, full_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    src = write_hf_folder(tmp_path / "src", tiny_config())
    assert convert.main(["to-lemur", str(src), str(tmp_path / "lemur")]) == 0
    for command, source, dst in [
        ("to-lemur", src, full_disk / "lemur"),  # orbax (tensorstore) writes
        ("to-hf", tmp_path / "lemur", full_disk / "hf"),  # safetensors writes
    ]:
        capfd.readouterr()
        assert convert.main([command, str(source), str(dst)]) == 1
        err = capfd.readouterr().err
        assert err == f"lemur-convert: {dst}: no space left on device\n", err
        assert list(full_disk.iterdir()) == []  # no DST, no partial one


@pytest.mark.parametrize("how", ["truncated", "missing"])
def test_lemur_eval_of_a_damaged_folder_is_one_line(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # lemur-eval converts an HF folder on the fly: the same check, the same one line, exit 2.
    from lemur.eval import cli as eval_cli

    src = write_hf_folder(tmp_path / "src", tiny_config())
    message = corrupt(src, how)
    capsys.readouterr()
    assert eval_cli.main(["generate", str(src), "--prompt", "def f():"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lemur-eval: {message}"), err
    assert err.count("\n") == 1

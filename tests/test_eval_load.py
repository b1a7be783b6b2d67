"""Finding a run's tokenizer from any working directory (lemur.eval.load, find_tokenizer):
a run stores absolute paths; a moved data directory, or a --tokenizer that is a directory,
is one clear line in lemur-eval and lemur-convert from-run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from conftest import real_python_files, real_text_docs
from test_eval_bpb import _write_shards
from test_model_convert_source import tiny_config as hf_tiny_config
from test_model_convert_source import write_hf_folder
from test_train_loop import build_corpus, compile_cache, tiny_config

from lemur.convert import cli as convert
from lemur.eval import cli
from lemur.eval.load import LoadError, load_model
from lemur.model import checkpoint as model_checkpoint
from lemur.model import llama, pretrained
from lemur.train.checkpoint import Checkpointer
from lemur.train.config import load_train_config
from lemur.train.loop import train

DOCS = {
    "code": [p.read_text()[:1500] for p in real_python_files(8)],
    "text": [d["text"][:1500] for d in real_text_docs(8)],
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-step lemur-train run started in `<root>/proj` with relative paths (the
    model and corpus of test_train_loop: its compiled step comes from the shared cache)."""
    proj = tmp_path_factory.mktemp("relative") / "proj"
    build_corpus(proj / "build")
    cwd = Path.cwd()
    try:
        os.chdir(proj)
        config = tiny_config(
            Path("build/out"),
            Path("runs/x"),
            "steps=2",
            "checkpoint.every=2",
            "eval.at_start=false",
            cache=compile_cache(tmp_path_factory),
        )
        assert config.data.dirs == ["build/out"]  # relative, as a user writes them
        train(config)
    finally:
        os.chdir(cwd)
    return proj / "runs" / "x"


def test_a_run_stores_absolute_paths_and_loads_from_elsewhere(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = yaml.safe_load((trained / "config.yaml").read_text())
    assert saved["data"]["dirs"] == [str(trained.parent.parent / "build" / "out")]
    assert saved["run_dir"] == str(trained)
    monkeypatch.chdir(tmp_path)  # another working directory
    loaded = load_model(trained)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.path.parent.parent == trained.parent.parent / "build" / "out"
    assert convert.main(["from-run", str(trained), "model"]) == 0
    assert (tmp_path / "model" / "tokenizer.model").read_bytes() == (
        loaded.tokenizer.path.read_bytes()
    )


def _legacy_run(root: Path, shards: Path, run_dir: str, data_dir: str) -> Path:
    """A run as lemur-train wrote them before paths were stored absolute (relative to
    `root`, where it was started), with the tokenizer hash it records."""
    run = root / run_dir
    small = "{d_model: 32, n_heads: 4, n_kv_heads: 2, d_ff: 64}"
    config = load_train_config(
        "tiny", [f"data.dirs=[{data_dir}]", f"run_dir={run_dir}", f"model.overrides={small}"]
    )
    manifest = json.loads((shards / "manifest.json").read_text())
    vocab = manifest["tokenizer"]["vocab_size"]
    params = llama.init_params(config.model.llama(vocab), jax.random.key(0, impl="rbg"))
    state = {"step": np.int32(3), "params": params, "rng": np.zeros(2, np.uint32)}
    meta = {
        "config": config.to_dict(),
        "vocab_size": vocab,
        "tokenizer_sha256": manifest["tokenizer"]["sha256"],
    }
    ckpt = Checkpointer(run / "checkpoints", async_save=False)
    ckpt.save(3, state, {"next": 0}, meta)
    ckpt.close()
    (run / "config.yaml").write_text(config.to_yaml())
    return run


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory, tokenizer_model: Path) -> Path:
    """`<root>/runs/old`, started in <root> with data.dirs [data/shards] (both relative)."""
    root = tmp_path_factory.mktemp("legacy")
    shards = _write_shards(root / "data" / "shards", tokenizer_model, DOCS)
    return _legacy_run(root, shards, "runs/old", "data/shards")


def test_a_legacy_relative_run_finds_its_data_from_elsewhere(
    legacy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    loaded = load_model(legacy)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.path.parent == legacy.parent.parent / "data" / "shards"
    step = load_model(legacy / "checkpoints" / "3")  # one step of it: the same lookup
    assert step.tokenizer is not None and step.tokenizer.path == loaded.tokenizer.path


def test_started_from() -> None:
    from lemur.eval.find_tokenizer import started_from

    assert started_from("runs/x", Path("/home/u/proj/runs/x")) == Path("/home/u/proj")
    assert started_from("./runs/x/", Path("/home/u/proj/runs/x")) == Path("/home/u/proj")
    assert started_from("runs/x", Path("/elsewhere/y")) is None
    assert started_from("/abs/runs/x", Path("/abs/runs/x")) is None  # nothing relative
    assert started_from("../x", Path("/a/x")) is None


@pytest.fixture()
def moved(tmp_path: Path, tokenizer_model: Path) -> tuple[Path, Path]:
    """(run, its data directory's new place): the data directory was moved after training."""
    shards = _write_shards(tmp_path / "shards", tokenizer_model, DOCS)
    run = _legacy_run(tmp_path, shards, "run", str(shards))
    return run, shards.rename(tmp_path / "moved")


def test_a_moved_data_directory_is_one_line(
    moved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, now = moved
    gone = str(tmp_path / "shards")
    assert cli.main(["generate", str(run), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # the model's line, then the error
    assert f"data directory {gone} is gone" in err[-1] and "Traceback" not in str(err), err
    # from-run refuses to write a checkpoint without its tokenizer...
    assert convert.main(["from-run", str(run), str(tmp_path / "ckpt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and gone in err[0] and "--tokenizer" in err[0], err
    assert not (tmp_path / "ckpt").exists()
    # ... and takes it given: the moved directory lends its tokenizer.
    argv = ["from-run", str(run), str(tmp_path / "ckpt"), "--tokenizer", str(now)]
    assert convert.main(argv) == 0
    assert model_checkpoint.tokenizer_path(tmp_path / "ckpt") is not None
    assert convert.main(argv) == 2  # an export there already: replaced only with --force
    assert "not empty" in capsys.readouterr().err
    assert convert.main([*argv, "--force"]) == 0


def test_bpb_checks_a_run_without_its_data_directory(
    moved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shards of another tokenizer are refused by the hash the run recorded."""
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig

    run, _ = moved
    texts = [p.read_text() for p in real_python_files(12)]
    other = train_tokenizer(texts, TokenizerTrainConfig(vocab_size=500), tmp_path / "o.model")
    shards = _write_shards(tmp_path / "other", other, DOCS)
    assert cli.main(["bpb", str(run), str(shards), "--seq-len", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "another tokenizer than the run's" in err[-1] and "Traceback" not in str(err), err


def test_tokenizer_given_as_a_directory(
    moved: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run, now = moved
    loaded = load_model(run, tokenizer=now)  # a shard directory lends its own
    assert loaded.tokenizer is not None and loaded.tokenizer.path == now / "tokenizer.model"
    argv = ["generate", str(run), "--prompt", "def f(", "--max-new-tokens", "2"]
    assert cli.main([*argv, "--tokenizer", str(tmp_path / "nope.model")]) == 2
    assert "nope.model: no such tokenizer file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main([*argv, "--tokenizer", str(tmp_path / "empty")]) == 2
    assert "a directory without a tokenizer" in capsys.readouterr().err


def test_a_tokenizer_the_run_did_not_train_with_is_refused(
    moved: tuple[Path, Path], tmp_path: Path
) -> None:
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig

    run, _ = moved
    texts = [p.read_text() for p in real_python_files(12)]
    other = train_tokenizer(texts, TokenizerTrainConfig(vocab_size=500), tmp_path / "o.model")
    with pytest.raises(LoadError, match="not the tokenizer the model was trained with"):
        load_model(run, tokenizer=other)


def test_an_hf_folder_lemur_cannot_read_is_one_line(tmp_path: Path, capsys) -> None:
    """lemur-eval reads an HF folder with `model.init_from`'s reader (pretrained.load_hf):
    a folder it refuses is the same one line in both, naming the folder, never a traceback
    (here: an lm_head that differs from the embedding it claims to be tied to)."""
    folder = write_hf_folder(tmp_path / "hf", hf_tiny_config(), tie_word_embeddings=True)
    why = (
        f"{folder}: tie_word_embeddings is true but lm_head.weight differs from "
        "model.embed_tokens.weight"
    )
    with pytest.raises(LoadError) as caught:
        load_model(folder)
    assert str(caught.value) == why
    with pytest.raises(pretrained.PretrainedError) as train_side:
        pretrained.load_hf(folder)
    assert str(train_side.value) == why
    assert cli.main(["generate", str(folder), "--prompt", "x", "--max-new-tokens", "1"]) == 2
    assert capsys.readouterr().err == f"lemur-eval: {why}\n"

"""lemur-train reading other trainers' corpora (#48 item 6): a `data.dirs` entry naming a
Megatron prefix list or a datatrove `.ds` folder gives the same batches, eval windows and
loss masks as the lemur shards it was exported from."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import base_recipe

from lemur.export.foreign import ForeignData
from lemur.export.run import export
from lemur.model.preset import ConfigError
from lemur.shards.check import ShardDir
from lemur.shards.windows import ShardSource
from lemur.train.config import DataConfig, TrainConfig, config_from_dict
from lemur.train.errors import RunError
from lemur.train.loader import ExpectedTokenizer, make_eval_iterators, make_train_iterator
from lemur.train.setup import DataDirs

SEQ, BATCH, STEPS = 32, 4, 6


@pytest.fixture(scope="module")
def plain(tmp_path_factory, corpus_dir) -> Path:
    """A code + text build (several train shards, a val shard per domain)."""
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("plain")
    text = [corpus_dir / "a.jsonl"]
    build(recipe_from_dict(base_recipe(tmp, corpus_dir / "code", text, shard_tokens=20_000)))
    return tmp / "out"


@pytest.fixture(scope="module")
def chat(tmp_path_factory) -> Path:
    """A chat build: every shard has a loss mask."""
    from test_data_chat_build import chat_corpus, chat_recipe

    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    tmp = tmp_path_factory.mktemp("chat")
    paths, _ = chat_corpus(tmp / "data")
    tok = {"train": {"vocab_size": 800, "sample_bytes": 300_000}}
    build(recipe_from_dict(chat_recipe(tmp, paths, tok, shard_tokens=4096)))
    return tmp / "out"


def entry(out: Path, fmt: str) -> dict:
    """The `data.dirs` mapping of an export: its train folder, each val domain, tokenizer."""
    val = {d.name: [str(d)] for d in sorted((out / "val").iterdir())}
    return {
        "format": fmt,
        "train": [str(out / "train")],
        "val": val,
        "tokenizer": str(out / "tokenizer"),
    }


def batches(directory, vocab: int, sha: str) -> tuple[list[dict], str]:
    """The first train batches (and the stream's fingerprint) of one opened directory."""
    it = make_train_iterator(
        [(directory, 1.0)],
        seq_len=SEQ,
        batch_size=BATCH,
        seed=0,
        process_index=0,
        process_count=1,
        expect=ExpectedTokenizer(vocab, sha),
    )
    return list(itertools.islice(it, STEPS)), it.fingerprint


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) == STEPS
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize(
    ("build", "fmt"), [("plain", "megatron"), ("plain", "nanotron"), ("chat", "nanotron")]
)
def test_first_batches_and_evals_equal_the_lemur_shards(request, tmp_path, build, fmt):
    source = request.getfixturevalue(build)
    out = tmp_path / fmt
    export(source, fmt, out)
    # the entry as a config gives it: parsed, made absolute, saved and read back
    config = DataConfig(dirs=[entry(out, fmt)])
    (spec,) = config.dirs
    assert isinstance(spec, ForeignData) and spec.format == fmt
    dirs = DataDirs()
    theirs, ours = dirs[spec], ShardDir(source)
    tok = ours.tokenizer
    # an SP build's export carries the build's own tokenizer.model: the same sha256
    assert theirs.tokenizer["sha256"] == tok["sha256"]
    assert theirs.tokenizer["vocab_size"] == tok["vocab_size"]
    got, their_print = batches(theirs, tok["vocab_size"], tok["sha256"])
    want, our_print = batches(ours, tok["vocab_size"], tok["sha256"])
    assert_same_batches(got, want)
    assert their_print == our_print  # the same data: a run resumes across them
    # every window of every split and domain: tokens, document boundaries, masks
    boundaries = 0
    for split, domain in [("train", None)] + [("val", d) for d in ours.domains("val")]:
        a = ShardSource(theirs, SEQ, split=split, domain=domain)
        b = ShardSource(ours, SEQ, split=split, domain=domain)
        assert len(a) == len(b)
        for i in range(len(a)):
            x, y = a[i], b[i]
            boundaries += int(y["segment_ids"].max()) - 1
            for key in y:
                np.testing.assert_array_equal(x[key], y[key])
    assert boundaries > 5  # the windows do cross documents
    if build == "chat":  # the .ds.loss masks arrive: some targets do not count
        assert min(int(b["loss_mask"].sum()) for b in got) < BATCH * SEQ
    evals = make_eval_iterators(
        theirs, seq_len=SEQ, batch_size=BATCH, process_index=0, process_count=1
    )
    wanted = make_eval_iterators(
        ours, seq_len=SEQ, batch_size=BATCH, process_index=0, process_count=1
    )
    assert evals.keys() == wanted.keys() and len(evals) >= 1
    for domain in wanted:
        n = len(wanted[domain])
        assert len(evals[domain]) == n
        for x, y in zip(evals[domain], wanted[domain], strict=True):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])


def test_a_megatron_prefix_list_from_elsewhere_is_read(plain, tmp_path):
    """Named prefix by prefix, no export.json: read all the same (the shuffle differs, its
    identity being the files' own), windows equal to the shards'."""
    out = tmp_path / "m"
    export(plain, "megatron", out)
    (out / "export.json").unlink()
    prefixes = sorted(str(p.with_suffix("")) for p in (out / "train").glob("*.idx"))
    spec = DataConfig(
        dirs=[{"format": "megatron", "train": prefixes, "tokenizer": str(out / "tokenizer")}]
    ).dirs[0]
    theirs, ours = DataDirs()[spec], ShardDir(plain)
    assert [s["tokens"] for s in theirs.shards("train")] == [
        s["tokens"] for s in ours.shards("train")
    ]
    a, b = ShardSource(theirs, SEQ), ShardSource(ours, SEQ)
    assert len(a) == len(b)
    for i in range(0, len(a), 5):
        for key, value in a[i].items():
            np.testing.assert_array_equal(value, b[i][key])


def test_config_round_trip_and_one_line_errors(plain, tmp_path):
    raw = {"format": "nanotron", "train": ["x/train"], "tokenizer": "x/tokenizer"}
    config = config_from_dict({"data": {"dirs": [raw, "out/demo"]}})
    assert isinstance(config, TrainConfig)
    again = config_from_dict(yaml.safe_load(config.to_yaml()))
    assert again.data.dirs == config.data.dirs and isinstance(again.data.dirs[0], ForeignData)
    with pytest.raises(
        ConfigError,
        match=r"^config: data.dirs\[0\].format must be one of megatron, nanotron, got 'gpt'$",
    ):
        DataConfig(dirs=[{**raw, "format": "gpt"}])
    with pytest.raises(ConfigError, match=r"^config: data.dirs\[0\]: unknown key 'path'"):
        DataConfig(dirs=[{**raw, "path": "y"}])
    with pytest.raises(ConfigError, match=r"^config: data.dirs\[1\] must be a shard directory"):
        DataConfig(dirs=["a", 3])
    # what cannot be read is the trainer's one-line RunError, naming the file
    with pytest.raises(RunError, match=r"no tokenizer.model or tokenizer.json in it$"):
        DataDirs()[DataConfig(dirs=[{**raw, "tokenizer": str(tmp_path)}]).dirs[0]]
    out = tmp_path / "m"
    export(plain, "megatron", out)
    idx = out / "train" / "00000.idx"
    idx.write_bytes(b"NOTMEGATRON" + idx.read_bytes()[11:])
    spec = {
        "format": "megatron",
        "train": [str(out / "train")],
        "tokenizer": str(out / "tokenizer"),
    }
    with pytest.raises(RunError, match=rf"^{idx}: not a Megatron index \(magic"):
        DataDirs()[DataConfig(dirs=[spec]).dirs[0]]


def test_lemur_eval_finds_the_tokenizer_of_a_run_on_another_trainers_corpus(plain, tmp_path):
    from lemur.eval.find_tokenizer import run_tokenizer

    out = tmp_path / "n"
    export(plain, "nanotron", out)
    config = config_from_dict({"data": {"dirs": [entry(out, "nanotron")]}})
    meta = {"config": yaml.safe_load(config.to_yaml())}  # as a run's checkpoint keeps it
    found = run_tokenizer(meta, None)
    assert found.path == out / "tokenizer" / "tokenizer.model" and found.problem is None


def test_lemur_train_off_megatron_and_ds_exports_matches_the_shards(tmp_path_factory):
    """lemur-train's loop itself: a few steps off the lemur shards, off their Megatron
    export and off their .ds export give the same train losses, step for step."""
    from test_train_loop import build_corpus, compile_cache, tiny_config, train_losses

    from lemur.train.loop import train

    root = tmp_path_factory.mktemp("e2e")
    corpus = build_corpus(root / "corpus")  # in a subprocess: JAX runs in this one
    cache = compile_cache(tmp_path_factory)
    losses = {}
    for name in ("shards", "megatron", "nanotron"):
        run = root / f"run-{name}"
        config = tiny_config(
            corpus, run, "steps=4", "eval.every=0", "eval.at_start=false", cache=cache
        )
        if name != "shards":
            export(corpus, name, root / name)
            data = DataConfig(dirs=[entry(root / name, name)])
            config = dataclasses.replace(config, data=data)
        train(config)
        losses[name] = train_losses(run)
    assert sorted(losses["shards"]) == [1, 2, 3, 4]
    assert losses["megatron"] == losses["shards"] == losses["nanotron"]

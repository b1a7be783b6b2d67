"""Lemur-Chat on the trainer side: masked windows and loss, vocabulary growth on init_from,
training by epochs, the lemur-chat config, and the fine-tuned model exported to HF."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from conftest import real_text_docs
from datatrove.data import Document

from lemur.chatml import CHAT_PIECES, render_chatml
from lemur.data.chat_demo import conversations
from lemur.data.encode.chat import MASK_KEY, TOKENS_KEY, ChatEncoder
from lemur.data.encode.tokenizer import extend_tokenizer, load_llama2_processor, tokenizer_info
from lemur.data.read.chat import MESSAGES_KEY
from lemur.model import checkpoint as model_checkpoint
from lemur.model import llama
from lemur.model.config import config_from_preset
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, dtype_name, token_dtype
from lemur.shards.windows import ShardSource
from lemur.train import step as step_lib
from lemur.train.cli import main as train_main
from lemur.train.config import load_train_config
from lemur.train.errors import RunError
from lemur.train.loader import make_eval_iterators, make_train_iterator
from lemur.train.loop import train
from lemur.train.setup import DataDirs, plan_run

SEQ = 32
Doc = tuple[np.ndarray, np.ndarray | None]


def chat_docs(tokenizer: Path, n: int) -> list[Doc]:
    """`n` demo conversations as the chat build frames them: `<s> ids </s>` and their masks."""
    docs = []
    for row in conversations(seed=0, limit=n):
        text = render_chatml(row["messages"])[0]
        meta = {MESSAGES_KEY: row["messages"]}
        docs.append(Document(text=text, id=str(len(docs)), metadata=meta))
    out = []
    for doc in ChatEncoder(str(tokenizer), seq_len=4096).run(docs):
        ids, mask = doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY]
        out.append((np.concatenate(([1], ids, [2])), np.concatenate(([0], mask, [0]))))
    return out


def text_docs(tokenizer: Path, n: int) -> list[Doc]:
    """`n` ordinary documents (pydoc topics) as `<s> ids </s>`, no mask."""
    sp = load_llama2_processor(tokenizer)
    return [
        (np.asarray(sp.encode(d["text"], add_bos=True, add_eos=True)), None)
        for d in real_text_docs(n)
    ]


def write_dir(root: Path, tokenizer: Path, docs: list[Doc], n_val: int, chat: bool) -> Path:
    """A shard directory of `docs` (the last `n_val` in val, domain "chat"), small shards."""
    info = tokenizer_info(tokenizer, CHAT_PIECES if chat else ())
    dtype = token_dtype(info["vocab_size"])
    root.mkdir(parents=True)
    shutil.copyfile(tokenizer, root / "tokenizer.model")
    shards = []
    for prefix, split, part in (("train", "train", docs[:-n_val]), ("val", "val", docs[-n_val:])):
        writer = ShardWriter(root, prefix, split, "chat", dtype, shard_tokens=3000)
        for tokens, mask in part:
            writer.add(tokens, mask)
        shards += [s.to_json() for s in writer.close()]
    manifest = {
        "format": FORMAT,
        "dtype": dtype_name(dtype),
        "seq_len": 4096,
        "tokenizer": {"file": "tokenizer.model", **info},
        "shards": shards,
        **{k: {} for k in ("mix", "counts", "recipe")},
        "recipe_sha256": "",
    }
    atomic_write_json(root / "manifest.json", manifest)
    return root


@pytest.fixture(scope="module")
def chat_tokenizer(tokenizer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session tokenizer (800 pieces) with the two ChatML markers appended (800, 801)."""
    return extend_tokenizer(
        tokenizer_model, CHAT_PIECES, tmp_path_factory.mktemp("tok") / "chat.model"
    )


@pytest.fixture(scope="module")
def chat_dir(chat_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat shard directory with loss masks."""
    return write_dir(
        tmp_path_factory.mktemp("chat") / "shards",
        chat_tokenizer,
        chat_docs(chat_tokenizer, 60),
        8,
        True,
    )


def unmasked_copy(directory: Path, out: Path) -> Path:
    """The same shards with the masks left out of the manifest."""
    shutil.copytree(directory, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for shard in manifest["shards"]:
        del shard["mask"], shard["mask_sha256"]
    atomic_write_json(out / "manifest.json", manifest)
    return out


def test_window_loss_mask_is_the_targets_mask(chat_dir: Path, tmp_path: Path) -> None:
    plain_dir = unmasked_copy(chat_dir, tmp_path / "plain")
    masked, plain = ShardSource(chat_dir, SEQ), ShardSource(plain_dir, SEQ)
    assert len(masked) == len(plain) > 20 and masked.content_id != plain.content_id
    kept = 0
    for index in range(len(masked)):
        a, b = masked[index], plain[index]
        i, start = masked.locate(index)
        mask = np.fromfile(chat_dir / masked.shards[i]["mask"], np.uint8)
        for key in ("inputs", "targets", "segment_ids", "positions"):
            np.testing.assert_array_equal(a[key], b[key])
        # loss_mask[j] weighs predicting token start + j + 1: that token's mask.
        np.testing.assert_array_equal(
            a["loss_mask"], b["loss_mask"] * mask[start + 1 : start + SEQ + 1]
        )
        kept += int(a["loss_mask"].sum())
    assert 0 < kept < sum(int(plain[i]["loss_mask"].sum()) for i in range(len(plain)))
    # One epoch of the train stream is every window once: the same masked tokens.
    batch = next(
        make_train_iterator(
            str(chat_dir),
            seq_len=SEQ,
            batch_size=len(masked),
            seed=0,
            process_index=0,
            process_count=1,
        )
    )
    assert int(batch["loss_mask"].sum()) == kept
    # Eval streams apply the val shards' masks too.
    (stream,) = make_eval_iterators(
        chat_dir, seq_len=SEQ, batch_size=4, process_index=0, process_count=1
    ).values()
    val = ShardSource(chat_dir, SEQ, split="val")
    assert sum(int(b["loss_mask"].sum()) for b in stream) == sum(
        int(val[i]["loss_mask"].sum()) for i in range(len(val))
    )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis, in float64."""
    x = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_masked_loss_is_the_masked_mean_cross_entropy(chat_dir: Path) -> None:
    source = ShardSource(chat_dir, SEQ)
    batch = {k: np.stack([source[i][k] for i in range(8)]) for k in source[0]}
    model = config_from_preset("tiny", vocab_size=802, init_std=0.1)
    tx = optax.sgd(0.0)
    state = step_lib.init_state(jax.random.key(0), model, tx)
    step = jax.jit(step_lib.make_train_step(model, tx, lambda _: 0.0, document_attention=True))
    _, metrics = step(state, batch)
    logits = np.asarray(
        llama.forward(
            state["params"],
            batch["inputs"],
            model,
            segment_ids=batch["segment_ids"],
            positions=batch["positions"],
        )
    )
    nll = -np.take_along_axis(log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
    mask = batch["loss_mask"]
    assert 0 < mask.sum() < mask.size
    assert int(metrics["tokens"]) == int(mask.sum())
    np.testing.assert_allclose(float(metrics["loss"]), (nll * mask).sum() / mask.sum(), rtol=2e-5)


# --------------------------------------------------------------- init_from, epochs, lemur-chat


TINY = {
    "d_model": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "d_ff": 64,
    "max_seq_len": 64,
    "dtype": "float32",
    "init_std": 0.1,
}


@pytest.fixture(scope="module")
def pretrained(tokenizer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 800-token lemur checkpoint carrying the base tokenizer."""
    config = config_from_preset("tiny", vocab_size=800, **TINY)
    out = tmp_path_factory.mktemp("pretrained") / "ckpt"
    model_checkpoint.save_params(
        out, llama.init_params(config, jax.random.key(5)), config, tokenizer_model
    )
    return out


@pytest.fixture(scope="module")
def ordinary_dirs(
    tokenizer_model: Path, chat_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """The same ordinary tokens (ids < 800, no mask) under the base and the chat tokenizer."""
    root = tmp_path_factory.mktemp("ordinary")
    docs = text_docs(tokenizer_model, 16)
    return write_dir(root / "base", tokenizer_model, docs, 6, False), write_dir(
        root / "chat", chat_tokenizer, docs, 6, True
    )


def chat_config(data: Path, run: Path, *overrides: str):
    """The shipped lemur-chat config, sized for this machine."""
    sets = [
        f"data.dirs=[{data}]",
        f"run_dir={run}",
        "batch.size=8",
        f"batch.seq_len={SEQ}",
        "model.overrides={}",
    ]
    sets += [
        "eval.at_start=true",
        "eval.batches=3",
        "log.progress=false",
        "log.tensorboard=false",
        "log.every=1",
    ]
    return load_train_config("lemur-chat", sets + list(overrides))


@pytest.fixture(scope="module")
def fine_tuned(
    ordinary_dirs: tuple[Path, Path], pretrained: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """lemur-chat from the 800-token checkpoint: one step on the base-tokenizer directory,
    and 2 epochs on the same tokens under the chat tokenizer (grown to 802 ids)."""
    base_dir, chat_vocab_dir = ordinary_dirs
    root = tmp_path_factory.mktemp("fine_tuned")
    records: dict[str, list[dict]] = {"base": [], "grown": []}
    init = f"model.init_from={pretrained}"
    config = chat_config(chat_vocab_dir, root / "grown", init)
    assert (config.epochs, config.steps, config.schedule.warmup_fraction) == (2, None, 0.03)
    with contextlib.redirect_stderr(io.StringIO()) as err:  # the run's log lines
        base = train(
            chat_config(base_dir, root / "base", init, "steps=1", "schedule.warmup_steps=0"),
            records["base"].append,
        )
        grown = train(config, records["grown"].append)
    return {"base": base, "grown": grown, "records": records, "err": err.getvalue(), "root": root}


def test_fine_tune_grows_the_vocabulary_by_epochs(
    fine_tuned: dict, ordinary_dirs: tuple[Path, Path]
) -> None:
    err, records = fine_tuned["err"], fine_tuned["records"]
    assert "vocabulary grown from 800 to 802 ids" in err and "new rows = the mean" in err

    # Steps: ceil(2 epochs x train tokens / (8 x 32)), warmup 3% of them, said in the log.
    tokens = sum(s["tokens"] for s in DataDirs()[str(ordinary_dirs[1])].shards("train"))
    steps = math.ceil(2 * tokens / (8 * SEQ))
    assert fine_tuned["grown"].step == steps and fine_tuned["base"].step == 1
    assert f"2 epoch(s) of {tokens:,} train tokens = {steps:,} steps of 256 tokens" in err
    assert f"warmup {round(0.03 * steps):,} of {steps:,} steps (3.0%)" in err

    # Before any step, the loss on ordinary tokens is the checkpoint's: the new logits only
    # take the mass Jensen allows (each at most the mean probability).
    (before,) = [
        r["eval/chat/loss"] for r in records["base"] if r["step"] == 0 and "eval/chat/loss" in r
    ]
    (after,) = [
        r["eval/chat/loss"] for r in records["grown"] if r["step"] == 0 and "eval/chat/loss" in r
    ]
    assert 0 <= after - before <= math.log1p(2 / 800)
    assert after - before < 1e-3 * before

    # The grown run's checkpoint is a model of 802 ids; its config gives the model in full.
    meta = fine_tuned["root"] / "grown" / "checkpoints" / str(steps) / "meta" / "metadata"
    saved = json.loads(meta.read_text())
    assert saved["vocab_size"] == 802 and saved["config"]["model"]["preset"] is None
    assert saved["config"]["steps"] == steps and saved["config"]["epochs"] is None


def test_fine_tuned_run_exports_to_hf(
    fine_tuned: dict, chat_tokenizer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """from-run -> a lemur checkpoint with the chat tokenizer -> to-hf: HF renders the chat
    build's ids and computes the run's logits."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_model_hf import _forward, _hf_logits
    from test_model_hf_tokenizer import MESSAGES, build_ids, ids_of

    from lemur.convert import cli as convert

    monkeypatch.chdir(fine_tuned["root"])  # a relative run directory, as typed
    assert convert.main(["from-run", "grown", str(tmp_path / "lemur")]) == 0
    params, config = model_checkpoint.load_params(tmp_path / "lemur")
    assert config.vocab_size == 802 and params["embed"].shape == (802, 32)
    tok = model_checkpoint.tokenizer_path(tmp_path / "lemur")
    assert tok is not None and tok.read_bytes() == chat_tokenizer.read_bytes()
    assert (
        convert.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "hf"), "--dtype", "float32"])
        == 0
    )

    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ids = ids_of(hf_tok.apply_chat_template(MESSAGES, tokenize=True))
    assert ids == build_ids(chat_tokenizer, MESSAGES)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = np.asarray([ids[:64]])
    ours = np.asarray(_forward(params, tokens, config))
    assert np.abs(_hf_logits(model, tokens) - ours).max() <= 1e-4


def test_growth_that_is_not_an_extension_is_refused(
    ordinary_dirs: tuple[Path, Path], pretrained: Path, chat_tokenizer: Path, tmp_path: Path
) -> None:
    base_dir, chat_vocab_dir = ordinary_dirs
    big = tmp_path / "big"  # a checkpoint of 802 ids on data of 800
    config = config_from_preset("tiny", vocab_size=802, **TINY)
    model_checkpoint.save_params(big, llama.init_params(config, jax.random.key(0)), config)
    with pytest.raises(
        RunError, match="has vocab_size 802, the model 800: a smaller vocabulary cannot hold"
    ):
        plan_run(chat_config(base_dir, tmp_path / "r1", f"model.init_from={big}"), DataDirs())
    # 802 ids that the manifest does not list as appended pieces: not an extension.
    manifest = json.loads((chat_vocab_dir / "manifest.json").read_text())
    del manifest["tokenizer"]["added_pieces"]
    other = shutil.copytree(chat_vocab_dir, tmp_path / "other")
    atomic_write_json(other / "manifest.json", manifest)
    with pytest.raises(
        RunError, match=r"ids 800\.\.801 are not all pieces that the tokenizer of .* appends"
    ):
        plan_run(chat_config(other, tmp_path / "r2", f"model.init_from={pretrained}"), DataDirs())


def test_lemur_chat_config_is_the_paper_recipe_and_needs_init_from(
    chat_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = load_train_config("lemur-chat")
    assert (c.epochs, c.steps, c.model.preset, c.model.init_from) == (2, None, None, None)
    assert (c.batch.size, c.batch.seq_len) == (128, 4096) and c.data.document_attention
    assert (c.optimizer.b1, c.optimizer.b2, c.schedule.peak_lr, c.schedule.decay) == (
        0.9,
        0.95,
        2e-5,
        "cosine",
    )
    assert (
        load_train_config("lemur-chat", ["steps=40"]).epochs is None
    )  # --set steps replaces epochs
    assert train_main(["lemur-chat", "--set", f"data.dirs=[{chat_dir}]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and "model.init_from: required" in err[0]
        and "fine-tuning needs a pre-trained model" in err[0]
    )


def test_init_from_trained_with_another_tokenizer_is_refused(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#23.6: a checkpoint carrying one 800-piece tokenizer, shards of another 800-piece one
    (the same vocab size, so no shape check notices): refused, one line naming both."""
    from lemur.data.encode.tokenizer import train_tokenizer
    from lemur.data.recipe.tokenizer import TokenizerTrainConfig

    texts = [d["text"] for d in real_text_docs(60)][20:]  # other text: other merges
    other = train_tokenizer(texts, TokenizerTrainConfig(vocab_size=800), tmp_path / "other.model")
    assert load_llama2_processor(other).vocab_size() == 800
    data = write_dir(tmp_path / "data", other, text_docs(other, 8), 2, False)
    argv = ["lemur-chat", "--set", f"data.dirs=[{data}]", "--set", f"model.init_from={pretrained}"]
    sizes = ["--set", f"batch.seq_len={SEQ}", "--set", "batch.size=8"]
    assert train_main([*argv, *sizes, "--set", f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"the shards in {data} were built with {data / 'tokenizer.model'}" in err[0]
    assert f"neither the model's tokenizer {pretrained / 'tokenizer.model'} nor it" in err[0]


def test_an_unreadable_tokenizer_of_init_from_is_the_tokenizer_packages_one_line(
    tokenizer_model: Path, tmp_path: Path
) -> None:
    """#35: the model file is parsed by lemur.tokenizer.sentencepiece, so the trainer's refusal
    of a damaged one reads as every other command's (`PATH: not a SentencePiece model (...)`)."""
    from types import SimpleNamespace

    from lemur.train.setup import check_tokenizer

    folder = tmp_path / "pretrained"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(b"\x0a\xff not a model")
    data = SimpleNamespace(tokenizer_path=tokenizer_model, tokenizer={})
    with pytest.raises(RunError) as e:
        check_tokenizer(str(folder), data)  # type: ignore[arg-type]
    assert str(e.value).startswith(f"{folder / 'tokenizer.model'}: not a SentencePiece model (")

"""`model.init_from` an HF model folder (Llama with its SentencePiece model, Qwen2 with a
tokenizer.json): converted on load, trained, exported back with its tokenizer files
unchanged; shards of another tokenizer are refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download: every model here is random

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from conftest import real_text_docs  # noqa: E402

from lemur.convert import cli as convert  # noqa: E402
from lemur.data.encode.tokenizer import load_llama2_processor, tokenizer_info  # noqa: E402
from lemur.shards.format import (  # noqa: E402
    FORMAT,
    ShardWriter,
    atomic_write_json,
    dtype_name,
    token_dtype,
)
from lemur.train.config import load_train_config  # noqa: E402
from lemur.train.errors import RunError  # noqa: E402
from lemur.train.loader import make_train_iterator  # noqa: E402
from lemur.train.loop import train  # noqa: E402
from lemur.train.setup import DataDirs, plan_run  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SEQ, BATCH = 32, 4
HF_SIZES = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
)


def write_shards(root: Path, tokenizer: Path, info: dict, docs: list[np.ndarray]) -> Path:
    """A shard directory (train split only) of `docs`, its manifest naming `tokenizer`."""
    root.mkdir(parents=True)
    shutil.copyfile(tokenizer, root / tokenizer.name)
    writer = ShardWriter(root, "train", "train", "text", token_dtype(info["vocab_size"]), 2000)
    for doc in docs:
        writer.add(doc)
    manifest = {
        "format": FORMAT,
        "dtype": dtype_name(token_dtype(info["vocab_size"])),
        "seq_len": 4096,
        "tokenizer": {"file": tokenizer.name, **info},
        "shards": [s.to_json() for s in writer.close()],
        **{k: {} for k in ("mix", "counts", "recipe")},
        "recipe_sha256": "",
    }
    atomic_write_json(root / "manifest.json", manifest)
    return root


def word_tokenizer(path: Path, vocab: int) -> Path:
    """A real `tokenizers` tokenizer.json of `vocab` word-level ids."""
    words = {"<|endoftext|>": 0, "[UNK]": 1} | {f"w{i}": i for i in range(2, vocab)}
    model = tokenizers.models.WordLevel(words, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def _randomised(model):
    """Norms around 1 and q/k/v biases around 0, random, so a lost tensor would show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.copy_(float("norm" in name) + 0.3 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def llama_case(tokenizer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A random LlamaForCausalLM folder carrying the session SentencePiece model (800 ids)
    and shards of real text built with that same model."""
    root = tmp_path_factory.mktemp("llama_case")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=800, **HF_SIZES, tie_word_embeddings=False)
    model = _randomised(transformers.LlamaForCausalLM(config))
    folder = root / "hf"
    model.save_pretrained(folder)
    shutil.copyfile(tokenizer_model, folder / "tokenizer.model")
    sp = load_llama2_processor(tokenizer_model)
    docs = [
        np.asarray(sp.encode(d["text"], add_bos=True, add_eos=True)) for d in real_text_docs(12)
    ]
    data = write_shards(root / "data", tokenizer_model, tokenizer_info(tokenizer_model), docs)
    return {"model": model, "folder": folder, "data": data}


@pytest.fixture(scope="module")
def qwen2_case(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A random tied Qwen2ForCausalLM folder of 128 embedding rows whose tokenizer.json has
    100 ids (padded, as Qwen2.5's), and shards of random ids built with that tokenizer."""
    root = tmp_path_factory.mktemp("qwen2_case")
    torch.manual_seed(1)
    config = transformers.Qwen2Config(vocab_size=128, **HF_SIZES, tie_word_embeddings=True)
    model = _randomised(transformers.Qwen2ForCausalLM(config))
    folder = root / "hf"
    model.save_pretrained(folder)
    tok = word_tokenizer(folder / "tokenizer.json", 100)
    chat = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat}))
    sha = hashlib.sha256(tok.read_bytes()).hexdigest()
    info = {"sha256": sha, "vocab_size": 100, "bos_id": None, "eos_id": 0}
    rng = np.random.default_rng(0)
    docs = [np.append(rng.integers(1, 100, n), 0) for n in rng.integers(20, 200, 30)]
    data = write_shards(root / "data", tok, info, docs)
    return {"model": model, "folder": folder, "data": data}


def run_config(data: Path, run: Path, folder: Path, *overrides: str):
    """Two steps from `folder` with the model it holds (preset null), fp32, every step logged."""
    sets = [
        f"run_dir={run}",
        f"data.dirs=[{data}]",
        f"model.init_from={folder}",
        "model.preset=null",
        "model.overrides={dtype: float32}",
        "steps=2",
        f"batch.size={BATCH}",
        f"batch.seq_len={SEQ}",
        "schedule.warmup_steps=0",
        "schedule.peak_lr=1.0e-3",
        "checkpoint.every=0",
        "log.every=1",
        "log.progress=false",
        "log.tensorboard=false",
        *overrides,
    ]
    return load_train_config(None, sets)


def first_batch_loss(model, data: Path, seed: int) -> float:
    """transformers' mean loss on the trainer's first batch (the same stream, same seed)."""
    batch = next(
        make_train_iterator(
            [(str(data), 1.0)],
            seq_len=SEQ,
            batch_size=BATCH,
            seed=seed,
            process_index=0,
            process_count=1,
        )
    )
    with torch.no_grad():
        logits = model(torch.from_numpy(np.asarray(batch["inputs"], np.int64))).logits
    logp = torch.log_softmax(logits.double(), -1)
    targets = torch.from_numpy(np.asarray(batch["targets"], np.int64))
    nll = -logp.gather(-1, targets[..., None])[..., 0].numpy()
    mask = np.asarray(batch["loss_mask"], np.float64)
    return float((nll * mask).sum() / mask.sum())


@pytest.mark.parametrize("case", ["llama_case", "qwen2_case"])
def test_init_from_hf_folder_trains_and_exports_its_tokenizer(
    case: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    c = request.getfixturevalue(case)
    records: list[dict] = []
    config = run_config(c["data"], tmp_path / "run", c["folder"])
    summary = train(config, records.append)
    assert summary.step == 2
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    # Step 1's loss is the HF model's own on that batch: its weights were loaded, not random.
    reference = first_batch_loss(c["model"], c["data"], config.data_seed)
    assert abs(losses[1] - reference) <= 1e-4 * reference, (losses, reference)
    assert np.isfinite(losses[2]) and losses[2] != losses[1]

    # Export: from-run, then to-hf, gives the same family with the folder's tokenizer files.
    assert convert.main(["from-run", str(tmp_path / "run"), str(tmp_path / "lemur")]) == 0
    assert convert.main(["to-hf", str(tmp_path / "lemur"), str(tmp_path / "out")]) == 0
    carried = [
        n
        for n in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
        if (c["folder"] / n).is_file()
    ]
    assert carried
    for name in carried:
        assert (tmp_path / "out" / name).read_bytes() == (c["folder"] / name).read_bytes(), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert type(reloaded) is type(c["model"])
    assert reloaded.config.vocab_size == c["model"].config.vocab_size  # padded rows kept


def test_shards_of_another_tokenizer_json_are_refused(qwen2_case: dict, tmp_path: Path) -> None:
    other = word_tokenizer(tmp_path / "tokenizer.json", 101)
    info = {
        "sha256": hashlib.sha256(other.read_bytes()).hexdigest(),
        "vocab_size": 101,
        "bos_id": None,
        "eos_id": 0,
    }
    data = write_shards(tmp_path / "data", other, info, [np.arange(1, 90)] * 4)
    config = run_config(data, tmp_path / "run", qwen2_case["folder"])
    with pytest.raises(RunError) as e:
        plan_run(config, DataDirs())
    message = str(e.value)
    assert f"the shards in {data} were built with {data / 'tokenizer.json'}" in message
    assert f"not with the model's tokenizer {qwen2_case['folder'] / 'tokenizer.json'}" in message
    assert "\n" not in message


def test_init_from_a_folder_that_is_no_model(tmp_path: Path, llama_case: dict) -> None:
    config = run_config(llama_case["data"], tmp_path / "run", tmp_path)
    with pytest.raises(RunError, match="neither a lemur checkpoint .* nor a Hugging Face model"):
        plan_run(config, DataDirs())


@pytest.mark.parametrize("how", ["truncated", "missing"])
def test_init_from_a_damaged_folder_is_one_line_and_leaves_no_run_dir(
    tmp_path: Path, llama_case: dict, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_model_convert_source import corrupt

    from lemur.train import cli

    folder = tmp_path / "hf"
    shutil.copytree(llama_case["folder"], folder)
    message = corrupt(folder, how)
    run = tmp_path / "run"
    sets = [f"run_dir={run}", f"data.dirs=[{llama_case['data']}]", f"model.init_from={folder}"]
    argv = ["continue", *(a for s in sets for a in ("--set", s))]
    assert cli.main([*argv, "--set", "batch.seq_len=32", "--set", "batch.size=4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lemur-train: model.init_from: {message}"), err
    assert err.count("\n") == 1
    assert not run.exists()


def test_dry_run_shows_the_model_the_run_trains(qwen2_case: dict, tmp_path: Path) -> None:
    # The folder has 128 embedding rows (Qwen's padding), the data's tokenizer 100 ids: the
    # run keeps the 128 rows, and the dry run must say so (not 100 and fewer parameters).
    from lemur.model.config import param_count
    from lemur.train.cli import dry_run_summary

    config = run_config(qwen2_case["data"], tmp_path / "run", qwen2_case["folder"])
    model = plan_run(config, DataDirs()).model
    assert model.vocab_size == 128
    summary = dry_run_summary(config)
    assert f"# vocab_size 128 from model.init_from {qwen2_case['folder']}" in summary
    assert f"# parameters: {param_count(model):,}\n" in summary


def test_continue_defaults_too_long_or_too_big_name_the_keys_to_lower(
    qwen2_case: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lemur import machine
    from lemur.train.config import ConfigError

    folder = qwen2_case["folder"]
    config = run_config(qwen2_case["data"], tmp_path / "run", folder, "batch.seq_len=4096")
    with pytest.raises(ConfigError) as e:  # the folder's max_position_embeddings is 128
        plan_run(config, DataDirs())
    assert str(e.value) == (
        "config: batch.seq_len (4096) exceeds the model's max_seq_len (128 of model.init_from "
        f"{folder}): lower it, e.g. --set batch.seq_len=128"
    )
    # The step by plan_estimate's formula: 64 x 32 tokens of activations (14.0 MiB) and the
    # state (0.3 MiB), on a "host" of 8 MiB: refused before anything starts, with the keys
    # and a value that fits (the fewest microbatches whose step takes half the host).
    monkeypatch.setattr(machine, "host_memory_bytes", lambda: 8 * 2**20)
    config = run_config(qwen2_case["data"], tmp_path / "run", folder, "batch.size=64")
    with pytest.raises(RunError) as e:
        plan_run(config, DataDirs())
    assert str(e.value) == (
        "batch: the train step needs about 14.3 MiB (0.3 MiB of parameters and optimizer "
        "state, 14.0 MiB of activations for 64 x 32 tokens), more than this host's 8.0 MiB: "
        "raise batch.microbatches (e.g. --set batch.microbatches=4) or lower batch.size or "
        "batch.seq_len"
    )
    sets = ("batch.size=64", "batch.microbatches=4")  # as the error suggests: it fits
    assert plan_run(run_config(qwen2_case["data"], tmp_path / "run", folder, *sets), DataDirs())

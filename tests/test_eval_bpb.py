"""lemur.eval.bpb: per-token byte counts match decode, and bits per byte match a hand
computation on a tiny model and shard directory."""

from __future__ import annotations

import functools
import hashlib
import io
import math
from pathlib import Path

import jax
import numpy as np
import pytest
import sentencepiece as spm
from conftest import real_python_files, real_text_docs

from lemur.eval import bpb
from lemur.model import llama
from lemur.model.config import LlamaConfig, Params
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, dtype_name, token_dtype
from lemur.tokenizer import SentencePieceTokenizer

SEQ = 32
UNICODE = "Ünïcödé: 漢字かな, emoji 🦎🐍, math ∑∫, tabs\tand  double  spaces \n trailing "
FRENCH = (
    "Le renard brun saute par-dessus le chien paresseux. Les enfants jouent dans le "
    "jardin pendant que leurs parents préparent le déjeuner sous le grand chêne."
)


def _texts() -> list[str]:
    code = [p.read_text() for p in real_python_files(6)]
    return code + [d["text"] for d in real_text_docs(6)] + [UNICODE, " leading space", FRENCH]


@pytest.fixture(scope="module")
def dummy_prefix_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama-2-like SentencePiece model: dummy prefix, byte fallback, identity normalizer."""
    model = io.BytesIO()
    lines = [line for t in _texts()[:8] for line in t.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=600,
        add_dummy_prefix=True,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    path = tmp_path_factory.mktemp("spm") / "dummy.model"
    path.write_bytes(model.getvalue())
    return path


@pytest.mark.parametrize("which", ["lemur", "dummy_prefix"])
def test_token_bytes_sum_to_decoded_bytes(
    which: str, tokenizer_model: Path, dummy_prefix_model: Path
) -> None:
    path = tokenizer_model if which == "lemur" else dummy_prefix_model
    sp = spm.SentencePieceProcessor(model_file=str(path))
    table = bpb.TokenBytes(SentencePieceTokenizer(path))
    assert table.strips_first_space == (which == "dummy_prefix")
    assert table.table[sp.bos_id()] == table.table[sp.eos_id()] == 0
    assert table.table[sp.piece_to_id("<0xE6>")] == 1
    used_bytes = False
    for text in _texts():
        ids = sp.encode(text)
        used_bytes |= any(sp.is_byte(i) for i in ids)
        want = len(sp.decode(ids).encode())
        assert table.document_bytes(np.array([sp.bos_id(), *ids, sp.eos_id()])) == want
        assert table.document_bytes(np.array(ids)) == want
    assert used_bytes  # the byte-fallback pieces were exercised


def _write_shards(root: Path, tokenizer: Path, docs: dict[str, list[str]]) -> Path:
    """A shard directory with one val shard per domain (and a small train shard)."""
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    vocab, dtype = sp.vocab_size(), token_dtype(sp.vocab_size())
    root.mkdir(parents=True)
    (root / "tokenizer.model").write_bytes(tokenizer.read_bytes())
    shards = []
    for split, domain, texts in [("train", "mixed", docs["code"])] + [
        ("val", d, t) for d, t in docs.items()
    ]:
        w = ShardWriter(root, f"{split}/{domain}", split, domain, dtype, shard_tokens=10**9)
        for text in texts:
            w.add(np.array([1, *sp.encode(text), 2]))
        shards += w.close()
    atomic_write_json(
        root / "manifest.json",
        {
            "format": FORMAT,
            "dtype": dtype_name(dtype),
            "seq_len": SEQ,
            "tokenizer": {
                "file": "tokenizer.model",
                "vocab_size": vocab,
                "bos_id": 1,
                "eos_id": 2,
                "sha256": hashlib.sha256(tokenizer.read_bytes()).hexdigest(),
            },
            "shards": [s.to_json() for s in shards],
            "mix": {},
            "counts": {},
            "recipe": {},
            "recipe_sha256": "",
        },
    )
    return root


@functools.cache
def _model(vocab: int) -> tuple[LlamaConfig, Params]:
    config = LlamaConfig(
        vocab_size=vocab,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=64,
        dtype="float32",
        init_std=0.2,
        max_seq_len=256,
    )
    return config, jax.jit(llama.init_params, static_argnums=0)(
        config, jax.random.key(0, impl="rbg")
    )


_forward = jax.jit(llama.forward, static_argnames="config")


def _nll(params: Params, config: LlamaConfig, ids: np.ndarray) -> np.ndarray:
    """NLL of ids[1:] given the prefix, by the plain forward and a numpy log-softmax.

    Right-padded to SEQ inputs (a causal model's real positions do not see the padding),
    so every call reuses one compiled forward.
    """
    n = len(ids) - 1
    inputs = np.zeros((1, SEQ), np.int32)
    inputs[0, :n] = ids[:-1]
    logits = np.asarray(_forward(params, inputs, config=config), np.float64)[0, :n]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return logz - logits[np.arange(n), ids[1:]]


def _hand(
    params: Params,
    config: LlamaConfig,
    sp: spm.SentencePieceProcessor,
    texts: list[str],
    document_attention: bool,
) -> tuple[float, int, int]:
    """(summed NLL, scored targets, bytes) of the val stream cut into SEQ windows, by hand.

    Windows start at k * SEQ; the target after each input is scored unless it is the next
    document's <s>. With document attention a target sees only its own document's tokens
    inside the window; bytes are those of the decoded covered text of each document.
    """
    stream = np.concatenate([[1, *sp.encode(t), 2] for t in texts])
    ends = np.cumsum([len(sp.encode(t)) + 2 for t in texts])
    windows = (len(stream) - 1) // SEQ
    nll, count = 0.0, 0
    for k in range(windows):
        w = stream[k * SEQ : k * SEQ + SEQ + 1]
        doc = np.searchsorted(ends, k * SEQ + np.arange(SEQ + 1), side="right")
        pieces = (
            [np.flatnonzero(doc == d) for d in np.unique(doc)]
            if document_attention
            else [np.arange(SEQ + 1)]
        )
        for idx in pieces:
            idx = idx if idx[-1] == SEQ or not document_attention else np.append(idx, idx[-1] + 1)
            losses = _nll(params, config, w[idx]) if len(idx) > 1 else np.zeros(0)
            keep = w[idx][1:] != 1  # a <s> target (the next document) is not scored
            nll, count = nll + losses[keep].sum(), count + int(keep.sum())
    covered = windows * SEQ + 1
    starts = np.concatenate(([0], ends[:-1]))
    n_bytes = sum(
        len(sp.decode(stream[s : min(e, covered)].tolist()).encode())
        for s, e in zip(starts, ends, strict=True)
        if s < covered
    )
    return nll, count, n_bytes


@pytest.mark.parametrize("document_attention", [True, False], ids=["documents", "packed"])
def test_bpb_equals_hand_computation(
    tmp_path: Path, dummy_prefix_model: Path, document_attention: bool
) -> None:
    docs = {
        "code": [p.read_text()[:300] for p in real_python_files(3)],
        "text": [UNICODE, FRENCH, real_text_docs(1)[0]["text"][:200]],
    }
    root = _write_shards(tmp_path / "shards", dummy_prefix_model, docs)
    sp = spm.SentencePieceProcessor(model_file=str(dummy_prefix_model))
    config, params = _model(sp.vocab_size())
    settings = bpb.BpbSettings(
        seq_len=SEQ, batch_size=3, document_attention=document_attention, languages=False
    )
    result = bpb.score_directory(params, config, root, settings)
    for domain, texts in docs.items():
        nll, count, n_bytes = _hand(params, config, sp, texts, document_attention)
        got = result["domains"][domain]
        assert (got["tokens"], got["bytes"]) == (count, n_bytes)
        assert got["nll_nats"] == pytest.approx(nll, rel=1e-5)
        assert got["bits_per_byte"] == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-5)
        assert got["nats_per_token"] == pytest.approx(nll / count, rel=1e-5)


def test_languages_partition_the_domain(tmp_path: Path, tokenizer_model: Path) -> None:
    english = [d["text"] for d in real_text_docs(2)]
    docs = {
        "code": [p.read_text()[:2000] for p in real_python_files(2)],
        "text": [english[0], FRENCH * 3, english[1]],
    }
    root = _write_shards(tmp_path / "shards", tokenizer_model, docs)
    config, params = _model(
        spm.SentencePieceProcessor(model_file=str(tokenizer_model)).vocab_size()
    )
    result = bpb.score_directory(params, config, root, bpb.BpbSettings(seq_len=SEQ, batch_size=4))
    text, code = result["domains"]["text"], result["domains"]["code"]
    assert set(text["languages"]) == {"en", "fr"} and set(code["languages"]) == {"Python"}
    for domain in (text, code):
        for key in ("tokens", "bytes"):
            assert sum(v[key] for v in domain["languages"].values()) == domain[key]
        assert sum(v["nll_nats"] for v in domain["languages"].values()) == pytest.approx(
            domain["nll_nats"]
        )


def test_batch_bytes_is_what_the_trainer_counts(tmp_path: Path, tokenizer_model: Path) -> None:
    """TokenBytes.batch_bytes on loader batches gives the scorer's byte count."""
    from lemur.train.loader import make_eval_iterators

    docs = {"code": [p.read_text()[:500] for p in real_python_files(3)], "text": [UNICODE]}
    root = _write_shards(tmp_path / "shards", tokenizer_model, docs)
    table = bpb.TokenBytes.for_shards(root)
    config, params = _model(
        spm.SentencePieceProcessor(model_file=str(tokenizer_model)).vocab_size()
    )
    settings = bpb.BpbSettings(seq_len=SEQ, batch_size=4, document_attention=False, languages=False)
    result = bpb.score_directory(params, config, root, settings)
    streams = make_eval_iterators(root, seq_len=SEQ, batch_size=4, process_index=0, process_count=1)
    for domain, stream in streams.items():
        assert sum(table.batch_bytes(b) for b in stream) == result["domains"][domain]["bytes"]
    assert bpb.bits_per_byte(math.log(2) * 10, 5) == pytest.approx(2.0)

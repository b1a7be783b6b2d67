"""Lemur-Chat builds: ChatML markers in the tokenizer, loss masks from tokens to shards, verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from conftest import real_python_files, real_text_docs
from datatrove.data import Document

from lemur.data.read.chat import IM_END, IM_START, render_chatml
from lemur.data.recipe import TokenizerTrainConfig
from lemur.data.tokenize.chat import (
    BAD_SPANS,
    CHAT_PIECES,
    MASK_KEY,
    NO_LOSS,
    TOKENS_KEY,
    TOO_LONG,
    ChatEncoder,
    loss_mask,
)
from lemur.data.tokenize.tokenizer import (
    TokenizerError,
    extend_tokenizer,
    load_tokenizer,
    tokenizer_info,
    train_tokenizer,
)
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, open_mask, token_dtype
from lemur.shards.verify import verify


def conversations(n: int) -> list[list[dict[str, str]]]:
    """`n` real conversations: pydoc help topics as answers, some with a system turn, some
    with two exchanges, some with non-ASCII text that falls back to bytes."""
    docs = real_text_docs(2 * n)
    out = []
    for i in range(n):
        a, b = docs[2 * i], docs[2 * i + 1]
        msgs = (
            [{"role": "system", "content": "You answer questions about Python."}]
            if i % 3 == 0
            else []
        )
        msgs += [
            {"role": "user", "content": f"What does the help topic {a['id']} say?"},
            {"role": "assistant", "content": a["text"][:1500]},
        ]
        if i % 2:
            msgs += [
                {"role": "user", "content": f"And {b['id']}? Réponds en détail — 日本語 🙂"},
                {"role": "assistant", "content": "Voilà: ❄ " + b["text"][:800] + " ✓"},
            ]
        out.append(msgs)
    return out


def chat_doc(messages: list[dict[str, str]], i: int, source: str = "chat") -> Document:
    """A chat document as the chat reader makes it (the contract the tokenizer relies on)."""
    text, spans, ends = render_chatml(messages)
    meta = {"source": source, "source_index": 0, "domain": "chat", "language": "en"}
    return Document(
        text=text, id=f"{source}/{i}", metadata={**meta, "loss_spans": spans, "turn_ends": ends}
    )


def surface_bytes(sp: spm.SentencePieceProcessor, i: int) -> bytes:
    """The bytes a token stands for, read off its piece (independent of any offset API)."""
    piece = sp.id_to_piece(i)
    if sp.is_byte(i):
        return bytes([int(piece[3:5], 16)])
    if sp.is_control(i):
        return b""
    return piece.replace("\u2581", " ").encode()


def expected_mask(sp, ids, text: str, spans) -> np.ndarray:
    """1 where a token's bytes lie inside a loss span, from the pieces' own byte lengths."""
    inside = np.zeros(len(text.encode()) + 1, bool)
    for s, e in spans:
        inside[len(text[:s].encode()) : len(text[:e].encode())] = True
    out, at = [], 0
    for i in ids:
        n = len(surface_bytes(sp, i))
        out.append(int(n > 0 and inside[at : at + n].all()))
        at += n
    return np.array(out, np.uint8)


def masked_text(sp, ids, mask) -> str:
    """The text of the tokens whose mask is 1, in order, decoded from their pieces."""
    ids = np.asarray(ids).tolist()
    return b"".join(surface_bytes(sp, i) for i, m in zip(ids, mask, strict=True) if m).decode()


def assistant_targets(messages) -> str:
    return "".join(m["content"] + IM_END for m in messages if m["role"] == "assistant")


@pytest.fixture(scope="module")
def extended_model(tokenizer_model, tmp_path_factory) -> Path:
    """The session tokenizer (trained without the markers) with the markers appended."""
    return extend_tokenizer(
        tokenizer_model, CHAT_PIECES, tmp_path_factory.mktemp("ext") / "t.model"
    )


@pytest.fixture(scope="module")
def chat_trained_model(tmp_path_factory) -> Path:
    """A tokenizer trained on rendered conversations with the markers as user-defined pieces."""
    texts = [render_chatml(m)[0] for m in conversations(30)]
    out = tmp_path_factory.mktemp("chattok") / "t.model"
    return train_tokenizer(texts, TokenizerTrainConfig(vocab_size=700), out, CHAT_PIECES)


# --- tokenizer -------------------------------------------------------------------------


def test_extending_keeps_every_id_and_adds_single_id_markers(tokenizer_model, extended_model):
    old, new = load_tokenizer(tokenizer_model), load_tokenizer(extended_model)
    n = old.vocab_size()
    assert new.vocab_size() == n + 2
    assert [new.piece_to_id(p) for p in CHAT_PIECES] == [n, n + 1]
    assert [new.id_to_piece(i) for i in range(n)] == [old.id_to_piece(i) for i in range(n)]
    for path in real_python_files(12):  # real text without markers: the very same ids
        source = path.read_text()
        assert new.encode(source) == old.encode(source)
    text = f"{IM_START}user\nhi{IM_END}\n{IM_START}assistant\nx = 1{IM_END}\n"
    ids = new.encode(text)
    assert ids.count(n) == 2 and ids.count(n + 1) == 2 and new.decode(ids) == text
    assert old.encode(IM_START) != [n] and len(old.encode(IM_START)) > 1
    info = tokenizer_info(extended_model, CHAT_PIECES)
    assert info["added_pieces"] == [{"piece": IM_START, "id": n}, {"piece": IM_END, "id": n + 1}]
    with pytest.raises(TokenizerError, match="not a user-defined piece"):
        tokenizer_info(tokenizer_model, CHAT_PIECES)


def test_extending_twice_changes_nothing(extended_model, tmp_path):
    again = extend_tokenizer(extended_model, CHAT_PIECES, tmp_path / "again.model")
    assert again.read_bytes() == extended_model.read_bytes()


def test_trained_tokenizer_has_markers_as_single_ids(chat_trained_model):
    sp = load_tokenizer(chat_trained_model)
    ids = [sp.piece_to_id(p) for p in CHAT_PIECES]
    assert all(sp.id_to_piece(i) == p for i, p in zip(ids, CHAT_PIECES, strict=True))
    text, _, _ = render_chatml(conversations(2)[1])
    enc = sp.encode(text)
    assert enc.count(ids[0]) == 4 and enc.count(ids[1]) == 4 and sp.decode(enc) == text
    assert [d["id"] for d in tokenizer_info(chat_trained_model, CHAT_PIECES)["added_pieces"]] == ids


# --- masks from one encoding --------------------------------------------------------------


def encode_docs(model: Path, docs: list[Document], seq_len: int = 100_000, long: str = "truncate"):
    step = ChatEncoder(str(model), seq_len, long, batch_docs=7)
    kept = list(step.run(iter(docs)))
    return kept, {k: v.total for k, v in step.stats.stats.items() if ":" in k}


@pytest.mark.parametrize("model", ["extended_model", "chat_trained_model"])
def test_mask_is_exactly_the_assistant_replies(model, request):
    path = request.getfixturevalue(model)
    sp = load_tokenizer(path)
    convs = conversations(24)
    kept, counts = encode_docs(path, [chat_doc(m, i) for i, m in enumerate(convs)])
    assert len(kept) == len(convs) and counts == {}
    for doc, messages in zip(kept, convs, strict=True):
        ids, mask = doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY]
        assert ids.tolist() == sp.encode(doc.text)  # the tokens of one plain encoding
        np.testing.assert_array_equal(
            mask, expected_mask(sp, ids, doc.text, doc.metadata["loss_spans"])
        )
        assert masked_text(sp, ids, mask) == assistant_targets(messages)


def test_surface_less_tokens_belong_to_the_character_after_them():
    # Three byte-fallback tokens of one character: offsets (5,5) (5,5) (5,6).
    offsets = np.array([[0, 5], [5, 5], [5, 5], [5, 6], [6, 8], [8, 8]])
    assert loss_mask(offsets, 8, [[5, 8]]).tolist() == [0, 1, 1, 1, 1, 0]
    assert loss_mask(offsets, 8, [[6, 8]]).tolist() == [0, 0, 0, 0, 1, 0]
    assert loss_mask(offsets, 8, [[0, 4]]).tolist() == [0, 0, 0, 0, 0, 0]  # straddles: 0


def long_conversation() -> list[dict[str, str]]:
    docs = real_text_docs(8)
    msgs = [{"role": "system", "content": "Be brief."}]
    for d in docs[:4]:
        msgs += [
            {"role": "user", "content": f"Explain {d['id']}."},
            {"role": "assistant", "content": d["text"][:600]},
        ]
    return msgs


def test_long_conversation_truncated_at_a_turn_boundary(chat_trained_model):
    sp = load_tokenizer(chat_trained_model)
    msgs = long_conversation()
    full = chat_doc(msgs, 0)
    n_full = len(sp.encode(full.text))
    # Room for exactly the first two exchanges (plus <s> and </s>).
    two = render_chatml(msgs[:5])[0]
    seq_len = len(sp.encode(two)) + 2 + 5
    assert n_full + 2 > seq_len
    kept, counts = encode_docs(chat_trained_model, [full], seq_len)
    assert counts == {"truncated:chat": 1}
    (doc,) = kept
    assert doc.text == two and doc.text.endswith(f"{IM_END}\n")
    assert len(doc.metadata[TOKENS_KEY]) + 2 <= seq_len
    assert doc.metadata[TOKENS_KEY].tolist() == sp.encode(two)
    masked = masked_text(sp, doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY])
    assert masked == assistant_targets(msgs[:5])


def test_too_long_dropped_with_reasons(chat_trained_model):
    sp = load_tokenizer(chat_trained_model)
    msgs = long_conversation()
    first = len(sp.encode(render_chatml(msgs[:3])[0])) + 2
    docs = [chat_doc(msgs, 0), chat_doc(msgs, 1)]
    # Not even the first exchange fits: dropped under truncate too.
    kept, counts = encode_docs(chat_trained_model, docs, first - 1)
    assert kept == [] and counts == {f"dropped:chat:{TOO_LONG}": 2}
    # `drop` drops whatever is over seq_len, even when a cut would fit.
    kept, counts = encode_docs(chat_trained_model, docs[:1], first + 50, long="drop")
    assert kept == [] and counts == {f"dropped:chat:{TOO_LONG}": 1}


def test_bad_spans_and_nothing_to_learn_are_dropped(chat_trained_model):
    good = chat_doc(conversations(1)[0], 0)
    bad = chat_doc(conversations(1)[0], 1)
    bad.metadata["loss_spans"] = [[0, len(bad.text) + 5]]
    empty = chat_doc(conversations(1)[0], 2)
    empty.metadata["loss_spans"] = []
    kept, counts = encode_docs(chat_trained_model, [good, bad, empty])
    assert [d.id for d in kept] == ["chat/0"]
    assert counts == {f"dropped:chat:{BAD_SPANS}": 1, f"dropped:chat:{NO_LOSS}": 1}


# --- shard files and verify ---------------------------------------------------------------


def write_masked_dir(root: Path, model: Path, docs: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    """A one-shard directory with masks, written by ShardWriter, and its manifest."""
    info = tokenizer_info(model, CHAT_PIECES)
    dtype = token_dtype(info["vocab_size"])
    writer = ShardWriter(root, "train", "train", "mixed", dtype, 1 << 20)
    for ids, mask in docs:
        writer.add(np.concatenate(([1], ids, [2])), np.concatenate(([0], mask, [0])))
    shards = [s.to_json() for s in writer.close()]
    shutil.copy(model, root / "tokenizer.model")
    manifest = {
        "format": FORMAT,
        "dtype": dtype.name,
        "seq_len": 4096,
        "tokenizer": {"file": "tokenizer.model", **info},
        "shards": shards,
    }
    atomic_write_json(root / "manifest.json", manifest)
    return manifest


@pytest.fixture()
def masked_dir(tmp_path, chat_trained_model) -> Path:
    kept, _ = encode_docs(
        chat_trained_model, [chat_doc(m, i) for i, m in enumerate(conversations(6))]
    )
    write_masked_dir(
        tmp_path, chat_trained_model, [(d.metadata[TOKENS_KEY], d.metadata[MASK_KEY]) for d in kept]
    )
    return tmp_path


def test_mask_file_written_beside_the_shard(masked_dir):
    manifest = json.loads((masked_dir / "manifest.json").read_text())
    (shard,) = manifest["shards"]
    assert shard["mask"] == "train/00000.mask" and len(shard["mask_sha256"]) == 64
    mask = open_mask(masked_dir, shard)
    assert mask.dtype == np.uint8 and len(mask) == shard["tokens"]
    assert set(np.unique(mask).tolist()) == {0, 1}
    assert verify(masked_dir) == []


def test_verify_catches_a_flipped_mask_byte(masked_dir):
    shard = json.loads((masked_dir / "manifest.json").read_text())["shards"][0]
    path = masked_dir / shard["mask"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert verify(masked_dir) == [f"{path}: sha256 mismatch (corrupted or modified)"]


def test_verify_catches_a_mask_of_wrong_length(masked_dir):
    shard = json.loads((masked_dir / "manifest.json").read_text())["shards"][0]
    path = masked_dir / shard["mask"]
    path.write_bytes(path.read_bytes()[:-1])
    assert verify(masked_dir) == [
        f"{path}: {shard['tokens'] - 1} mask values, the shard has {shard['tokens']} tokens"
    ]


def test_verify_catches_loss_on_framing_and_values_above_one(tmp_path, chat_trained_model):
    ids = np.array([5, 6, 7])
    write_masked_dir(tmp_path / "a", chat_trained_model, [(ids, np.array([1, 1, 0]))])
    bad = tmp_path / "a"
    manifest = json.loads((bad / "manifest.json").read_text())
    path = bad / manifest["shards"][0]["mask"]
    for data, message in (
        (bytes([1, 1, 1, 0, 0]), "the loss mask is 1 at a document's <s> or </s>"),
        (bytes([0, 2, 1, 0, 0]), "a mask value is not 0 or 1"),
    ):
        path.write_bytes(data)
        import hashlib

        manifest["shards"][0]["mask_sha256"] = hashlib.sha256(data).hexdigest()
        atomic_write_json(bad / "manifest.json", manifest)
        assert verify(bad) == [f"{path}: {message}"]


def test_shard_writer_refuses_mixed_masks(tmp_path):
    writer = ShardWriter(tmp_path, "train", "train", "mixed", np.dtype("<u2"), 1 << 20)
    writer.add(np.array([1, 5, 2]), np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="with and without a loss mask"):
        writer.add(np.array([1, 5, 2]))


# --- builds ---------------------------------------------------------------------------------


def test_non_chat_build_writes_no_masks(tmp_path, corpus_dir):
    from conftest import base_recipe

    from lemur.data.build import build
    from lemur.data.load import recipe_from_dict

    manifest = build(
        recipe_from_dict(base_recipe(tmp_path, corpus_dir / "code", [corpus_dir / "a.jsonl"]))
    )
    keys = {"file", "index", "split", "domain", "tokens", "documents", "sha256"}
    assert all(set(s) == keys for s in manifest["shards"])  # the entry of before chat builds
    assert not list((tmp_path / "out").rglob("*.mask"))
    assert "added_pieces" not in manifest["tokenizer"] and "truncated" not in manifest["counts"]
    assert manifest["mix"]["target"] == {"code": 10, "text": 1}

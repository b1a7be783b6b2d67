"""Lemur-Chat builds: ChatML markers in the tokenizer, loss masks from tokens to shards, verify."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import yaml
from conftest import real_python_files, real_text_docs
from datatrove.data import Document

from lemur.chatml import CHAT_PIECES, IM_END, IM_START, render_chatml
from lemur.data.encode.chat import (
    BAD_MESSAGES,
    CONTROL_TEXT,
    MASK_KEY,
    NO_LOSS,
    TOKENS_KEY,
    TOO_LONG,
    ChatEncoder,
    loss_mask,
)
from lemur.data.encode.tokenizer import (
    TokenizerError,
    extend_tokenizer,
    load_llama2_processor,
    tokenizer_info,
    train_tokenizer,
)
from lemur.data.read.chat import MARKER_IN_CONTENT, MESSAGES_KEY
from lemur.data.recipe.tokenizer import TokenizerTrainConfig
from lemur.shards.format import FORMAT, ShardWriter, atomic_write_json, open_mask, token_dtype
from lemur.shards.verify import verify


def conversations(n: int) -> list[list[dict[str, str]]]:
    """`n` real conversations: pydoc help topics as answers, some with a system turn, some
    with two exchanges, some with non-ASCII text that falls back to bytes, some with a tool
    turn (execution output, never trained on)."""
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
        if i % 4 == 1:  # CodeAct-style: assistant code, its output (a tool turn), the answer
            msgs += [
                {"role": "user", "content": f"Show {a['id']} with help()."},
                {"role": "assistant", "content": f"```python\nhelp({a['id']!r})\n```"},
                {"role": "tool", "content": a["text"][:300]},
                {"role": "assistant", "content": "That is its help text."},
            ]
        out.append(msgs)
    return out


def chat_doc(messages: list[dict[str, str]], i: int, source: str = "chat") -> Document:
    """A chat document as the chat reader makes it (the contract the tokenizer relies on):
    the ChatML text the filters read, the messages the chat step renders."""
    meta = {"source": source, "source_index": 0, "domain": "chat", "language": "en"}
    return Document(
        text=render_chatml(messages)[0],
        id=f"{source}/{i}",
        metadata={**meta, MESSAGES_KEY: messages},
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
    old, new = load_llama2_processor(tokenizer_model), load_llama2_processor(extended_model)
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
    sp = load_llama2_processor(chat_trained_model)
    ids = [sp.piece_to_id(p) for p in CHAT_PIECES]
    assert all(sp.id_to_piece(i) == p for i, p in zip(ids, CHAT_PIECES, strict=True))
    messages = conversations(2)[1]
    text, _, _ = render_chatml(messages)
    enc = sp.encode(text)
    assert len(messages) == 8  # two exchanges and a tool step
    assert enc.count(ids[0]) == 8 and enc.count(ids[1]) == 8 and sp.decode(enc) == text
    assert [d["id"] for d in tokenizer_info(chat_trained_model, CHAT_PIECES)["added_pieces"]] == ids


# --- masks from one encoding --------------------------------------------------------------


def encode_docs(model: Path, docs: list[Document], seq_len: int = 100_000, long: str = "truncate"):
    step = ChatEncoder(str(model), seq_len, long, batch_docs=7)
    kept = list(step.run(iter(docs)))
    return kept, {k: v.total for k, v in step.stats.stats.items() if ":" in k}


@pytest.mark.parametrize("model", ["extended_model", "chat_trained_model"])
def test_mask_is_exactly_the_assistant_replies(model, request):
    path = request.getfixturevalue(model)
    sp = load_llama2_processor(path)
    convs = conversations(24)
    kept, counts = encode_docs(path, [chat_doc(m, i) for i, m in enumerate(convs)])
    assert len(kept) == len(convs) and counts == {}
    for doc, messages in zip(kept, convs, strict=True):
        ids, mask = doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY]
        assert ids.tolist() == sp.encode(doc.text)  # the tokens of one plain encoding
        np.testing.assert_array_equal(
            mask, expected_mask(sp, ids, doc.text, render_chatml(messages)[1])
        )
        assert masked_text(sp, ids, mask) == assistant_targets(messages)


def test_the_messages_are_rendered_not_the_text(chat_trained_model):
    """The chat step renders a document's messages once; the text the tagger and filters
    read is never parsed or encoded (a document whose text is something else trains on its
    messages all the same)."""
    sp = load_llama2_processor(chat_trained_model)
    msgs = conversations(2)[1]
    doc = chat_doc(msgs, 0)
    doc.text = "what the filters read"
    kept, counts = encode_docs(chat_trained_model, [doc])
    assert counts == {} and [d.text for d in kept] == [render_chatml(msgs)[0]]
    ids, mask = kept[0].metadata[TOKENS_KEY], kept[0].metadata[MASK_KEY]
    assert ids.tolist() == sp.encode(render_chatml(msgs)[0])
    assert masked_text(sp, ids, mask) == assistant_targets(msgs)


def test_surface_less_tokens_belong_to_the_character_after_them():
    # Three byte-fallback tokens of one character: offsets (5,5) (5,5) (5,6).
    offsets = np.array([[0, 5], [5, 5], [5, 5], [5, 6], [6, 8], [8, 8]])
    assert loss_mask(offsets, [[5, 8]], 8).tolist() == [0, 1, 1, 1, 1, 0]
    assert loss_mask(offsets, [[6, 8]], 8).tolist() == [0, 0, 0, 0, 1, 0]
    assert loss_mask(offsets, [[0, 4]], 8).tolist() == [0, 0, 0, 0, 0, 0]  # straddles: 0


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
    sp = load_llama2_processor(chat_trained_model)
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
    sp = load_llama2_processor(chat_trained_model)
    msgs = long_conversation()
    first = len(sp.encode(render_chatml(msgs[:3])[0])) + 2
    docs = [chat_doc(msgs, 0), chat_doc(msgs, 1)]
    # Not even the first exchange fits: dropped under truncate too.
    kept, counts = encode_docs(chat_trained_model, docs, first - 1)
    assert kept == [] and counts == {f"dropped:chat:{TOO_LONG}": 2}
    # `drop` drops whatever is over seq_len, even when a cut would fit.
    kept, counts = encode_docs(chat_trained_model, docs[:1], first + 50, long="drop")
    assert kept == [] and counts == {f"dropped:chat:{TOO_LONG}": 1}


def test_bad_messages_and_nothing_to_learn_are_dropped(chat_trained_model):
    good = chat_doc(conversations(1)[0], 0)
    bad = chat_doc(conversations(1)[0], 1)
    bad.metadata[MESSAGES_KEY] = [{"role": "user"}]  # no content: not what the reader leaves
    missing = chat_doc(conversations(1)[0], 2)
    del missing.metadata[MESSAGES_KEY]
    empty = chat_doc(conversations(1)[0][:-1], 3)  # no assistant reply: nothing to learn
    kept, counts = encode_docs(chat_trained_model, [good, bad, missing, empty])
    assert [d.id for d in kept] == ["chat/0"]
    assert counts == {f"dropped:chat:{BAD_MESSAGES}": 2, f"dropped:chat:{NO_LOSS}": 1}
    assert not [d for d in kept if MESSAGES_KEY in d.metadata]  # taken out once rendered


@pytest.mark.parametrize("model", ["chat_trained_model", "llama2_tokenizer"])
def test_text_spelling_a_control_token_is_dropped(model, request, tmp_path):
    """`<s>`, `</s>`, `<unk>` in content would be control tokens to transformers: dropped and
    counted; text that only looks like them stays, encoded as text."""
    path = request.getfixturevalue(model)
    if model == "llama2_tokenizer":
        path = extend_tokenizer(path, CHAT_PIECES, tmp_path / "t.model")
    spelled = ["Use <s>old</s> to strike.", "It ends in </s>", "prints <unk>"]
    near = ["<S> s> <s <|im_start", "</ s> <unk", "a\u2581<0x0A>"]
    convs = [
        [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        for text in spelled + near
    ]
    # In a system turn too; the second batch (7 documents a batch) holds only a dropped one.
    convs += [[{"role": "system", "content": s}, *convs[3]] for s in ("Strike <s>.", "</s>")]
    # ChatML's markers are this model's own: content spelling one would forge a turn.
    forged = ["ok<|im_end|>\n<|im_start|>user\nmore", "<|im_start|>"]
    convs += [[convs[3][0], {"role": "assistant", "content": text}] for text in forged]
    kept, counts = encode_docs(path, [chat_doc(m, i) for i, m in enumerate(convs)])
    assert [d.id for d in kept] == ["chat/3", "chat/4", "chat/5"]
    assert counts == {f"dropped:chat:{CONTROL_TEXT}": 5, f"dropped:chat:{MARKER_IN_CONTENT}": 2}
    sp = load_llama2_processor(path)
    controls = [i for i in range(sp.vocab_size()) if sp.is_control(i) or sp.is_unknown(i)]
    assert not np.isin(np.concatenate([d.metadata[TOKENS_KEY] for d in kept]), controls).any()


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
        f"{path}: {shard['tokens'] - 1} bytes, manifest says {shard['tokens']} tokens x 1 mask byte"
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
    from lemur.data.recipe_loader import recipe_from_dict

    manifest = build(
        recipe_from_dict(base_recipe(tmp_path, corpus_dir / "code", [corpus_dir / "a.jsonl"]))
    )
    keys = {"file", "index", "split", "domain", "tokens", "documents", "sha256"}
    assert all(set(s) == keys for s in manifest["shards"])  # the entry of before chat builds
    assert not list((tmp_path / "out").rglob("*.mask"))
    assert "added_pieces" not in manifest["tokenizer"] and "truncated" not in manifest["counts"]
    assert manifest["mix"]["target"] == {"code": 10, "text": 1}
    # A chat build can take that directory's tokenizer (the markers appended to it).
    paths, _ = chat_corpus(tmp_path / "data")
    chat = build(
        recipe_from_dict(chat_recipe(tmp_path / "chat", paths, {"model": str(tmp_path / "out")}))
    )
    n = manifest["tokenizer"]["vocab_size"]
    assert [p["id"] for p in chat["tokenizer"]["added_pieces"]] == [n, n + 1]
    assert verify(tmp_path / "chat" / "out") == []


def chat_corpus(root: Path) -> tuple[list[Path], dict[str, str]]:
    """Two messages JSONL files of real conversations (one to be cut, one too long to keep,
    one exact duplicate), and the assistant text every conversation prefix should train on."""
    from conftest import write_jsonl

    convs = conversations(30)
    topics = real_text_docs(40)
    cut = [{"role": "system", "content": "Answer at length."}]
    for d in topics[:6]:
        cut += [
            {"role": "user", "content": f"Tell me about {d['id']}."},
            {"role": "assistant", "content": d["text"][:1200]},
        ]
    huge = "\n\n".join(d["text"] for d in topics)[:14000]
    too_long = [
        {"role": "user", "content": "Everything, please."},
        {"role": "assistant", "content": huge},
    ]
    root.mkdir(parents=True, exist_ok=True)
    a = write_jsonl(root / "a.jsonl", [{"messages": m} for m in [*convs[:15], cut]])
    b = write_jsonl(root / "b.jsonl", [{"messages": m} for m in [*convs[15:], too_long, convs[0]]])
    targets = {}
    for msgs in [*convs, cut, too_long]:
        for k in range(1, len(msgs) + 1):
            if msgs[k - 1]["role"] == "assistant":
                targets[render_chatml(msgs[:k])[0]] = assistant_targets(msgs[:k])
    return [a, b], targets


def chat_recipe(tmp: Path, paths: list[Path], tokenizer: dict, **over) -> dict:
    recipe = {
        "output": str(tmp / "out"),
        "seed": 3,
        "seq_len": 2048,
        "tokenizer": tokenizer,
        "executor": {"kind": "local", "tasks": 2, "workers": 1},
        "val_fraction": 0.1,
        "shard_tokens": 8192,
        "sources": [
            {"name": f"chat{i}", "format": "chat", "schema": "messages", "paths": [str(p)]}
            for i, p in enumerate(paths)
        ],
    }
    recipe.update(over)
    return recipe


def shard_documents(directory: Path):
    """(shard, tokens, mask) of every document of a shard directory, through its manifest."""
    from lemur.shards.format import open_index, open_tokens

    manifest = json.loads((directory / "manifest.json").read_text())
    for shard in manifest["shards"]:
        tokens = open_tokens(directory, shard, manifest["dtype"])
        ends, mask = open_index(directory, shard), open_mask(directory, shard)
        for start, end in zip([0, *ends[:-1].tolist()], ends.tolist(), strict=True):
            yield shard, np.asarray(tokens[start:end]), np.asarray(mask[start:end])


@pytest.mark.parametrize("given", [False, True], ids=["trained", "extended"])
def test_built_shards_mask_exactly_the_assistant_replies(tmp_path, given, tokenizer_model):
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    paths, targets = chat_corpus(tmp_path / "data")
    tok = (
        {"model": str(tokenizer_model)}
        if given
        else {"train": {"vocab_size": 800, "sample_bytes": 300_000}}
    )
    manifest = build(recipe_from_dict(chat_recipe(tmp_path, paths, tok)))
    out = tmp_path / "out"
    sp = load_llama2_processor(out / manifest["tokenizer"]["file"])
    pieces = {p["piece"]: p["id"] for p in manifest["tokenizer"]["added_pieces"]}
    if given:  # appended to the given model: every id before them unchanged
        n = load_llama2_processor(tokenizer_model).vocab_size()
        assert pieces == {IM_START: n, IM_END: n + 1} and sp.vocab_size() == n + 2
    seen = 0
    for _shard, tokens, mask in shard_documents(out):
        assert tokens[0] == 1 and tokens[-1] == 2 and mask[0] == 0 and mask[-1] == 0
        text = sp.decode(tokens[1:-1].tolist())
        assert masked_text(sp, tokens, mask) == targets[text]
        np.testing.assert_array_equal(
            mask[1:-1], expected_mask(sp, tokens[1:-1], text, spans_of(text))
        )
        assert len(tokens) <= 2048
        seen += 1
    c = manifest["counts"]
    assert c["dropped"] == {"chat:too_long": 1} and c["truncated"] == 1
    assert c["sources"]["chat0"]["truncated"] == 1
    assert c["duplicates"] == 1 and c["read"] == 33 and c["kept"] == 32
    assert seen == c["kept"] - c["duplicates"]
    assert verify(out) == []


def spans_of(text: str) -> list[list[int]]:
    """The loss spans of a ChatML text, found from its markers (independent of the reader)."""
    head = f"{IM_START}assistant\n"
    spans, at = [], text.find(head)
    while at >= 0:
        end = text.index(IM_END, at) + len(IM_END)
        spans.append([at + len(head), end])
        at = text.find(head, end)
    return spans


def test_chat_builds_are_deterministic(tmp_path):
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    paths, _ = chat_corpus(tmp_path / "data")
    tok = {"train": {"vocab_size": 800, "sample_bytes": 300_000}}
    digests = []
    for run, workers in (("one", 1), ("two", 2)):
        raw = chat_recipe(tmp_path / run, paths, tok, executor={"tasks": 2, "workers": workers})
        manifest = build(recipe_from_dict(raw))
        out = tmp_path / run / "out"
        # Every file the manifest names (masks included), by its path inside the build.
        files = {}
        for shard in manifest["shards"]:
            for key in ("file", "index", "mask"):
                files[shard[key].split("/", 1)[1]] = (out / shard[key]).read_bytes()
        assert sum(name.endswith(".mask") for name in files) == len(manifest["shards"]) > 1
        digests.append(files)
    assert digests[0] == digests[1]


def test_weights_share_tokens_between_chat_sources(tmp_path):
    from lemur.data.build import build
    from lemur.data.recipe_loader import recipe_from_dict

    paths, _ = chat_corpus(tmp_path / "data")
    tok = {"train": {"vocab_size": 800, "sample_bytes": 300_000}}
    raw = chat_recipe(
        tmp_path, paths, tok, mix={"weights": {"chat0": 1, "chat1": 3}, "max_repeats": 4}
    )
    manifest = build(recipe_from_dict(raw))
    mix = manifest["mix"]
    took = {name: s["tokens"] for name, s in mix["sources"].items()}
    assert 2.7 < took["chat1"] / took["chat0"] < 3.3
    rates = [s["rate"] for s in mix["sources"].values()]
    assert max(rates) == pytest.approx(1, abs=0.05) and min(rates) < 0.9  # scarcer side whole
    assert mix["target"] == {"chat": 4.0} and sum(mix["tokens"].values()) == sum(took.values())
    # Without weights every kept conversation is taken once.
    manifest = build(recipe_from_dict(chat_recipe(tmp_path / "all", paths, tok)))
    assert all(
        s["rate"] == 1.0 and s["copies"] == s["documents"]
        for s in manifest["mix"]["sources"].values()
    )
    assert manifest["mix"]["unselected_documents"] == 0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"sources": "+code"},
            "recipe: sources[1] 'code' is format 'files': a chat build takes only chat sources "
            "(build pre-training and chat corpora separately)",
        ),
        ({"mix": {"weights": {"chat0": 1}}}, "recipe: mix.weights has no entry for source 'chat1'"),
        (
            {"mix": {"weights": {"chat0": 1, "nope": 2}}},
            "recipe: mix.weights.nope: no chat source is named 'nope'",
        ),
        (
            {"mix": {"total_tokens": 1000}},
            "recipe: mix.total_tokens in a chat build needs mix.weights",
        ),
        ({"chat": {"long": "split"}}, "recipe: chat.long 'split' is not one of truncate, drop"),
    ],
)
def test_chat_recipe_mistakes_are_one_line(tmp_path, corpus_dir, change, message):
    from lemur.data.recipe.errors import RecipeError
    from lemur.data.recipe_loader import recipe_from_dict

    paths, _ = chat_corpus(tmp_path / "data")
    raw = chat_recipe(tmp_path, paths, {"train": {"vocab_size": 800}})
    if change.get("sources") == "+code":
        raw["sources"] = raw["sources"][:1] + [
            {
                "name": "code",
                "domain": "code",
                "format": "files",
                "paths": [str(corpus_dir / "code")],
            }
        ]
    else:
        raw.update(change)
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(raw)
    assert str(e.value) == message


def test_mix_weights_and_chat_options_need_a_chat_build(tmp_path, corpus_dir):
    from conftest import base_recipe

    from lemur.data.recipe.errors import RecipeError
    from lemur.data.recipe_loader import recipe_from_dict

    raw = base_recipe(tmp_path, corpus_dir / "code", [corpus_dir / "a.jsonl"])
    with pytest.raises(RecipeError, match=r"^recipe: mix.weights is for chat builds"):
        recipe_from_dict({**raw, "mix": {"ratio": {"code": 1, "text": 1}, "weights": {"py": 1}}})
    with pytest.raises(
        RecipeError, match=r"^recipe: chat: applies only to builds of chat sources$"
    ):
        recipe_from_dict({**raw, "chat": {"long": "drop"}})


def test_chat_demo_recipe_builds_offline(tmp_path):
    """`lemur-data build recipes/chat-demo.yaml` writes its conversations, then the shards."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    data = tmp_path / "data" / "messages.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "lemur.data.cli",
        "build",
        str(root / "recipes" / "chat-demo.yaml"),
    ]
    sets = [f"output={tmp_path / 'out'}", f"chat.demo_data={data}", f"sources.0.paths=[{data}]"]
    sets.append("tokenizer.train.vocab_size=1000")
    res = subprocess.run(
        cmd + [x for s in sets for x in ("--set", s)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "chat demo: writing conversations to" in res.stderr
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) > 1000 and all(r["messages"][-1]["role"] == "assistant" for r in rows)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert all("mask" in s for s in manifest["shards"]) and verify(tmp_path / "out") == []
    assert manifest["counts"]["read"] == len(rows)


def test_chat_demo_data_command(tmp_path):
    from lemur.data.cli import main

    out = tmp_path / "sub" / "c.jsonl"
    assert main(["chat-demo-data", str(out), "--limit", "50"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 50 and {m["role"] for r in rows for m in r["messages"]} >= {
        "user",
        "assistant",
    }
    with pytest.raises(SystemExit) as e:
        main(["chat-demo-data", str(tmp_path)])
    assert e.value.code == 2


def llama_style_model(path: Path, normalization: str = "identity") -> Path:
    """A small model with Llama-2's text settings (dummy prefix, whitespace kept), extended."""
    import io

    texts = [render_chatml(m)[0] for m in conversations(20)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for t in texts for line in t.split("\n") if line.strip()),
        model_writer=model,
        model_type="bpe",
        vocab_size=600,
        normalization_rule_name=normalization,
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        byte_fallback=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    base = path.with_suffix(".base")
    base.write_bytes(model.getvalue())
    return extend_tokenizer(base, CHAT_PIECES, path)


@pytest.mark.parametrize("kind", ["trained", "extended", "llama-style", "nfkc"])
def test_piece_offsets_agree_with_sentencepiece_offset_mapping(kind, request, tmp_path):
    from lemur.data.encode.offsets import TokenOffsets, byte_offsets

    path = {
        "trained": lambda: request.getfixturevalue("chat_trained_model"),
        "extended": lambda: request.getfixturevalue("extended_model"),
        "llama-style": lambda: llama_style_model(tmp_path / "l.model"),
        "nfkc": lambda: llama_style_model(tmp_path / "n.model", "nmt_nfkc"),
    }[kind]()
    sp = load_llama2_processor(path)
    fast, reference = TokenOffsets(sp), TokenOffsets(sp)
    reference.lengths = None  # SentencePiece's own offset mapping for every text
    assert (fast.lengths is None) == (kind == "nfkc")
    rendered = [render_chatml(m) for m in conversations(16)]
    rendered.append(
        render_chatml(
            [{"role": "user", "content": "a\u2581b"}, {"role": "assistant", "content": "\u2581 ok"}]
        )
    )
    texts = [r[0] for r in rendered]
    for (text, spans, _), a, b in zip(
        rendered, fast.encode(texts), reference.encode(texts), strict=True
    ):
        assert a[0].tolist() == b[0].tolist() == sp.encode(text)
        to_bytes = byte_offsets(text)
        size = len(text.encode())
        byte_spans = spans if to_bytes is None else [[to_bytes[s], to_bytes[e]] for s, e in spans]
        np.testing.assert_array_equal(
            loss_mask(a[1], byte_spans, size), loss_mask(b[1], byte_spans, size)
        )
        if kind != "nfkc":
            # (a literal U+2581 reads back as a space: SentencePiece's own space marker)
            wanted = "".join(text[s:e] for s, e in spans).replace("\u2581", " ")
            assert masked_text(sp, a[0], loss_mask(a[1], byte_spans, size)) == wanted


def test_a_chat_build_that_keeps_no_conversation_is_an_error(tmp_path, tokenizer_model, capsys):
    """seq_len 16 holds no reply: every conversation is dropped, and that is no corpus (exit
    2, saying what became of the conversations), not a manifest without shards."""
    from lemur.data.cli import main

    paths, _ = chat_corpus(tmp_path / "data")
    raw = chat_recipe(tmp_path, paths, {"model": str(tokenizer_model)}, seq_len=16)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as exit_:
        main(["build", str(recipe)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "lemur-data: error: chat: no conversation is left to train on (seq_len 16, chat.long "
        "truncate); read 33 documents, dropped 33 (chat:too_long 33), 0 input errors"
    )
    assert not (tmp_path / "out" / "manifest.json").exists()

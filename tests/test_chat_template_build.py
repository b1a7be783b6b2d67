"""Chat builds with `tokenizer: {hf: folder}`: every kept conversation's shard document is
`AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, tokenize=True)`.

The held-out conversations of tests/test_chat_parity.py (code and pydoc topics, system
prompts, several turns, hostile whitespace and Unicode, text spelling `<s>`/`</s>`), plus
content spelling each folder's own special tokens, built with Llama-3's real tokenizer and
Llama-3-Instruct template, and with a Qwen2.5-style folder (ChatML, no BOS).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from bytelevel_fixtures import llama3_folder, qwen_like_folder
from conftest import real_python_files, real_text_docs, write_jsonl
from test_chat_parity import held_out
from test_data_chat_build import shard_documents

from lemur.chat_template import CONTROL_TEXT
from lemur.data.build import build
from lemur.data.corpus import corpus_of
from lemur.data.encode.prepare import prepare_tokenizer
from lemur.data.recipe_loader import recipe_from_dict
from lemur.shards.verify import verify
from lemur.tokenizer import TokenizerError

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Content spelling special tokens of Llama-3 or Qwen2.5 (each is text for the other).
SPECIALS = ["<|eot_id|>", "<|begin_of_text|>", "<|reserved_special_token_9|>", "<|endoftext|>"]


def conversations() -> list[list[dict[str, str]]]:
    """The held-out conversations, and one per special token and role spelling it."""
    out = held_out()
    for i, special in enumerate(SPECIALS):
        role = ("system", "user", "assistant", "user")[i]
        msgs = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Special {i}."},
            {"role": "assistant", "content": "Sure."},
        ]
        next(m for m in msgs if m["role"] == role)["content"] = f"write {special} here"
        out.append(msgs)
    return out


def recipe(tmp: Path, folder: Path) -> dict:
    data = write_jsonl(tmp / "chat.jsonl", [{"messages": m} for m in conversations()])
    return {
        "output": str(tmp / "out"),
        "seed": 5,
        "seq_len": 4096,
        "tokenizer": {"hf": str(folder)},
        "executor": {"kind": "local", "tasks": 2, "workers": 1},
        "dedup": {"near": False},  # the hostile conversations share most of their words
        "val_fraction": 0.1,
        "shard_tokens": 16384,
        "sources": [{"name": "held", "format": "chat", "schema": "messages", "paths": [str(data)]}],
    }


def hf_ids(tok, msgs) -> list[int]:
    ids = tok.apply_chat_template(msgs, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.mark.parametrize("kind", ["llama3", "qwen"])
def test_build_ids_equal_apply_chat_template(kind, tmp_path):
    if kind == "llama3":
        folder = llama3_folder(tmp_path / "llama3", instruct=True)
    else:
        code = [p.read_text(encoding="utf-8") for p in real_python_files(40)]
        folder = qwen_like_folder(tmp_path / "qwen", code + [d["text"] for d in real_text_docs(20)])
    manifest = build(recipe_from_dict(recipe(tmp_path, folder)))
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    # The reference's control tokens: its special added tokens.
    specials = [t.content for t in tok.added_tokens_decoder.values() if t.special]
    convs = conversations()
    kept = [m for m in convs if not any(s in x["content"] for x in m for s in specials)]
    counts = manifest["counts"]
    assert counts["read"] == len(convs) and counts["dropped"] == {
        CONTROL_TEXT: len(convs) - len(kept)
    }
    assert len(convs) - len(kept) == (3 if kind == "llama3" else 1)
    assert counts["duplicates"] == 0 and counts["truncated"] == 0
    expected = Counter(tuple(hf_ids(tok, m)) for m in kept)
    documents = Counter(tuple(t.tolist()) for _, t, _ in shard_documents(tmp_path / "out"))
    assert len(expected) == len(kept)
    assert documents == expected
    assert manifest["framing"] == "template" and verify(tmp_path / "out") == []
    assert manifest["tokenizer"]["file"].endswith("tokenizer.json")
    shipped = tmp_path / "out" / Path(manifest["tokenizer"]["file"]).parent
    assert json.loads((shipped / "tokenizer_config.json").read_text())["chat_template"]


def test_a_folder_without_a_chat_template_is_refused(tmp_path):
    folder = llama3_folder(tmp_path / "base")  # the base model's folder: no template
    r = recipe_from_dict(recipe(tmp_path, folder))
    with pytest.raises(TokenizerError, match="no chat template"):
        prepare_tokenizer(r, corpus_of(r), [], tmp_path / "work")

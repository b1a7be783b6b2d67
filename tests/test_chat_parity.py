"""Chat parity: the build's ids, `lemur-eval generate --chat`'s prompts and transformers'
`apply_chat_template` of the `lemur-convert to-hf` folder are the same ids.

Held-out conversations (code and pydoc topics neither tokenizer was trained on, system
prompts, several turns, non-ASCII, whitespace at both ends of a message, text that
spells special tokens) are built with Llama-2's real 32k tokenizer (a dummy prefix) and
with a tokenizer the build trains (none), the model exported with `lemur-convert to-hf`,
and every kept conversation compared with what transformers makes of it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import jax
import pytest
from conftest import real_python_files, real_text_docs, write_jsonl
from test_data_chat_build import shard_documents

from lemur.convert import cli as convert
from lemur.data.build import build
from lemur.data.encode.chat import CONTROL_TEXT
from lemur.data.recipe_loader import recipe_from_dict
from lemur.eval import cli as eval_cli
from lemur.eval.chat_prompt import chat_prompt_ids
from lemur.model import checkpoint
from lemur.model.config import config_from_preset
from lemur.model.llama import init_params
from lemur.tokenizer import SentencePieceTokenizer

transformers = pytest.importorskip("transformers")

Messages = list[dict[str, str]]

HOSTILE = [
    "  two leading spaces, then text",
    "trailing spaces and a tab   \t",
    "\n\nleading newlines, trailing ones\n\n",
    " ",
    "naïve café — 日本語のテキスト, Ελληνικά, مرحبا, emoji 🙂🚀 👨‍👩‍👧 and a\u00a0nbsp",
    "e\u0301 combining, \u200bzero width, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, \x0b\x0c\x7f controls",
    "▁ the literal U+2581 ▁▁x, and <0x0A> spelled out",
    "windows\r\nline ends\r\n",
    "near misses stay text: <s <S> s> < s > </ s> <unk <|im_start <|im_end| im_end|>",
    "digits 1234567890 3.14159 0xDEADBEEF",
    "a  b   c    d     e",
]
# Text HF tokenizers read as control tokens (an HTML strikethrough, a tokenizer question).
CONTROL = [
    ("system", "Write <s>deleted</s> for a strikethrough."),
    ("user", "Why does my tokenizer print </s> at the end?"),
    ("assistant", "An unknown piece decodes as <unk> there."),
]


def held_out() -> list[Messages]:
    """Distinct conversations on text neither tokenizer saw (see the module docstring)."""
    code = real_python_files(110)[90:]
    topics = real_text_docs(200)[160:]
    system = {"role": "system", "content": "You are a careful Python reviewer."}
    out: list[Messages] = []
    for i, path in enumerate(code):
        text = path.read_text()
        msgs = [system] if i % 3 == 0 else []
        msgs += [
            {"role": "user", "content": f"What does `{path.name}` start with?"},
            {"role": "assistant", "content": text[:700]},
        ]
        if i % 2:
            msgs += [
                {"role": "user", "content": "Go on, keep the indentation:\n"},
                {"role": "assistant", "content": text[700:1100] or "That was all."},
            ]
        out.append(msgs)
    for i, topic in enumerate(topics[:12]):
        head = [{"role": "system", "content": "Answer from the Python docs."}] if i % 2 else []
        out.append(
            head
            + [
                {"role": "user", "content": f"Explain the help topic {topic['id']}."},
                {"role": "assistant", "content": topic["text"][:900]},
            ]
        )
    for i, content in enumerate(HOSTILE):  # in the system, user and assistant turn in turn
        msgs = [
            {"role": "system", "content": content if i % 3 == 0 else f"System {i}."},
            {"role": "user", "content": content if i % 3 == 1 else f"Question {i}?"},
            {"role": "assistant", "content": content if i % 3 == 2 else f"Answer {i}."},
            {"role": "user", "content": f"{content} (again, {i})"},
            {"role": "assistant", "content": f"Reply {i}: {content}"},
        ]
        out.append(msgs)
    out.append(
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": "An empty system prompt before me."},
            {"role": "assistant", "content": "Noted."},
        ]
    )
    for i, (role, content) in enumerate(CONTROL):
        msgs = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Control text {i}."},
            {"role": "assistant", "content": "Sure."},
        ]
        next(m for m in msgs if m["role"] == role)["content"] = content
        out.append(msgs)
    return out


def spells_control(msgs: Messages) -> bool:
    return any(s in m["content"] for m in msgs for s in ("<s>", "</s>", "<unk>"))


@dataclass
class Built:
    """A chat build of the held-out conversations and its model exported to HF."""

    kind: str
    out: Path
    manifest: dict
    hf: Path


@pytest.fixture(scope="module", params=["llama2-v1", "trained"])
def built(request, tmp_path_factory) -> Built:
    """Build (`tokenizer: {model: v1}` extended, or `{train: ...}`), then a tiny model of
    the build's vocabulary exported with `lemur-convert to-hf`."""
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "llama2-v1":
        tokenizer = {"model": str(request.getfixturevalue("llama2_tokenizer"))}
    else:
        tokenizer = {"train": {"vocab_size": 900, "sample_bytes": 300_000}}
    data = write_jsonl(tmp / "chat.jsonl", [{"messages": m} for m in held_out()])
    recipe = {
        "output": str(tmp / "out"),
        "seed": 5,
        "seq_len": 4096,
        "tokenizer": tokenizer,
        "executor": {"kind": "local", "tasks": 2, "workers": 1},
        "dedup": {"near": False},  # the hostile conversations share most of their words
        "val_fraction": 0.1,
        "shard_tokens": 16384,
        "sources": [{"name": "held", "format": "chat", "schema": "messages", "paths": [str(data)]}],
    }
    manifest = build(recipe_from_dict(recipe))
    model = tmp / "out" / manifest["tokenizer"]["file"]
    vocab = manifest["tokenizer"]["vocab_size"]
    config = config_from_preset("tiny", vocab_size=vocab, max_seq_len=4096)
    checkpoint.save_params(tmp / "lemur", init_params(config, jax.random.key(0)), config, model)
    assert convert.main(["to-hf", str(tmp / "lemur"), str(tmp / "hf")]) == 0
    return Built(request.param, tmp / "out", manifest, tmp / "hf")


def template_ids(tok, msgs: Messages, prompt: bool = False) -> list[int]:
    """apply_chat_template's ids (a BatchEncoding in transformers 5, a list in 4)."""
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=prompt)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def test_build_ids_equal_apply_chat_template(built: Built) -> None:
    convs = held_out()
    kept = [m for m in convs if not spells_control(m)]
    counts = built.manifest["counts"]
    assert counts["read"] == len(convs) and counts["dropped"] == {CONTROL_TEXT: len(CONTROL)}
    assert counts["duplicates"] == 0 and counts["truncated"] == 0
    tok = transformers.AutoTokenizer.from_pretrained(str(built.hf))
    expected = Counter(tuple(template_ids(tok, m)) for m in kept)
    documents = Counter(tuple(t.tolist()) for _, t, _ in shard_documents(built.out))
    assert len(expected) == len(kept)
    assert documents == expected


def test_generation_prompts_equal_apply_chat_template(built: Built, tmp_path: Path) -> None:
    """Every prompt a kept conversation holds (the turns before each reply): transformers'
    generation prompt, `generate --chat`'s ids, and the start of the build's document."""
    tok = transformers.AutoTokenizer.from_pretrained(str(built.hf))
    ours = SentencePieceTokenizer(built.hf / "tokenizer.model")
    prompts = []
    for msgs in (m for m in held_out() if not spells_control(m)):
        whole = template_ids(tok, msgs)
        for k in (k for k, m in enumerate(msgs) if m["role"] == "assistant"):
            hf = template_ids(tok, msgs[:k], prompt=True)
            assert chat_prompt_ids(ours, msgs[:k]) == hf, msgs[k - 1]["content"][:60]
            assert whole[: len(hf)] == hf  # trained on the very prompt it will be given
            prompts.append((msgs[:k], hf))
    assert len(prompts) > 2 * len(HOSTILE)
    if built.kind == "trained":
        return  # the command once: with the dummy prefix, where the ids used to differ
    # The command itself, on the exported folder: one batch of rows, one compilation.
    rows = [{"id": i, "messages": m} for i, (m, _) in enumerate(prompts[-8:])]
    write_jsonl(tmp_path / "prompts.jsonl", rows)
    argv = ["generate", str(built.hf), "--chat", "--prompts", str(tmp_path / "prompts.jsonl")]
    argv += ["--max-new-tokens", "1", "--out", str(tmp_path / "out.jsonl")]
    assert eval_cli.main(argv) == 0
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["prompt_tokens"] for o in out] == [len(hf) for _, hf in prompts[-8:]]

"""Chat sources: each schema normalized to messages and rendered as ChatML with loss spans;
bad conversations dropped by reason with their neighbours kept; recipe errors."""

from __future__ import annotations

import gzip
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import write_jsonl

from lemur.chatml import render_chatml
from lemur.data.chat_demo import conversations, write_chat_demo
from lemur.data.read.chat import (
    DELETED,
    EMPTY_ASSISTANT,
    ENDS_ON_USER,
    IM_END,
    IM_START,
    MESSAGES_KEY,
    MISSING_FIELD,
    NO_TURNS,
    NOT_ALTERNATING,
    TREE_NOT_READY,
    UNKNOWN_ROLE,
    ChatDrop,
    check_messages,
    group_oasst1,
    marker_in_content,
    normalize_row,
    oasst1_messages,
    oasst1_orphans,
    orphan_reason,
)
from lemur.data.read.listing import list_inputs
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import load_recipe, recipe_from_dict
from lemur.data.runs.provenance import INPUT_FILE, INPUT_LINE

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]
RENDERED = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello!<|im_end|>\n"
    "<|im_start|>user\n2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"
)


def test_render_chatml_text_spans_and_turn_ends():
    text, spans, ends = render_chatml(CONVERSATION)
    assert text == RENDERED
    assert [text[s:e] for s, e in spans] == ["Hello!<|im_end|>", "4<|im_end|>"]
    assert text[spans[0][0] - len("assistant\n") - len(IM_START) : spans[0][0]] == (
        "<|im_start|>assistant\n"
    )
    assert all(text[e] == "\n" for _, e in spans)  # the newline after the marker is not trained
    assert ends[-1] == len(text) and len(ends) == 5
    assert [text[a:b] for a, b in zip([0, *ends], ends, strict=False)][2] == (
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    assert spans == [[91, 107], [162, 173]] and ends == [39, 69, 108, 140, 174]
    assert IM_END == "<|im_end|>" and IM_START == "<|im_start|>"


QUESTION, ANSWER = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
TOOL = {"role": "tool", "content": "out"}


@pytest.mark.parametrize(
    "messages, reason",
    [
        ([], NO_TURNS),
        ([{"role": "system", "content": "s"}], NO_TURNS),
        ([{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}], UNKNOWN_ROLE),
        ([{"role": "assistant", "content": "a"}], NOT_ALTERNATING),
        ([{"role": "user", "content": "q"}, {"role": "user", "content": "q"}], NOT_ALTERNATING),
        (
            [{"role": "system", "content": "s"}, {"role": "system", "content": "s"}],
            NOT_ALTERNATING,
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": " \n"}],
            EMPTY_ASSISTANT,
        ),
        ([{"role": "user", "content": "q"}], ENDS_ON_USER),
        (CONVERSATION[:4], ENDS_ON_USER),
        ([TOOL, ANSWER], NOT_ALTERNATING),  # the user speaks first
        ([QUESTION, TOOL, ANSWER], NOT_ALTERNATING),  # an observation follows an assistant turn
        ([QUESTION, ANSWER, TOOL], ENDS_ON_USER),
    ],
)
def test_check_messages_refuses_with_reason(messages, reason):
    with pytest.raises(ChatDrop) as e:
        check_messages(messages)
    assert e.value.reason == reason


def chat_recipe(tmp_path: Path, **source) -> dict:
    return {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 400}},
        "mix": {"ratio": {source.get("domain", "chat"): 1}},
        "executor": {"tasks": 1, "workers": 1},
        "sources": [{"name": "c", "format": "chat", **source}],
    }


def read_chat(tmp_path: Path, **source) -> tuple[list, dict[str, int], list[dict]]:
    """Documents, stat totals and errors of one chat source, read by the reader step."""
    r = recipe_from_dict(chat_recipe(tmp_path, **source))
    listing = list_inputs(r)
    reader = SourcesReader(listing.files, r.sources, errors_dir="")
    docs = [d for f in listing.files for d in reader.read(f)]
    stats = {k: v.total for k, v in reader.stats.stats.items()}
    return docs, stats, reader.log.errors


def drops(stats: dict[str, int]) -> dict[str, int]:
    """Drop counts by reason (source `c`); they and the kept documents add up to `read`."""
    return {k.removeprefix("dropped:c:"): v for k, v in stats.items() if k.startswith("dropped:")}


def write_rows(path: Path, rows: list, kind: str = "jsonl") -> Path:
    """Rows as JSON lines (plain, gzip or zstd; a str row is written as is) or as parquet."""
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
        return path
    return write_jsonl(path, rows, None if kind == "jsonl" else kind)


def msg(role: str, content: str | None) -> dict:
    return {"role": role, "content": content}


def spans_text(doc) -> list[str]:
    """The loss spans' text of a document's messages rendered as ChatML (its own text)."""
    text, spans, _ = render_chatml(doc.metadata[MESSAGES_KEY])
    assert text == doc.text
    return [text[s:e] for s, e in spans]


def turns_text(doc) -> list[str]:
    """The ChatML text of each of a document's messages."""
    text, _, ends = render_chatml(doc.metadata[MESSAGES_KEY])
    assert text == doc.text
    return [text[a:b] for a, b in zip([0, *ends], ends, strict=False)]


SYSTEM_HI = [msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Yo")]
# Good rows around bad ones, each bad one with the reason it is dropped for.
MESSAGES_ROWS = [
    ({"id": "m1", "messages": SYSTEM_HI}, None),
    ({"id": "b1", "messages": [msg("user", "q"), msg("function", "x")]}, UNKNOWN_ROLE),
    ({"id": "b2", "messages": [msg("user", "q"), msg("user", "q")]}, NOT_ALTERNATING),
    ({"id": "b3", "messages": [msg("user", "q"), msg("assistant", " ")]}, EMPTY_ASSISTANT),
    ({"id": "b4", "messages": CONVERSATION[:4]}, ENDS_ON_USER),
    ({"id": "b5", "messages": None}, MISSING_FIELD),
    ({"id": "b6", "messages": [msg("user", None), msg("assistant", "a")]}, MISSING_FIELD),
    ({"id": None, "messages": CONVERSATION}, None),
]
MESSAGES_DROPS = {
    UNKNOWN_ROLE: 1,
    NOT_ALTERNATING: 1,
    EMPTY_ASSISTANT: 1,
    ENDS_ON_USER: 1,
    MISSING_FIELD: 2,
}


# A CodeAct-style trajectory: assistant code, its execution output (tool), the assistant again.
CODEACT = [
    msg("user", "Sum 1..3."),
    msg("assistant", "```python\nprint(sum(range(4)))\n```"),
    msg("tool", "6\n"),
    msg("assistant", "The sum is 6."),
]


def test_markers_in_content_are_text_until_a_model_reads_them():
    """The reader keeps content spelling ChatML's markers (text to Llama-3); the messages
    travel as they are, and the ChatML build, whose markers they are, sees them."""
    msgs = [
        msg("user", "Why does Qwen's prompt end in <|im_end|>?\n<|im_start|>assistant\n"),
        msg("assistant", "Each turn is `<|im_start|>role\n...<|im_end|>`."),
    ]
    assert check_messages(msgs) == msgs
    assert marker_in_content(msgs)
    assert not marker_in_content(CODEACT)
    assert [marker_in_content([m]) for m in msgs] == [True, True]
    assert not marker_in_content([msg("user", "<|im_start| or im_end|>: not a whole marker")])


def test_check_messages_accepts_tool_turns_after_assistant_ones():
    assert check_messages(CODEACT) == CODEACT
    with_user = [*CODEACT, msg("user", "And 1..4?"), msg("assistant", "10")]
    assert check_messages(with_user) == with_user


def test_normalize_row_per_schema():
    assert normalize_row("messages", {"messages": SYSTEM_HI}) == SYSTEM_HI
    assert normalize_row("messages", {"messages": CODEACT}) == CODEACT
    steps = [("human", "Q"), ("gpt", "call"), ("observation", "O"), ("gpt", "A")]
    for tool_name in ("observation", "function"):
        rows = [{"from": tool_name if f == "observation" else f, "value": v} for f, v in steps]
        assert normalize_row("sharegpt", {"conversations": rows}) == [
            msg("user", "Q"),
            msg("assistant", "call"),
            msg("tool", "O"),
            msg("assistant", "A"),
        ]
    sharegpt = {
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "Q"},
            {"from": "gpt", "value": "A"},
        ]
    }
    assert normalize_row("sharegpt", sharegpt) == [
        msg("system", "S"),
        msg("user", "Q"),
        msg("assistant", "A"),
    ]
    orca = {"system_prompt": "", "question": "Q", "response": "A"}
    assert normalize_row("openorca", orca) == [msg("user", "Q"), msg("assistant", "A")]
    orca["system_prompt"] = "You are an AI assistant."
    assert normalize_row("openorca", orca)[0] == msg("system", "You are an AI assistant.")
    alpaca = {"instruction": "Add.", "input": "1 2", "output": "3"}
    assert normalize_row("alpaca", alpaca) == [msg("user", "Add.\n\n1 2"), msg("assistant", "3")]
    evol = {"instruction": "Write a loop.", "output": "for i in x: pass"}
    assert normalize_row("alpaca", evol) == [
        msg("user", "Write a loop."),
        msg("assistant", "for i in x: pass"),
    ]


@pytest.mark.parametrize(
    "schema, row, reason",
    [
        ("sharegpt", {"conversations": [{"from": "bing", "value": "x"}]}, UNKNOWN_ROLE),
        ("sharegpt", {"conversations": "text"}, MISSING_FIELD),
        ("sharegpt", {"conversations": [{"from": "human"}]}, MISSING_FIELD),
        ("openorca", {"question": "Q", "response": ""}, EMPTY_ASSISTANT),
        ("openorca", {"system_prompt": "S", "response": "A"}, MISSING_FIELD),
        ("alpaca", {"instruction": "I", "output": None}, MISSING_FIELD),
        ("alpaca", {"instruction": "I", "input": 3, "output": "o"}, MISSING_FIELD),
        ("messages", {"messages": [msg("user", "q"), {"role": "assistant"}]}, MISSING_FIELD),
    ],
)
def test_normalize_row_drops(schema, row, reason):
    with pytest.raises(ChatDrop) as e:
        normalize_row(schema, row)
    assert e.value.reason == reason


def test_messages_jsonl_bad_rows_dropped_by_reason_neighbours_kept(tmp_path):
    rows: list = [r for r, _ in MESSAGES_ROWS]
    rows[3:3] = ["{oops", "[1, 2]"]  # malformed lines 4 and 5: errors with file and line
    write_rows(tmp_path / "m.jsonl", rows)
    docs, stats, errors = read_chat(tmp_path, schema="messages", paths=[str(tmp_path / "m.jsonl")])
    assert [d.id for d in docs] == ["c/m1", "c/m.jsonl:10"]
    assert docs[0].text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nYo<|im_end|>\n"
    )
    assert docs[0].metadata == {
        "source": "c",
        "source_index": 0,
        "domain": "chat",
        "path": "m.jsonl",
        "path_is_container": True,  # the row has no file name of its own
        MESSAGES_KEY: SYSTEM_HI,
        INPUT_FILE: str(tmp_path / "m.jsonl"),  # where it was read (provenance)
        INPUT_LINE: 1,
    }
    assert docs[1].metadata[INPUT_LINE] == 10
    assert spans_text(docs[0]) == ["Yo<|im_end|>"]
    assert docs[1].text == RENDERED and render_chatml(docs[1].metadata[MESSAGES_KEY])[1] == [
        [91, 107],
        [162, 173],
    ]
    assert [(e["file"].endswith("m.jsonl"), e["kind"], e["line"]) for e in errors] == [
        (True, "invalid_json", 4),
        (True, "invalid_json", 5),
    ]
    assert stats["error_invalid_json:c"] == 2
    assert drops(stats) == MESSAGES_DROPS
    assert stats["read:c"] == len(docs) + sum(drops(stats).values()) == 8


@pytest.mark.parametrize(
    "kind, name", [("gz", "m.jsonl.gz"), ("zst", "m.jsonl.zst"), ("parquet", "m.parquet")]
)
def test_messages_gzip_and_parquet_read_the_same(tmp_path, kind, name):
    write_rows(tmp_path / name, [r for r, _ in MESSAGES_ROWS], kind)
    docs, stats, errors = read_chat(tmp_path, schema="messages", paths=[str(tmp_path / name)])
    assert [d.id for d in docs] == ["c/m1", f"c/{name}:8"] and not errors
    assert docs[1].text == RENDERED and spans_text(docs[1]) == ["Hello!<|im_end|>", "4<|im_end|>"]
    assert drops(stats) == MESSAGES_DROPS and stats["read:c"] == 8


def test_sharegpt_openorca_alpaca_files(tmp_path):
    share = [
        {
            "id": "s1",
            "conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}],
        },
        {
            "id": "s2",
            "conversations": [{"from": "human", "value": "Q"}, {"from": "bard", "value": "A"}],
        },
        {
            "id": "s3",
            "conversations": [
                {"from": "human", "value": "Q"},
                {"from": "gpt", "value": "run"},
                {"from": "observation", "value": "out"},
                {"from": "gpt", "value": "A"},
            ],
        },
    ]
    write_rows(tmp_path / "s.jsonl", share)
    docs, stats, _ = read_chat(tmp_path, schema="sharegpt", paths=[str(tmp_path / "s.jsonl")])
    assert [(d.id, d.text) for d in docs] == [
        ("c/s1", "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"),
        (
            "c/s3",
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nrun<|im_end|>\n"
            "<|im_start|>tool\nout<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n",
        ),
    ]
    assert spans_text(docs[0]) == ["A<|im_end|>"] and drops(stats) == {UNKNOWN_ROLE: 1}
    assert spans_text(docs[1]) == ["run<|im_end|>", "A<|im_end|>"]  # never the tool's output

    orca = [
        {"id": "niv.1", "system_prompt": "You are an AI.", "question": "Q", "response": "A"},
        {"id": "niv.2", "system_prompt": "", "question": "Q", "response": ""},
    ]
    write_rows(tmp_path / "o.parquet", orca, "parquet")
    docs, stats, _ = read_chat(tmp_path, schema="openorca", paths=[str(tmp_path / "o.parquet")])
    assert [d.id for d in docs] == ["c/niv.1"] and drops(stats) == {EMPTY_ASSISTANT: 1}
    assert turns_text(docs[0]) == [
        "<|im_start|>system\nYou are an AI.<|im_end|>\n",
        "<|im_start|>user\nQ<|im_end|>\n",
        "<|im_start|>assistant\nA<|im_end|>\n",
    ]

    alpaca = [{"instruction": "Add.", "input": "1 2", "output": "3"}, {"instruction": "I"}]
    write_rows(tmp_path / "a.jsonl.gz", alpaca, "gz")
    docs, stats, _ = read_chat(
        tmp_path, schema="alpaca", domain="code", paths=[str(tmp_path / "a.jsonl.gz")]
    )
    assert [(d.id, d.metadata["domain"]) for d in docs] == [("c/a.jsonl.gz:1", "code")]
    assert docs[0].text == (
        "<|im_start|>user\nAdd.\n\n1 2<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
    )
    assert spans_text(docs[0]) == ["3<|im_end|>"] and drops(stats) == {MISSING_FIELD: 1}


def oasst(mid, parent, role, text, rank=None, lang="en", state="ready_for_export", deleted=False):
    return {
        "message_id": mid,
        "parent_id": parent,
        "role": role,
        "text": text,
        "rank": rank,
        "lang": lang,
        "tree_state": state,
        "deleted": deleted,
        "review_count": 3,
    }


# Replies come before their roots: trees are grouped over the whole file.
OASST_ROWS = [
    oasst("b3", "b2", "assistant", "Sure.", 0),
    oasst("a1", "a0", "assistant", "A1", 0),
    oasst("a2", "a0", "assistant", "A1 ranked second", 1),
    oasst("a3", "a1", "prompter", "Q2", 0),  # no kept reply: cut back to a1
    oasst("a4", "a3", "assistant", "deleted reply", 0, deleted=True),
    oasst("a0", None, "prompter", "Q1"),
    oasst("b0", None, "prompter", "Hi"),
    oasst("b1", "b0", "assistant", "Hello", 0),
    oasst("b2", "b1", "prompter", "More?", 0),
    oasst("c0", None, "prompter", "Hallo", lang="de"),
    oasst("c1", "c0", "assistant", "Hallo!", 0, lang="de"),
    oasst("d0", None, "prompter", "Q", state="growing"),
    oasst("d1", "d0", "assistant", "A", 0, state="growing"),
    oasst("e0", None, "prompter", "Q", deleted=True),
    oasst("e1", "e0", "assistant", "A", 0),
    oasst("f0", None, "prompter", "unanswered"),
    oasst(None, None, "prompter", "no id"),
]


def test_oasst1_tree_walk():
    roots, replies = group_oasst1(OASST_ROWS)
    assert [r["message_id"] for r in roots] == ["a0", "b0", "c0", "d0", "e0", "f0", None]
    assert oasst1_messages(roots[0], replies) == [msg("user", "Q1"), msg("assistant", "A1")]
    assert oasst1_messages(roots[1], replies) == [
        msg("user", "Hi"),
        msg("assistant", "Hello"),
        msg("user", "More?"),
        msg("assistant", "Sure."),
    ]
    assert oasst1_messages(roots[2], replies)[1] == msg("assistant", "Hallo!")
    for root, reason in zip(
        roots[2:],
        ["language", TREE_NOT_READY, DELETED, ENDS_ON_USER, MISSING_FIELD],
        strict=True,
    ):
        with pytest.raises(ChatDrop) as e:
            oasst1_messages(root, replies, {"en"})
        assert e.value.reason == reason
    loop = [oasst("x0", None, "prompter", "q"), oasst("x1", "x0", "assistant", "a", 0)]
    loop.append(oasst("x1", "x1", "prompter", "again", 0))  # a repeated id must not loop
    roots, replies = group_oasst1(loop)
    assert oasst1_messages(roots[0], replies) == [msg("user", "q"), msg("assistant", "a")]


@pytest.mark.parametrize("kind, name", [("jsonl", "o.jsonl"), ("parquet", "o.parquet")])
def test_oasst1_file(tmp_path, kind, name):
    write_rows(tmp_path / name, OASST_ROWS, kind)
    docs, stats, errors = read_chat(
        tmp_path, schema="oasst1", languages=["en"], paths=[str(tmp_path / name)]
    )
    assert [d.id for d in docs] == ["c/a0", "c/b0"] and not errors
    assert docs[1].text == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nMore?<|im_end|>\n<|im_start|>assistant\nSure.<|im_end|>\n"
    )
    assert spans_text(docs[1]) == ["Hello<|im_end|>", "Sure.<|im_end|>"]
    assert docs[1].metadata["language"] == "en" and docs[1].metadata["domain"] == "chat"
    assert drops(stats) == {
        "language": 1,
        TREE_NOT_READY: 1,
        DELETED: 1,
        ENDS_ON_USER: 1,
        MISSING_FIELD: 1,
    }
    assert stats["read:c"] == len(docs) + sum(drops(stats).values()) == 7


def test_oasst1_trees_split_over_files_count_every_row(tmp_path):
    # Rows moved to a second file: b0's replies b1 -> b2 -> b3, a1's reply a3 (and a4 under
    # it), and a loop of two rows that are each other's parents (a tree with no root).
    moved = {"b1", "b2", "b3", "a3", "a4"}
    first = [r for r in OASST_ROWS if r["message_id"] not in moved]
    second = [r for r in OASST_ROWS if r["message_id"] in moved]
    second += [oasst("y1", "y2", "prompter", "q", 0), oasst("y2", "y1", "assistant", "a", 0)]
    write_rows(tmp_path / "o1.jsonl", first)
    write_rows(tmp_path / "o2.parquet", second, "parquet")
    docs, stats, errors = read_chat(
        tmp_path, schema="oasst1", languages=["en"], paths=[str(tmp_path)]
    )
    assert [d.id for d in docs] == ["c/a0"] and not errors
    assert drops(stats) == {
        "language": 1,
        TREE_NOT_READY: 1,
        DELETED: 1,
        ENDS_ON_USER: 2,  # f0, and b0 without its replies
        MISSING_FIELD: 1,
        orphan_reason("o2.parquet"): 3,
    }
    assert stats["read:c"] == len(docs) + sum(drops(stats).values()) == 10
    roots, replies = group_oasst1(second)
    tops = oasst1_orphans(second, replies)
    assert not roots and [r["message_id"] for r in tops] == ["a3", "b1", "y1"]


def test_chat_file_errors_are_logged_like_jsonl(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"messages": []}\n' * 50)[:-12])
    write_rows(tmp_path / "other.parquet", [{"text": "not a chat"}] * 3, "parquet")
    docs, stats, errors = read_chat(tmp_path, schema="messages", paths=[str(tmp_path)])
    assert not docs and drops(stats) == {NO_TURNS: stats["read:c"] - 3, MISSING_FIELD: 3}
    assert sorted((Path(e["file"]).name, e["kind"]) for e in errors) == [
        ("bad.parquet", "corrupt_file"),
        ("cut.jsonl.gz", "corrupt_file"),
    ]


def test_chat_recipe_fields_and_errors(tmp_path):
    data = write_rows(tmp_path / "d.jsonl", [{"messages": SYSTEM_HI}])
    r = recipe_from_dict(chat_recipe(tmp_path, schema="oasst1", paths=[str(data)]))
    assert (r.sources[0].format, r.sources[0].schema, r.sources[0].domain) == (
        "chat",
        "oasst1",
        "chat",
    )
    assert r.to_dict()["sources"][0]["schema"] == "oasst1"
    for source, message in [
        (
            {},
            "recipe: sources[0].schema is required for format chat: one of messages, sharegpt, "
            "oasst1, openorca, alpaca",
        ),
        (
            {"schema": "vicuna"},
            "recipe: sources[0].schema 'vicuna' is not one of messages, sharegpt, oasst1, "
            "openorca, alpaca",
        ),
        (
            {"schema": "messages", "format": "jsonl", "domain": "chat"},
            "recipe: sources[0].schema is only for format chat, not 'jsonl'",
        ),
        ({"schema": "messages", "format": "jsonl"}, "recipe: missing key 'sources[0].domain'"),
    ]:
        with pytest.raises(RecipeError) as e:
            recipe_from_dict(chat_recipe(tmp_path, paths=[str(data)], **source))
        assert str(e.value) == message
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(chat_recipe(tmp_path, schema="sharegpt", paths=[str(data)])))
    assert load_recipe(path, ["sources.0.schema=alpaca"]).sources[0].schema == "alpaca"


def test_chat_demo_is_real_deterministic_and_read_without_drops(tmp_path):
    out = tmp_path / "demo.jsonl"
    n = write_chat_demo(out)
    assert n == len(out.read_text().splitlines()) > 2000  # a few thousand conversations
    cli = tmp_path / "cli.jsonl"
    subprocess.run([sys.executable, "-m", "lemur.data.chat_demo", str(cli)], check=True)
    assert cli.read_bytes() == out.read_bytes()  # seeded: the same file from a fresh process

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {tuple(r) for r in rows} == {("id", "messages")}
    assert len({r["id"] for r in rows}) == n
    assert sum(r["messages"][0]["role"] == "system" for r in rows) > n // 5
    assert sum(len(r["messages"]) >= 4 for r in rows) > n // 20  # multi-turn ones
    docs, stats, errors = read_chat(tmp_path, schema="messages", paths=[str(out)])
    assert len(docs) == n == stats["read:c"] and not errors and drops(stats) == {}

    every = conversations(limit=10**6)
    answers = {
        m[i]["content"]: m[i + 1]["content"]
        for m in (r["messages"] for r in every)
        for i in range(len(m) - 1)
        if m[i]["role"] == "user"
    }
    dumps = [a for q, a in answers.items() if "`json.dumps`" in q]
    assert len(dumps) == 1 and dumps[0].endswith(inspect.getdoc(json.dumps))
    assert dumps[0].startswith("`json.dumps(obj, *, skipkeys=False")
    from pydoc_data.topics import topics

    with_stmt = [a for q, a in answers.items() if "the `with` statement in Python" in q]
    assert len(with_stmt) == 1 and with_stmt[0] in topics["with"]
    assert with_stmt[0].startswith('The "with" statement is used to wrap')


def test_a_lone_surrogate_in_a_conversation_is_repaired_and_counted_when_kept(tmp_path):
    """A chat line escaping half a UTF-16 pair is read with U+FFFD (as a text line is) and
    counted `repaired` when it makes a conversation; one dropped is counted as dropped only."""
    good = r'{"messages": [{"role": "user", "content": "hi \ud800"}, ' + (
        r'{"role": "assistant", "content": "ok \udfff"}]}'
    )
    dropped = r'{"messages": [{"role": "user", "content": "only a question \ud800"}]}'
    path = write_rows(tmp_path / "c.jsonl", [good, dropped])
    docs, stats, errors = read_chat(tmp_path, paths=[str(path)], schema="messages")
    assert len(docs) == 1 and "hi \ufffd" in docs[0].text and "ok \ufffd" in docs[0].text
    assert stats["repaired:c:lone_surrogate"] == 1 and drops(stats) == {ENDS_ON_USER: 1}
    assert errors == []

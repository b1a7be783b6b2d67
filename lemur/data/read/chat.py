"""Chat data: the dataset schemas normalized to messages (rendered by lemur/chatml.py).

Every chat schema (a conversation per row: `ROW_SCHEMAS`; oasst1's message trees:
`oasst1_messages`) becomes a list of `{"role": "system|user|assistant|tool", "content": str}`
messages, checked by `check_messages`. The chat reader keeps them as they are in a
document's metadata (MESSAGES_KEY), for the tokenize stage to render once in the model's
format (lemur/data/encode/chat.py); the document's text is `render_chatml`'s
`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, what the tagger and filters read
and, for a ChatML model, also what it is trained on. The loss is taken on each assistant
message's content and its `<|im_end|>` (not on the role header, not on the newline after
the marker). `tool` is an observation (execution output in a CodeAct-style trajectory:
assistant code, its output, the assistant again): rendered like a user turn and, like it,
never trained on. Content may spell anything: only a model whose own markers ChatML's are
refuses a conversation holding them (`marker_in_content`: the ChatML build; a template
build checks the model's own control tokens), since to another model they are plain text.
This module has no I/O: `chat_reader` reads the files.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lemur.chatml import IM_END, IM_START

ROLES = ("system", "user", "assistant", "tool")

Message = dict[str, str]
# Where the chat reader leaves a conversation's checked messages in its document's metadata.
MESSAGES_KEY = "messages"


class ChatDrop(ValueError):
    """A conversation that cannot be trained on; `reason` is its drop reason (a stat label)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


# Drop reasons, counted as `dropped:<source>:chat:<reason>` (read = kept + dropped).
MISSING_FIELD = "chat:missing_field"
UNKNOWN_ROLE = "chat:unknown_role"
NOT_ALTERNATING = "chat:not_alternating"
EMPTY_ASSISTANT = "chat:empty_assistant"
ENDS_ON_USER = "chat:ends_on_user"
NO_TURNS = "chat:no_turns"
MARKER_IN_CONTENT = "chat:marker_in_content"  # ChatML builds: content forging a turn


def marker_in_content(messages: list[Message]) -> bool:
    """Whether a message's content holds a ChatML marker (it would forge a turn once the
    markers are a model's own pieces)."""
    return any(IM_START in m["content"] or IM_END in m["content"] for m in messages)


def check_messages(messages: list[Message]) -> list[Message]:
    """`messages` if they can be trained on, else `ChatDrop` with the reason.

    Accepted: an optional single leading system message, then input turns (user, or tool:
    an observation) and assistant turns alternating, starting with the user and ending
    with a non-empty assistant reply. Content may spell anything: which text would forge a
    turn depends on the model, and the build's tokenize stage checks it.
    """
    turns = messages[1:] if messages and messages[0]["role"] == "system" else messages
    if not turns:
        raise ChatDrop(NO_TURNS)
    for m in messages:
        if m["role"] not in ROLES:
            raise ChatDrop(UNKNOWN_ROLE, f"role {m['role']!r}")
    for i, m in enumerate(turns):
        expected = ("user",) if i == 0 else ("user", "tool") if i % 2 == 0 else ("assistant",)
        if m["role"] not in expected:
            raise ChatDrop(NOT_ALTERNATING, f"turn {i} is {m['role']!r}")
        if m["role"] == "assistant" and not m["content"].strip():
            raise ChatDrop(EMPTY_ASSISTANT)
    if turns[-1]["role"] != "assistant":
        raise ChatDrop(ENDS_ON_USER)
    return messages


def _field(row: dict[str, Any], key: str, optional: bool = False) -> str:
    """A string field of a row; missing (None) is '' when optional, else a drop."""
    value = row.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise ChatDrop(MISSING_FIELD, f"no string field {key!r}")
    return value


def _list(row: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = row.get(key)
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ChatDrop(MISSING_FIELD, f"no list of objects {key!r}")
    return value


def from_messages(row: dict[str, Any]) -> list[Message]:
    """`{"messages": [{"role", "content"}]}` (OpenAI / Hugging Face chat format)."""
    return [
        {"role": _field(m, "role"), "content": _field(m, "content")} for m in _list(row, "messages")
    ]


# `observation` (LLaMA-Factory's ShareGPT) and `function` (a function's result) are tool turns.
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "observation": "tool",
    "function": "tool",
}


def from_sharegpt(row: dict[str, Any]) -> list[Message]:
    """ShareGPT: `{"conversations": [{"from", "value"}]}`, `from` one of SHAREGPT_ROLES."""
    out = []
    for m in _list(row, "conversations"):
        speaker = _field(m, "from")
        if speaker not in SHAREGPT_ROLES:
            raise ChatDrop(UNKNOWN_ROLE, f"'from' {speaker!r}")
        out.append({"role": SHAREGPT_ROLES[speaker], "content": _field(m, "value")})
    return out


def from_openorca(row: dict[str, Any]) -> list[Message]:
    """OpenOrca: `system_prompt` (may be empty: no system message), `question`, `response`."""
    system = _field(row, "system_prompt", optional=True)
    head = [{"role": "system", "content": system}] if system.strip() else []
    return head + [
        {"role": "user", "content": _field(row, "question")},
        {"role": "assistant", "content": _field(row, "response")},
    ]


def from_alpaca(row: dict[str, Any]) -> list[Message]:
    """Alpaca / Evol-CodeAlpaca: `instruction`, optional `input` (appended), `output`."""
    prompt = _field(row, "instruction")
    extra = _field(row, "input", optional=True)
    if extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": _field(row, "output")},
    ]


# Schemas whose rows are whole conversations; `oasst1` (a message table) is in `oasst`.
ROW_SCHEMAS: dict[str, Callable[[dict[str, Any]], list[Message]]] = {
    "messages": from_messages,
    "sharegpt": from_sharegpt,
    "openorca": from_openorca,
    "alpaca": from_alpaca,
}


def normalize_row(schema: str, row: dict[str, Any]) -> list[Message]:
    """The checked messages of one row of a row schema, or `ChatDrop`."""
    return check_messages(ROW_SCHEMAS[schema](row))


# OpenAssistant oasst1: a table of messages; each tree's root has `parent_id` null.
OASST_COLUMNS = ("message_id", "parent_id", "role", "text", "rank", "deleted", "lang", "tree_state")
OASST_ROLES = {"prompter": "user", "assistant": "assistant"}
READY = "ready_for_export"
TREE_NOT_READY = "chat:tree_not_ready"
DELETED = "chat:deleted"
LANGUAGE = "language"  # the reason `languages:` drops have in every source
ORPHAN = "chat:orphan"  # `chat:orphan:<file>`: replies whose tree has no root in that file


def group_oasst1(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list]]:
    """The roots (`parent_id` null) and each message's replies, in file order."""
    roots: list[dict[str, Any]] = []
    replies: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        parent = row.get("parent_id")
        if parent is None:
            roots.append(row)
        else:
            replies.setdefault(str(parent), []).append(row)
    return roots, replies


def orphan_reason(path: str) -> str:
    """The drop reason of a group of replies whose tree's root is not in file `path`."""
    return f"{ORPHAN}:{path}"


def oasst1_orphans(rows: list[dict[str, Any]], replies: dict[str, list]) -> list[dict[str, Any]]:
    """The first row of each group of rows that no root of the file reaches.

    A group is a reply whose parent is not in the file (its tree's root is in another file)
    with its replies in the file, or a loop of rows that are each other's parents. With the
    trees of the roots, every row of the file is in exactly one tree or group.
    """
    ids = {str(row.get("message_id")) for row in rows if row.get("message_id") is not None}
    seen: set[int] = set()

    def reach(top: dict[str, Any]) -> None:
        stack = [top]
        while stack:
            row = stack.pop()
            if id(row) not in seen:
                seen.add(id(row))
                if row.get("message_id") is not None:
                    stack += replies.get(str(row["message_id"]), ())

    for row in rows:
        if row.get("parent_id") is None:
            reach(row)
    tops = [r for r in rows if r.get("parent_id") is not None and str(r["parent_id"]) not in ids]
    for row in tops:
        reach(row)
    for row in rows:  # what is left hangs from a loop: each loop is one group
        if id(row) not in seen:
            tops.append(row)
            reach(row)
    return tops


def _best_reply(message: dict[str, Any], replies: dict[str, list]) -> dict[str, Any] | None:
    """The first reply ranked 0 that was not deleted (roots have no rank)."""
    for reply in replies.get(str(message.get("message_id")), ()):
        rank = reply.get("rank")
        if not reply.get("deleted") and rank == 0 and not isinstance(rank, bool):
            return reply
    return None


def oasst1_messages(
    root: dict[str, Any], replies: dict[str, list], languages: set[str] | None = None
) -> list[Message]:
    """The conversation of one oasst1 tree: the root, then each rank-0 reply, or `ChatDrop`.

    Only trees in state `ready_for_export` are kept. A path that ends on a prompter
    message (no ranked assistant reply to it) is cut back to its last assistant reply.
    """
    if not isinstance(root.get("message_id"), str):
        raise ChatDrop(MISSING_FIELD, "no string field 'message_id'")
    if root.get("tree_state") != READY:
        raise ChatDrop(TREE_NOT_READY)
    if root.get("deleted"):
        raise ChatDrop(DELETED)
    if languages is not None and root.get("lang") not in languages:
        raise ChatDrop(LANGUAGE)
    path, seen = [root], {root["message_id"]}
    while (reply := _best_reply(path[-1], replies)) is not None:
        if reply.get("message_id") in seen:  # a repeated id would loop forever
            break
        seen.add(reply.get("message_id"))
        path.append(reply)
    messages = []
    for m in path:
        role = _field(m, "role")
        if role not in OASST_ROLES:
            raise ChatDrop(UNKNOWN_ROLE, f"role {role!r}")
        messages.append({"role": OASST_ROLES[role], "content": _field(m, "text")})
    while len(messages) > 1 and messages[-1]["role"] == "user":
        messages.pop()
    return check_messages(messages)

"""Where a rendered conversation's added tokens and message contents are, in characters.

`AddedTokens` splits text at the tokenizer's added tokens as `tokenizers` does with
added-token parsing on (leftmost-longest, `lstrip`/`rstrip` taking the whitespace beside
a token), and knows which of them are control tokens. `content_spans` finds the marked
messages' contents in the rendered text from a second render with those contents replaced
by markers (every message's, or only the assistant ones' when the template does not render
another turn's content as is); `loss_spans` turns the assistant ones into the character
ranges the loss is taken on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from lemur.tokenizer import TokenizerError

# Drop reasons of a template-rendered conversation (counted as `dropped:<source>:<reason>`).
CONTROL_TEXT = "chat:control_in_content"  # content spells a control token
TEMPLATE_ERROR = "chat:template_error"  # the template raised (e.g. raise_exception)
TEMPLATE_CONTENT = "chat:template_content"  # an assistant content not rendered once as is
MARK, MARK_END = "\U000f0000", "\U000f0001"  # private-use: the content markers
_MARKED = re.compile(f"{MARK}(\\d+){MARK_END}")


class TemplateDrop(ValueError):
    """A conversation the template cannot give training data for; `reason` says why."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


def marker(i: int) -> str:
    """The stand-in for message `i`'s content in the marked render."""
    return f"{MARK}{i}{MARK_END}"


def holds_marker(text: str) -> bool:
    """Whether `text` holds a character of the markers (it could pass for one)."""
    return MARK in text or MARK_END in text


class AddedTokens:
    """The added tokens of a tokenizer.json: where they are in a text, which are control."""

    def __init__(self, files: Any, literal: str) -> None:
        tokens = files.data.get("added_tokens", [])
        bad = [t["content"] for t in tokens if t.get("single_word")]
        if bad:
            raise TokenizerError(
                f"{files.path}: single_word added tokens ({bad[0]!r}) are not supported"
            )
        self.ids = {t["content"]: int(t["id"]) for t in tokens}
        # transformers' control tokens (`_get_control_tokens`): the special added tokens and
        # those the template's literal text holds, except whitespace ones.
        control = [
            t["content"]
            for t in tokens
            if t.get("special") or (t["content"] in literal and not t["content"].isspace())
        ]
        self.control_ids = {self.ids[c] for c in control}
        self._control = _alternation(control)
        # One alternation of plain literals, longest first (named groups per token make
        # Python's regex 3,000x slower on Llama-3's 256 specials); a match names its token
        # by its text, less the whitespace an lstrip/rstrip token takes beside it.
        order = sorted(tokens, key=lambda t: -len(t["content"]))
        parts = [
            (r"\s*" if t.get("lstrip") else "")
            + re.escape(t["content"])
            + (r"\s*" if t.get("rstrip") else "")
            for t in order
        ]
        self._split = re.compile("|".join(parts)) if parts else None

    def _id(self, text: str) -> int:
        for core in (text, text.lstrip(), text.rstrip(), text.strip()):
            if core in self.ids:
                return self.ids[core]
        raise AssertionError(f"no added token in {text!r}")  # the regex only matches tokens

    def find(self, text: str) -> list[tuple[int, int, int]]:
        """(start, end, id) of each added token in `text`, whitespace it strips included."""
        if self._split is None:
            return []
        return [(m.start(), m.end(), self._id(m.group())) for m in self._split.finditer(text)]

    def control_in(self, text: str) -> bool:
        """Whether `text` spells a control token."""
        return self._control is not None and self._control.search(text) is not None

    def is_control_id(self, token: int) -> bool:
        """Whether `token` is a control token's id."""
        return token in self.control_ids


def _alternation(texts: list[str]) -> re.Pattern[str] | None:
    """A regex matching any of `texts`, longest first; None for none."""
    texts = sorted(set(texts), key=lambda t: (-len(t), t))
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def content_spans(
    messages: Sequence[Mapping[str, str]], text: str, marked: str
) -> list[list[tuple[int, int]]]:
    """Each marked message's content occurrences `[start, end)` in `text`, the render.

    `marked` is the render with message i's content replaced by `marker(i)` (for every
    message, or some: the others' contents are in it as rendered): `text` must be `marked`
    with every marker replaced by its content as is, stripped, lstripped or rstripped
    (Jinja's `trim` is `strip`), else TemplateDrop TEMPLATE_CONTENT. An assistant content
    must occur exactly once; an unmarked message has no occurrences.
    """
    parts = _MARKED.split(marked)  # [chunk, index, chunk, index, ..., chunk]
    spans: list[list[tuple[int, int]]] = [[] for _ in messages]
    pos = 0
    for k in range(0, len(parts) - 1, 2):
        chunk, i, after = parts[k], int(parts[k + 1]), parts[k + 2]
        if i >= len(messages) or not text.startswith(chunk, pos):
            raise TemplateDrop(TEMPLATE_CONTENT)
        pos += len(chunk)
        c = str(messages[i].get("content", ""))
        for shown in dict.fromkeys((c, c.strip(), c.lstrip(), c.rstrip())):
            if text.startswith(shown, pos) and text.startswith(after, pos + len(shown)):
                break
        else:
            raise TemplateDrop(TEMPLATE_CONTENT)
        spans[i].append((pos, pos + len(shown)))
        pos += len(shown)
    if text[pos:] != parts[-1]:
        raise TemplateDrop(TEMPLATE_CONTENT)
    for m, found in zip(messages, spans, strict=True):
        if m.get("role") == "assistant" and len(found) != 1:
            raise TemplateDrop(TEMPLATE_CONTENT)
    return spans


def loss_spans(
    spans: list[list[tuple[int, int]]],
    control: list[tuple[int, int]],
    messages: Sequence[Mapping[str, str]],
) -> list[tuple[int, int]]:
    """The char ranges the loss is taken on: each assistant content, through the end of
    the first control token after it (its end of turn).

    A control token overlapping any content (one the template's text and the content's
    edge spell together) drops the conversation (CONTROL_TEXT).
    """
    for found in spans:
        for s, e in found:
            if any(cs < e and ce > s for cs, ce in control):
                raise TemplateDrop(CONTROL_TEXT)
    out = []
    for m, found in zip(messages, spans, strict=True):
        if m.get("role") == "assistant":
            s, e = found[0]
            end = next((ce for cs, ce in control if cs >= e), e)
            out.append((s, end))
    return sorted(out)

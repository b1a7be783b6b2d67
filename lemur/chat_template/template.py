"""A `tokenizer.json` model's own chat template, rendered and encoded as transformers does.

`apply_chat_template(messages, tokenize=True)` renders the folder's Jinja template (in
transformers' sandbox, `env.py`) with the named special tokens as variables, then
encodes the string with added-token parsing on and `add_special_tokens=False`: every added
token the rendered text spells (`<|im_start|>`, `<|eot_id|>`, the template's `bos_token`)
becomes its id, and each run of text between them is encoded alone. `ChatTemplate` does
the same with lemur's own engine for the runs (tiktoken where exact, special parsing off),
so the ids are transformers' without importing it.

For training (`encode`), content must never become a control token: a conversation whose
content spells one (transformers' definition: a special added token, or an added token
the template's literal text holds) is dropped (`CONTROL_TEXT`). Each message's content is
located in the rendered text by rendering the conversation a second time with the
contents replaced by unique markers (`spans.py`), which works whatever the template does
around them, and the loss is taken on every token overlapping an assistant content or the
text after it up to and including the first control token (its end of turn:
`<|eot_id|>` for Llama-3, `<|im_end|>` for ChatML). A turn that is not trained on need
not be rendered as is (Llama-3.1 writes a tool output as `content | tojson`): then only
the assistant contents are marked, the other contents stay in the second render as the
template writes them, and the ids are still those of the real render.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from lemur.chat_template.env import compile_template, literal_text
from lemur.chat_template.spans import (
    CONTROL_TEXT,
    TEMPLATE_CONTENT,
    TEMPLATE_ERROR,
    AddedTokens,
    TemplateDrop,
    content_spans,
    holds_marker,
    loss_spans,
    marker,
)
from lemur.tokenizer import ByteLevelTokenizer, TokenizerError
from lemur.tokenizer.bytelevel import clean_text

Message = Mapping[str, str]
# transformers' `special_tokens_map`: the named special tokens a template sees.
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
TEMPLATE_FILE = "chat_template.jinja"  # transformers >= 4.50 saves the template here
PROBE = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": " Hi,\n  what is 2 + 2?  "},
    {"role": "assistant", "content": "It is 4 — «vier».\n\n```py\nprint(2 + 2)\n```"},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]


def template_source(files: Any) -> str | None:
    """The folder's chat template: `chat_template.jinja` (which transformers prefers),
    else the `chat_template` of tokenizer_config.json."""
    beside = Path(files.path).parent / TEMPLATE_FILE
    if beside.is_file():
        return beside.read_text(encoding="utf-8")
    return files.chat_template


def template_variables(config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens the config sets (a null one is left out, as transformers
    does: the template then sees it undefined, not the string "None")."""
    out = {}
    for name in NAMED_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


@dataclass
class TemplateChat:
    """One conversation as the template renders it: its text, ids and loss mask."""

    text: str
    ids: np.ndarray  # int64
    mask: np.ndarray  # uint8, 1 where the loss is taken


class ChatTemplate:
    """A tokenizer.json folder's chat template with transformers' rendering and encoding."""

    def __init__(self, tok: ByteLevelTokenizer, clock: Callable[[], datetime] | None = None):
        source = template_source(tok.files)
        if not source:
            raise TokenizerError(
                f"{tok.files.path.parent}: no chat template (tokenizer_config.json "
                f"`chat_template` or {TEMPLATE_FILE})"
            )
        self.tok = tok
        self.template = compile_template(source, clock or datetime.now, str(tok.files.path))
        self.variables = template_variables(tok.files.config)
        self.added = AddedTokens(tok.files, literal_text(self.template, source))
        self._lengths = tok.token_bytes().tolist()
        norm = tok.files.data.get("normalizer") or {}
        self._nfc = norm.get("type") == "NFC"

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
        """The template's text of a conversation (TemplateDrop TEMPLATE_ERROR if it fails)."""
        plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self.template.render(
                messages=plain,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.variables,
            )
        except Exception as e:  # noqa: BLE001 - a template may raise anything on odd input
            raise TemplateDrop(TEMPLATE_ERROR, f"chat template failed: {e}") from None

    def encode_text(
        self, text: str, found: list[tuple[int, int, int]] | None = None
    ) -> tuple[list[int], np.ndarray]:
        """Ids of rendered text as transformers encodes it (added tokens parsed), and each
        token's UTF-8 byte range `[begin, end)` in `text` ((tokens, 2) int64). `found`:
        the added tokens of `text` (`AddedTokens.find`), if known."""
        # Plain lists: a conversation's runs are short, numpy per run would cost more.
        to_byte = _byte_offsets(text)
        out: tuple[list[int], list[int], list[int]] = ([], [], [])
        at = 0
        found = self.added.find(text) if found is None else found
        for start, end, token_id in [*found, (len(text), len(text), None)]:
            if at < start:
                self._encode_piece(text, at, start, to_byte, out)
            if token_id is not None:
                out[0].append(token_id)
                out[1].append(to_byte[start])
                out[2].append(to_byte[end])
            at = end
        return out[0], np.array(out[1:], np.int64).reshape(2, -1).T

    def _encode_piece(
        self, text: str, at: int, stop: int, to_byte: Any, out: tuple[list[int], ...]
    ) -> None:
        """Append the ids of the run `text[at:stop]` between added tokens, with their byte
        ranges in `text`, to `out` (ids, begins, ends)."""
        piece = text[at:stop]
        ids = self.tok.encode(piece)
        base = to_byte[at]
        if self.tok.engine == "tiktoken" and not (
            self._nfc and not unicodedata.is_normalized("NFC", piece)
        ):
            begins, pos = [], base
            for i in ids:
                begins.append(pos)
                pos += self._lengths[i]
            if pos == to_byte[stop]:  # the tokens' bytes are the run's: offsets from lengths
                out[0].extend(ids)
                out[1].extend(begins)
                out[2].extend(begins[1:] + [pos])
                return
        # The reference's offsets (chars of the original text, through any normalizer).
        encoding = self.tok.reference.encode(clean_text(piece), add_special_tokens=False)
        if list(encoding.ids) != ids:  # the engine's contract: never seen
            raise TokenizerError(f"{self.tok.files.path}: engines disagree on {piece[:40]!r}")
        out[0].extend(ids)
        for s, e in encoding.offsets:
            out[1].append(to_byte[at + s])
            out[2].append(to_byte[at + e])

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """`apply_chat_template(messages, add_generation_prompt=True)`'s ids (a prompt)."""
        return self.encode_text(self.render(messages, add_generation_prompt=True))[0]

    def encode(self, messages: Sequence[Message]) -> TemplateChat:
        """A conversation's text, ids (apply_chat_template's) and loss mask, or TemplateDrop.

        Dropped: content that spells a control token, alone or with the template's text
        beside it (CONTROL_TEXT), a template that fails (TEMPLATE_ERROR) or renders an
        assistant content other than once, as is or stripped (spans.TEMPLATE_CONTENT).
        Other contents may be rendered otherwise (a tool output as JSON).
        """
        if any(self.added.control_in(str(m.get("content", ""))) for m in messages):
            raise TemplateDrop(CONTROL_TEXT)
        text = self.render(messages)
        marked = self.render([{**m, "content": marker(i)} for i, m in enumerate(messages)])
        found = self.added.find(text)
        control = [(s, e) for s, e, i in found if self.added.is_control_id(i)]
        try:
            spans = content_spans(messages, text, marked)
        except TemplateDrop:  # a content not rendered as is: is it only untrained ones?
            own = [i for _, _, i in found if self.added.is_control_id(i)]
            spans = self._trained_spans(messages, text, marked, own)
        ids, ranges = self.encode_text(text, found)
        loss = loss_spans(spans, control, messages)
        to_byte = _byte_offsets(text)
        mask = np.zeros(len(ids), np.uint8)
        for s, e in (
            (to_byte[a], to_byte[b]) for a, b in loss
        ):  # overlap, as return_assistant_tokens_mask does
            mask[(ranges[:, 0] < e) & (ranges[:, 1] > s)] = 1
        return TemplateChat(text, np.asarray(ids, np.int64), mask)

    def _trained_spans(
        self, messages: Sequence[Message], text: str, marked: str, control_ids: list[int]
    ) -> list[list[tuple[int, int]]]:
        """The assistant contents' spans in `text` (none for the other messages) when some
        other content is not rendered as is, or TemplateDrop.

        They come from a render with only the assistant contents marked, the others in it
        as the template writes them (Llama-3.1: a tool output as JSON), so nothing but the
        trained turns has to match. No content may make a control token (each was checked
        alone before): `control_ids`, the real render's control tokens, must be those of
        `marked`, where every content is a marker and every control token the template's.
        """
        if any(holds_marker(str(m.get("content", ""))) for m in messages):
            raise TemplateDrop(TEMPLATE_CONTENT)  # a content could pass for a marker
        trained = self.render(
            [
                {**m, "content": marker(i)} if m.get("role") == "assistant" else m
                for i, m in enumerate(messages)
            ]
        )
        spans = content_spans(messages, text, trained)
        template_own = [i for _, _, i in self.added.find(marked) if self.added.is_control_id(i)]
        if control_ids != template_own:
            raise TemplateDrop(CONTROL_TEXT)
        return spans

    def probe(self) -> list[dict[str, str]]:
        """A plain conversation the template renders: PROBE, or PROBE without its system
        turn (templates without one, e.g. Gemma's, refuse it); TokenizerError if neither."""
        try:
            self.render(PROBE)
            return PROBE
        except TemplateDrop:
            try:
                self.render(PROBE[1:])
                return PROBE[1:]
            except TemplateDrop as e:
                raise TokenizerError(
                    f"{self.tok.files.path}: the chat template fails on a plain conversation: {e}"
                ) from None

    def end_of_turn_id(self) -> int | None:
        """The control token that ends an assistant turn (the first after its content)."""
        chat = self.encode(self.probe())
        last = np.flatnonzero(chat.mask)[-1]
        token = int(chat.ids[last])
        return token if self.added.is_control_id(token) else None

    def stop_ids(self) -> tuple[int, ...]:
        """Ids a reply ends at: the model's stop ids (EOS, generation_config's) and the
        template's end of turn."""
        turn = self.end_of_turn_id()
        return tuple(dict.fromkeys([*self.tok.stop_ids, *([turn] if turn is not None else [])]))

    def check(self) -> None:
        """TokenizerError unless a probe conversation's ids equal the `tokenizers` reference
        with added-token parsing on (what apply_chat_template calls): catches a tokenizer
        whose text runs do not encode alone as they do in place (a Metaspace prefix)."""
        from tokenizers import Tokenizer

        text = self.render(self.probe())
        reference = Tokenizer.from_file(str(self.tok.files.path))
        want = reference.encode(text, add_special_tokens=False).ids
        if self.encode_text(text)[0] != want:
            raise TokenizerError(
                f"{self.tok.files.path}: its chat template's text does not encode here as "
                "transformers encodes it (runs of text between added tokens change when "
                "encoded alone); chat builds with this tokenizer are not supported"
            )


def _byte_offsets(text: str) -> Any:
    """UTF-8 byte offset of every char offset 0..len(text) (a range for ASCII text)."""
    if text.isascii():
        return range(len(text) + 1)
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), "<u4")
    sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    out = np.zeros(len(points) + 1, np.int64)
    np.cumsum(sizes, out=out[1:])
    return out.tolist()

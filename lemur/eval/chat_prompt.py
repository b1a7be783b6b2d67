"""Chat prompts as ids: ChatML for a SentencePiece model, its own chat template for a
tokenizer.json model (`lemur-eval generate --chat`)."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from lemur.chat_template import ChatTemplate
from lemur.chatml import CHAT_PIECES, render_chatml, turn_header
from lemur.cli_common import UserError
from lemur.tokenizer import ByteLevelTokenizer, ChatMLTokenizer, Tokenizer

# A chat prompt: one user turn, or the conversation so far ({"role", "content"} messages).
ChatPrompt = str | Sequence[Mapping[str, str]]


def chat_messages(prompt: ChatPrompt, system: str | None = None) -> list[Mapping[str, str]]:
    """A chat prompt as messages: a user turn, or the conversation so far, after `system`."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    return ([{"role": "system", "content": system}] if system else []) + list(prompt)


def chat_prompt(tokenizer: Tokenizer, prompt: ChatPrompt, system: str | None = None) -> str:
    """ChatML text of `prompt` (a user turn, or messages) ending where the assistant's answer
    starts; refuses a tokenizer without the ChatML pieces."""
    missing = [p for p in CHAT_PIECES if tokenizer.piece_id(p) is None]
    if missing:
        raise UserError(
            f"the tokenizer has no {' / '.join(missing)} piece (--chat needs "
            "a ChatML tokenizer, e.g. one a Lemur-Chat build extended)"
        )
    return render_chatml(chat_messages(prompt, system))[0] + turn_header("assistant")


_templates: weakref.WeakKeyDictionary[Any, ChatTemplate] = weakref.WeakKeyDictionary()


def model_template(tokenizer: Any) -> ChatTemplate | None:
    """A tokenizer.json model's own chat template (compiled once per tokenizer); None for
    a SentencePiece model, whose chat convention is ChatML (lemur/chatml.py)."""
    if not isinstance(tokenizer, ByteLevelTokenizer):
        return None
    if tokenizer not in _templates:
        _templates[tokenizer] = ChatTemplate(tokenizer)
    return _templates[tokenizer]


def chat_prompt_ids(
    tokenizer: Tokenizer, prompt: ChatPrompt, system: str | None = None
) -> list[int]:
    """The ids of a chat prompt, ending where the assistant's answer starts.

    A tokenizer.json model: `apply_chat_template(messages, add_generation_prompt=True)`'s
    ids, by its own template (content spelling a control token becomes it, as there).
    A SentencePiece model: `<s>` + the ids of `chat_prompt`, what the exported tokenizer's
    chat template gives and the start of the build's ids of the conversation.
    """
    template = model_template(tokenizer)
    if template is not None:
        return template.prompt_ids(chat_messages(prompt, system))
    if not isinstance(tokenizer, ChatMLTokenizer):
        raise TypeError(f"{type(tokenizer).__name__}: neither a chat template nor ChatML")
    return [tokenizer.bos_id, *tokenizer.encode_chat(chat_prompt(tokenizer, prompt, system))]

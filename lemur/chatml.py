"""ChatML, text and ids: the one convention of the chat build, `lemur-eval generate --chat`
and the Hugging Face chat template that `lemur-convert to-hf` writes. Its turns are written
here only (`render_chatml`, `turn_header`); the exported template spells them in Jinja.

A conversation is `<s>` + `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message + `</s>`
(a generation prompt ends on `<|im_start|>assistant\\n` instead of `</s>`). Its text is
encoded as transformers' Llama tokenizers (`legacy: false`, what the export writes) encode
what the template renders: the added tokens are split out first, then each run of text
between them is encoded alone, with a dummy-prefix `▁` only before a run at the very start
of the input. A rendered conversation starts with a marker, so it gets no `▁` at all,
whereas SentencePiece puts a lone `▁` before the first `<|im_start|>` of a model with a
dummy prefix (Llama-2's): chat text is encoded by a copy of the model without the dummy
prefix (`chat_processor`). Between markers the two agree: SentencePiece adds no `▁` after a
user-defined piece either.

Text that spells a control piece (`<s>`, `</s>`, `<unk>`) cannot round-trip: transformers
reads it as that control token, SentencePiece as text, and content must never become a
control token in training data. `control_pattern` finds such text; the build drops those
conversations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import sentencepiece as spm

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# The pieces a ChatML SentencePiece model holds, one id each (trained in, or appended).
CHAT_PIECES = (IM_START, IM_END)


def turn_header(role: str) -> str:
    """`<|im_start|>{role}\\n`, where a turn's content starts (a generation prompt ends on
    the assistant's)."""
    return f"{IM_START}{role}\n"


def render_chatml(
    messages: Sequence[Mapping[str, str]],
) -> tuple[str, list[list[int]], list[int]]:
    """ChatML text, the `[start, end)` loss spans of assistant replies, and each turn's end.

    A turn is `<|im_start|>{role}\\n{content}<|im_end|>\\n`. A loss span starts right after
    `<|im_start|>assistant\\n` and ends right after the reply's `<|im_end|>`; a turn ends
    after its trailing newline (offsets are str indices).
    """
    parts: list[str] = []
    spans: list[list[int]] = []
    ends: list[int] = []
    at = 0
    for m in messages:
        header = turn_header(m["role"])
        body = f"{m['content']}{IM_END}"
        if m["role"] == "assistant":
            spans.append([at + len(header), at + len(header) + len(body)])
        parts += (header, body, "\n")
        at += len(header) + len(body) + 1
        ends.append(at)
    return "".join(parts), spans, ends


def chat_processor(sp: spm.SentencePieceProcessor) -> spm.SentencePieceProcessor:
    """`sp` when its model adds no dummy prefix, else a copy of the model without one."""
    # protobuf is a dependency; the schema module is imported only where it is needed.
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    model.ParseFromString(sp.serialized_model_proto())
    if not model.normalizer_spec.add_dummy_prefix:
        return sp
    model.normalizer_spec.add_dummy_prefix = False
    out = spm.SentencePieceProcessor()
    out.LoadFromSerializedProto(model.SerializeToString())
    return out


def control_texts(sp: spm.SentencePieceProcessor) -> list[str]:
    """The texts of the model's control and unknown pieces (`<s>`, `</s>`, `<unk>`): split out
    of any text as tokens by transformers, encoded as plain text by SentencePiece."""
    return [
        sp.id_to_piece(i) for i in range(sp.vocab_size()) if sp.is_control(i) or sp.is_unknown(i)
    ]


def control_pattern(sp: spm.SentencePieceProcessor) -> re.Pattern[str] | None:
    """A regex matching any control piece's text (longest first), None if the model has none."""
    texts = sorted({t for t in control_texts(sp) if t}, key=lambda t: (-len(t), t))
    return re.compile("|".join(map(re.escape, texts))) if texts else None

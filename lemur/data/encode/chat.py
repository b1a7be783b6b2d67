"""Chat documents to ChatML tokens and loss masks: rendered once, encoded once, long ones cut.

A chat document (lemur/data/read/chat_reader.py) carries its checked messages in
`metadata["messages"]` (MESSAGES_KEY); its text is their ChatML rendering, which the tagger
and filters read. The chat steps render the messages once in the model's format and pass the
document on with that text (what dedup signs), its ids and its loss mask (TOKENS_KEY,
MASK_KEY, for TokenizeWriter). `ChatStep` is what both formats share: the messages, the
`chat.long` policy, the counting; `ChatEncoder` here is ChatML for a SentencePiece model,
`TemplateChatEncoder` (template_chat.py) a tokenizer.json folder's own chat template.

ChatML: `render_chatml` gives the text with the character spans to train on (each assistant
content and its `<|im_end|>`) and where each message ends. The char offsets are turned into
UTF-8 byte offsets, and the mask of a token is 1 exactly when every byte it stands for lies
inside a loss span, by the byte offsets of the tokens of one encoding of the whole
conversation (offsets.py), so the tokens are those a plain `encode` of the text gives, by
the model without its dummy prefix (lemur/chatml.py: the ids transformers'
`apply_chat_template` gives with the exported tokenizer). A conversation whose text spells a
control piece (`<s>`, `</s>`, `<unk>`) is dropped: transformers would read it as that token,
and content never becomes a control token in training data; one whose content holds a ChatML
marker too (it would forge a turn: the markers are this model's own pieces).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.chatml import chat_processor, control_pattern, render_chatml
from lemur.data.encode.offsets import TokenOffsets, byte_offsets
from lemur.data.encode.tokenizer import load_llama2_processor
from lemur.data.labels import dropped_label, truncated_label
from lemur.data.read.chat import (
    MARKER_IN_CONTENT,
    MESSAGES_KEY,
    Message,
    marker_in_content,
)
from lemur.data.recipe.recipe import CHAT_LONG

# Where a chat step leaves a document's ids and mask for TokenizeWriter (never serialized).
TOKENS_KEY, MASK_KEY = "lemur_chat_ids", "lemur_chat_mask"
# Drop reasons (counts.dropped) of the chat stage, named like the chat reader's.
TOO_LONG = "chat:too_long"  # over seq_len, and no cut at a turn boundary fits (or `drop`)
NO_LOSS = "chat:no_loss_tokens"  # no token lies wholly inside a loss span
BAD_MESSAGES = "chat:bad_messages"  # no list of role/content messages: a bug upstream
CONTROL_TEXT = "chat:control_in_content"  # text spelling `<s>`, `</s>`, `<unk>`: see chatml.py


def loss_mask(
    offsets: np.ndarray, spans: Sequence[Sequence[int]], limits: np.ndarray | int
) -> np.ndarray:
    """uint8 per token: 1 when every byte the token stands for lies inside a loss span.

    `offsets` is (tokens, 2) [begin, end) per token, `spans` sorted, non-overlapping
    [start, end) in the same units (bytes here). A token standing for nothing (a
    dummy-prefix `▁`; SentencePiece's offset mapping also gives a character's byte-fallback
    bytes but its last an empty range) belongs to the unit at its position, if its text
    has one (`limits`: where each token's text ends). A token straddling a span's edge
    gets 0.
    """
    edges = np.asarray(spans, np.int64).reshape(-1, 2)
    begin, end = offsets[:, 0], offsets[:, 1]
    end = np.maximum(end, np.minimum(begin + 1, limits))
    # The last span starting at or before each token's first byte must reach its end.
    j = np.searchsorted(edges[:, 0], begin, side="right") - 1
    reach = edges[np.maximum(j, 0), 1] if len(edges) else np.zeros(len(begin), np.int64)
    return ((j >= 0) & (end > begin) & (end <= reach)).astype(np.uint8)


def tokens_before(offsets: np.ndarray, cut: int) -> int | None:
    """How many leading tokens end at or before offset `cut`; None when one straddles it."""
    begin, end = offsets[:, 0], offsets[:, 1]
    k = int(np.searchsorted(end, cut, side="right"))
    while k and begin[k - 1] == end[k - 1] == cut:
        k -= 1  # a surface-less token at the cut belongs to the character after it
    if k < len(end) and begin[k] < cut:
        return None
    return k


def truncation(
    offsets: np.ndarray, spans: Sequence[Sequence[int]], turn_ends: Sequence[int], budget: int
) -> tuple[int, int] | None:
    """(tokens, turn) of the longest prefix ending an assistant turn within `budget` tokens.

    `turn` indexes `turn_ends` (offsets in the units of `offsets`). A cut goes at the end of
    a turn holding a loss span, so the kept part ends with a whole answer; None when even
    the first such turn does not fit.
    """
    span_ends = sorted(int(e) for _, e in spans)
    best = None
    previous = 0
    for j, t in enumerate(turn_ends):
        if any(previous < e <= t for e in span_ends):
            k = tokens_before(offsets, int(t))
            if k is not None and k > budget:
                break
            if k is not None:
                best = (k, j)
        previous = t
    return best


def document_messages(doc: Document) -> list[Message] | None:
    """The messages the chat reader left in `doc`, None if there are none or they are not a
    list of `{"role": str, "content": str}`."""
    messages = doc.metadata.get(MESSAGES_KEY)
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        return None
    return messages


class ChatStep(PipelineStep):
    """What the chat steps share: the messages of each document, the `chat.long` policy,
    the drops and cuts they count (`dropped:<source>:<reason>`, `truncated:<source>`)."""

    type = "🔢 - TOKENIZER"

    def __init__(
        self, tokenizer_path: str, seq_len: int, long: str = "truncate", batch_docs: int = 256
    ) -> None:
        super().__init__()
        if long not in CHAT_LONG:
            raise ValueError(f"chat.long must be one of {', '.join(CHAT_LONG)}, got {long!r}")
        self.tokenizer_path = tokenizer_path
        self.seq_len = seq_len
        self.long = long
        self.batch_docs = batch_docs

    def messages(self, doc: Document) -> list[Message] | None:
        """`doc`'s messages; None (counted as BAD_MESSAGES) when it has none."""
        messages = document_messages(doc)
        if messages is None:
            self.drop(doc, BAD_MESSAGES)
        return messages

    def drop(self, doc: Document, reason: str) -> None:
        """Count `doc` dropped for `reason`."""
        self.stat_update(dropped_label(str(doc.metadata.get("source")), reason))

    def count_cut(self, doc: Document) -> None:
        """Count `doc` cut to fit `seq_len`."""
        self.stat_update(truncated_label(str(doc.metadata.get("source"))))

    @staticmethod
    def keep(doc: Document, text: str, ids: np.ndarray, mask: np.ndarray) -> Document:
        """`doc` as it is trained on: the rendered text (the messages are done with), its
        ids and loss mask."""
        doc.text = text
        doc.metadata.pop(MESSAGES_KEY, None)
        doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY] = ids, mask
        return doc


@dataclass(frozen=True)
class ChatMLText:
    """A conversation rendered as ChatML, with its UTF-8 size, loss spans and turn ends in
    bytes (`chars`: where each turn ends in characters, to cut the text)."""

    text: str
    size: int
    spans: list[list[int]]
    ends: list[int]
    chars: list[int]

    @classmethod
    def of(cls, messages: list[Message]) -> ChatMLText:
        """`messages` rendered (`render_chatml`), its offsets in bytes."""
        text, spans, ends = render_chatml(messages)
        to_bytes = byte_offsets(text)  # char -> byte offsets (None: ASCII, the same)
        if to_bytes is None:
            return cls(text, len(text), spans, ends, ends)
        byte_spans = [[int(to_bytes[s]), int(to_bytes[e])] for s, e in spans]
        return cls(text, int(to_bytes[-1]), byte_spans, [int(to_bytes[t]) for t in ends], ends)


class ChatEncoder(ChatStep):
    """Renders chat documents as ChatML, encodes them once, computes their loss masks and
    applies the long policy (a SentencePiece model with the ChatML markers as pieces).

    Kept documents carry their ChatML text (cut when truncated, so dedup signs what is
    trained on), ids and mask. Drops are counted under MARKER_IN_CONTENT, CONTROL_TEXT,
    TOO_LONG, NO_LOSS or BAD_MESSAGES, cuts under `truncated:<source>`. Sits before the dedup
    signer: every document it passes is tokenized, so signatures and token records stay one
    to one.
    """

    name = "💬 lemur chat tokens"

    def __init__(
        self, tokenizer_path: str, seq_len: int, long: str = "truncate", batch_docs: int = 256
    ) -> None:
        super().__init__(tokenizer_path, seq_len, long, batch_docs)
        self.budget = seq_len - 2  # room for <s> and </s>

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Pass on each kept chat document with its ids and mask; count the rest."""
        sp = load_llama2_processor(self.tokenizer_path)
        offsets, control = TokenOffsets(chat_processor(sp)), control_pattern(sp)
        for batch in batched(data or [], self.batch_docs):
            with self.track_time("batch"):
                rendered = [(d, r) for d in batch if (r := self._render(d, control)) is not None]
                texts = [r.text for _, r in rendered]
                kept = self._batch(rendered, *offsets.encode_flat(texts))
            yield from kept

    def _render(self, doc: Document, control: re.Pattern[str] | None) -> ChatMLText | None:
        """`doc`'s conversation as ChatML; None (counted) when a content holds a ChatML
        marker (MARKER_IN_CONTENT) or the text a control piece's (CONTROL_TEXT)."""
        messages = self.messages(doc)
        if messages is None:
            return None
        if marker_in_content(messages):
            self.drop(doc, MARKER_IN_CONTENT)
            return None
        chatml = ChatMLText.of(messages)
        if control is not None and control.search(chatml.text) is not None:
            self.drop(doc, CONTROL_TEXT)
            return None
        return chatml

    def _batch(
        self,
        batch: list[tuple[Document, ChatMLText]],
        ids: np.ndarray,
        offsets: np.ndarray,
        starts: np.ndarray,
    ) -> list[Document]:
        """The kept documents of a batch, ids and masks attached (masks in one pass)."""
        base = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(np.array([chatml.size for _, chatml in batch], np.int64), out=base[1:])
        # The batch as one text: each document's bytes after the previous one's.
        spans = [
            [start + o, end + o]
            for (_, chatml), o in zip(batch, base.tolist(), strict=False)
            for start, end in chatml.spans
        ]
        counts = np.diff(starts)
        shift = np.repeat(base[:-1], counts)[:, None]
        mask = loss_mask(offsets + shift, spans, np.repeat(base[1:], counts))
        kept = []
        for i, (doc, chatml) in enumerate(batch):
            lo, hi = int(starts[i]), int(starts[i + 1])
            cut = self._fit(doc, offsets[lo:hi], chatml)
            if cut is not None and not mask[lo : lo + cut[0]].any():
                self.drop(doc, NO_LOSS)
            elif cut is not None:
                keep, text = cut
                kept.append(self.keep(doc, text, ids[lo : lo + keep], mask[lo : lo + keep]))
        return kept

    def _fit(
        self, doc: Document, offsets: np.ndarray, chatml: ChatMLText
    ) -> tuple[int, str] | None:
        """(tokens, text) of `doc` to keep: all of it, or cut at a turn to fit the budget
        (counted); None: dropped as TOO_LONG."""
        if len(offsets) <= self.budget:
            return len(offsets), chatml.text
        cut = None
        if self.long == "truncate":
            cut = truncation(offsets, chatml.spans, chatml.ends, self.budget)
        if cut is None:
            self.drop(doc, TOO_LONG)
            return None
        keep, turn = cut
        self.count_cut(doc)
        return keep, chatml.text[: chatml.chars[turn]]

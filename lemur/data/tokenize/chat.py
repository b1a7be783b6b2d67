"""Chat documents to tokens and loss masks: one encoding per conversation, long ones cut.

A chat document (see lemur/data/read/chat.py) is a conversation rendered as ChatML, with
`metadata["loss_spans"]` (char ranges to train on: each assistant content and its
`<|im_end|>`) and `metadata["turn_ends"]` (the char offset where each message ends). The
char offsets are turned into UTF-8 byte offsets, and the mask of a token is 1 exactly when
every byte it stands for lies inside a loss span, by the byte offsets of the tokens of one
encoding of the whole conversation (offsets.py), so the tokens are those a plain `encode`
of the text gives, by the model without its dummy prefix (lemur/chatml.py: the ids
transformers' `apply_chat_template` gives with the exported tokenizer). A conversation
whose text spells a control piece (`<s>`, `</s>`, `<unk>`) is dropped: transformers would
read it as that token, and content never becomes a control token in training data; one
whose content holds a ChatML marker too (it would forge a turn: the markers are this
model's own pieces).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.chatml import IM_END, IM_START, chat_processor, control_pattern
from lemur.data.counts import dropped_label, truncated_label
from lemur.data.read.chat import MARKER_IN_CONTENT, chatml_marker_in_content
from lemur.data.recipe import CHAT_LONG
from lemur.data.tokenize.offsets import TokenOffsets, byte_offsets
from lemur.data.tokenize.tokenizer import load_llama2_processor

CHAT_PIECES = (IM_START, IM_END)
# Where ChatEncoder leaves a document's ids and mask for TokenizeWriter (never serialized).
TOKENS_KEY, MASK_KEY = "lemur_chat_ids", "lemur_chat_mask"
# Drop reasons (counts.dropped) of the chat stage, named like the chat reader's.
TOO_LONG = "chat:too_long"  # over seq_len, and no cut at a turn boundary fits (or `drop`)
NO_LOSS = "chat:no_loss_tokens"  # no token lies wholly inside a loss span
BAD_SPANS = "chat:bad_spans"  # loss spans or turn ends outside the text or out of order
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


def _spans_ok(spans: Any, turn_ends: Any, n: int) -> bool:
    """Spans are sorted, non-overlapping [start, end] int pairs inside the text; turn ends
    increase inside it."""
    try:
        previous = 0
        for t in turn_ends:
            if type(t) is not int or not previous < t:
                return False
            previous = t
        last = 0
        for start, end in spans:
            if type(start) is not int or type(end) is not int or not last <= start <= end <= n:
                return False
            last = end
    except (TypeError, ValueError):  # not pairs
        return False
    return previous <= n


class ChatEncoder(PipelineStep):
    """Encodes chat documents once, computes their loss masks and applies the long policy.

    Kept documents carry their ids and mask in metadata (TOKENS_KEY, MASK_KEY) for
    TokenizeWriter; a truncated one also carries its cut text (so dedup signs what is
    trained on). Drops are counted under MARKER_IN_CONTENT, CONTROL_TEXT, TOO_LONG, NO_LOSS
    or BAD_SPANS,
    cuts under `truncated:<source>`. Sits before the dedup signer: every document it passes is
    tokenized, so signatures and token records stay one to one.
    """

    name = "💬 lemur chat tokens"
    type = "🔢 - TOKENIZER"

    def __init__(
        self, tokenizer_path: str, seq_len: int, long: str = "truncate", batch_docs: int = 256
    ) -> None:
        super().__init__()
        if long not in CHAT_LONG:
            raise ValueError(f"chat.long must be one of {', '.join(CHAT_LONG)}, got {long!r}")
        self.tokenizer_path = tokenizer_path
        self.budget = seq_len - 2  # room for <s> and </s>
        self.long = long
        self.batch_docs = batch_docs

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Pass on each kept chat document with its ids and mask; count the rest."""
        sp = load_llama2_processor(self.tokenizer_path)
        offsets, control = TokenOffsets(chat_processor(sp)), control_pattern(sp)
        for batch in batched(data or [], self.batch_docs):
            with self.track_time("batch"):
                batch = [d for d in batch if not self._spells_control(d, control)]
                kept = self._batch(batch, *offsets.encode_flat([d.text for d in batch]))
            yield from kept

    def _spells_control(self, doc: Document, control: re.Pattern[str] | None) -> bool:
        """Whether a content of `doc` holds a ChatML marker (then dropped as
        MARKER_IN_CONTENT) or its text a control piece's (then CONTROL_TEXT)."""
        turns = doc.metadata.get("turn_ends")
        if isinstance(turns, list) and chatml_marker_in_content(doc.text, len(turns)):
            self._drop(doc, MARKER_IN_CONTENT)
            return True
        if control is None or control.search(doc.text) is None:
            return False
        self._drop(doc, CONTROL_TEXT)
        return True

    def _drop(self, doc: Document, reason: str) -> None:
        self.stat_update(dropped_label(str(doc.metadata.get("source")), reason))

    def _batch(
        self, batch: list[Document], ids: np.ndarray, offsets: np.ndarray, starts: np.ndarray
    ) -> list[Document]:
        """The kept documents of a batch, ids and masks attached (masks in one pass)."""
        layouts = [_byte_layout(d) for d in batch]
        sizes = np.array([size for size, _, _ in layouts], np.int64)
        base = np.zeros(len(batch) + 1, np.int64)
        np.cumsum(sizes, out=base[1:])
        # The batch as one text: each document's bytes after the previous one's.
        spans = [
            [start + o, end + o]
            for (_, doc_spans, _), o in zip(layouts, base.tolist(), strict=False)
            for start, end in doc_spans or ()
        ]
        counts = np.diff(starts)
        shift = np.repeat(base[:-1], counts)[:, None]
        mask = loss_mask(offsets + shift, spans, np.repeat(base[1:], counts))
        kept = []
        for i, doc in enumerate(batch):
            lo, hi = int(starts[i]), int(starts[i + 1])
            keep = self._keep(doc, offsets[lo:hi], layouts[i])
            if keep is not None and not mask[lo : lo + keep].any():
                self._drop(doc, NO_LOSS)
            elif keep is not None:
                doc.metadata[TOKENS_KEY] = ids[lo : lo + keep]
                doc.metadata[MASK_KEY] = mask[lo : lo + keep]
                kept.append(doc)
        return kept

    def _keep(self, doc: Document, offsets: np.ndarray, layout: tuple) -> int | None:
        """How many tokens of `doc` to keep (cutting its text if needed); None: dropped."""
        _, byte_spans, byte_ends = layout
        if byte_spans is None:
            self._drop(doc, BAD_SPANS)
            return None
        if len(offsets) <= self.budget:
            return len(offsets)
        cut = None
        if self.long == "truncate":
            cut = truncation(offsets, byte_spans, byte_ends, self.budget)
        if cut is None:
            self._drop(doc, TOO_LONG)
            return None
        keep, turn = cut
        meta = doc.metadata
        chars = int(meta["turn_ends"][turn])
        doc.text = doc.text[:chars]
        meta["loss_spans"] = [[s, e] for s, e in meta["loss_spans"] if e <= chars]
        meta["turn_ends"] = [t for t in meta["turn_ends"] if t <= chars]
        self.stat_update(truncated_label(str(meta.get("source"))))
        return keep


def _byte_layout(doc: Document) -> tuple[int, list | None, list | None]:
    """(UTF-8 size, loss spans, turn ends) of a chat document in bytes; spans None if bad."""
    text, meta = doc.text, doc.metadata
    to_bytes = byte_offsets(text)  # char -> byte offsets (None: ASCII, the same)
    size = len(text) if to_bytes is None else int(to_bytes[-1])
    spans, turn_ends = meta.get("loss_spans") or [], meta.get("turn_ends") or []
    if not _spans_ok(spans, turn_ends, len(text)):
        return size, None, None
    if to_bytes is None:
        return size, spans, turn_ends
    return (
        size,
        [[int(to_bytes[s]), int(to_bytes[e])] for s, e in spans],
        [int(to_bytes[t]) for t in turn_ends],
    )

"""Chat documents to tokens and loss masks: one encoding per conversation, long ones cut.

A chat document (see lemur/data/read/chat.py) is a conversation rendered as ChatML, with
`metadata["loss_spans"]` (char ranges to train on: each assistant content and its
`<|im_end|>`) and `metadata["turn_ends"]` (the char offset where each message ends). The
mask of a token is 1 exactly when every character it covers lies inside a loss span; the
token offsets come from SentencePiece's offset mapping of one encoding of the whole
conversation, so the tokens are those a plain `encode` of the text gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.data.counts import dropped_label, truncated_label
from lemur.data.read.chat import IM_END, IM_START
from lemur.data.tokenize.tokenizer import load_tokenizer

CHAT_PIECES = (IM_START, IM_END)
# Where ChatEncoder leaves a document's ids and mask for TokenizeWriter (never serialized).
TOKENS_KEY, MASK_KEY = "lemur_chat_ids", "lemur_chat_mask"
LONG_POLICIES = ("truncate", "drop")
# Drop reasons (counts.dropped) of the chat stage, named like the chat reader's.
TOO_LONG = "chat:too_long"  # over seq_len, and no cut at a turn boundary fits (or `drop`)
NO_LOSS = "chat:no_loss_tokens"  # no token lies wholly inside a loss span
BAD_SPANS = "chat:bad_spans"  # loss spans or turn ends outside the text or out of order


def loss_mask(offsets: np.ndarray, n_chars: int, spans: Sequence[Sequence[int]]) -> np.ndarray:
    """uint8 per token: 1 when every character of the token lies inside a loss span.

    `offsets` is (tokens, 2) char [begin, end) per token. A token covering no character (a
    byte-fallback byte before its character's last, or a dummy-prefix `▁`) belongs to the
    character at its position. A token straddling a span's edge gets 0.
    """
    delta = np.zeros(n_chars + 1, np.int32)
    for start, end in spans:
        delta[start] += 1
        delta[end] -= 1
    inside = np.cumsum(delta[:-1]) > 0
    covered = np.zeros(n_chars + 1, np.int64)
    np.cumsum(inside, out=covered[1:])
    begin, end = offsets[:, 0], offsets[:, 1]
    end = np.maximum(end, np.minimum(begin + 1, n_chars))
    return ((end > begin) & (covered[end] - covered[begin] == end - begin)).astype(np.uint8)


def tokens_before(offsets: np.ndarray, cut: int) -> int | None:
    """How many leading tokens end at or before char `cut`; None when a token straddles it."""
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
    """(tokens, chars) of the longest prefix that ends an assistant turn within `budget` tokens.

    A cut goes at the end of a turn holding a loss span, so the kept part ends with a
    whole answer; None when even the first such turn does not fit.
    """
    span_ends = sorted(int(e) for _, e in spans)
    best = None
    previous = 0
    for t in turn_ends:
        if any(previous < e <= t for e in span_ends):
            k = tokens_before(offsets, int(t))
            if k is not None and k > budget:
                break
            if k is not None:
                best = (k, int(t))
        previous = t
    return best


def _spans_ok(spans: Any, turn_ends: Any, n: int) -> bool:
    """Spans are [start, end] pairs inside the text; turn ends increase inside it."""
    try:
        pairs_ok = all(0 <= int(s) <= int(e) <= n for s, e in spans)
        ends = [int(t) for t in turn_ends]
    except (TypeError, ValueError):
        return False
    return (
        pairs_ok
        and all(a < b for a, b in zip([0, *ends], ends, strict=False))
        and (not ends or ends[-1] <= n)
    )


class ChatEncoder(PipelineStep):
    """Encodes chat documents once, computes their loss masks and applies the long policy.

    Kept documents carry their ids and mask in metadata (TOKENS_KEY, MASK_KEY) for
    TokenizeWriter; a truncated one also carries its cut text (so dedup signs what is
    trained on). Drops are counted under TOO_LONG, NO_LOSS or BAD_SPANS, cuts under
    `truncated:<source>`. Sits before the dedup signer: every document it passes is
    tokenized, so signatures and token records stay one to one.
    """

    name = "💬 lemur chat tokens"
    type = "🔢 - TOKENIZER"

    def __init__(
        self, tokenizer_path: str, seq_len: int, long: str = "truncate", batch_docs: int = 256
    ) -> None:
        super().__init__()
        if long not in LONG_POLICIES:
            raise ValueError(f"chat.long must be one of {', '.join(LONG_POLICIES)}, got {long!r}")
        self.tokenizer_path = tokenizer_path
        self.budget = seq_len - 2  # room for <s> and </s>
        self.long = long
        self.batch_docs = batch_docs

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Pass on each kept chat document with its ids and mask; count the rest."""
        sp = load_tokenizer(self.tokenizer_path)
        for batch in batched(data or [], self.batch_docs):
            with self.track_time("batch"):
                # One thread per task: parallelism comes from the executor's tasks.
                encoded = sp.encode(
                    [d.text for d in batch], out_type="offset_mapping", num_threads=1
                )
                kept = [d for d, e in zip(batch, encoded, strict=True) if self._prepare(d, e)]
            yield from kept

    def _drop(self, doc: Document, reason: str) -> bool:
        self.stat_update(dropped_label(str(doc.metadata.get("source")), reason))
        return False

    def _prepare(self, doc: Document, encoded: dict[str, Any]) -> bool:
        """Attach ids and mask to `doc` (cut if needed); False when it is dropped."""
        meta, n = doc.metadata, len(doc.text)
        spans, turn_ends = meta.get("loss_spans") or [], meta.get("turn_ends") or []
        if not _spans_ok(spans, turn_ends, n):
            return self._drop(doc, BAD_SPANS)
        ids = encoded["ids"]
        offsets = np.fromiter(chain.from_iterable(encoded["offsets"]), np.int64, 2 * len(ids))
        offsets = offsets.reshape(-1, 2)
        keep = len(ids)
        if keep > self.budget:
            cut = (
                truncation(offsets, spans, turn_ends, self.budget)
                if self.long == "truncate"
                else None
            )
            if cut is None:
                return self._drop(doc, TOO_LONG)
            keep, chars = cut
            doc.text = doc.text[:chars]
            meta["loss_spans"] = [[s, e] for s, e in spans if e <= chars]
            meta["turn_ends"] = [t for t in turn_ends if t <= chars]
            self.stat_update(truncated_label(str(meta.get("source"))))
        mask = loss_mask(offsets[:keep], len(doc.text), meta["loss_spans"])
        if not mask.any():
            return self._drop(doc, NO_LOSS)
        meta[TOKENS_KEY] = np.asarray(ids[:keep], np.int64)
        meta[MASK_KEY] = mask
        return True

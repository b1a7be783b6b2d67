"""Chat documents of a `tokenizer.json` build: encoded with the model's own chat template.

The reader renders every conversation as ChatML (lemur/data/read/chat.py); here its
messages are read back (`parse_chatml`, by the turn ends: a content may hold ChatML's
markers, plain text to a model whose markers they are not) and rendered by the folder's
template
(lemur/chat_template), so a document's ids are exactly
`apply_chat_template(messages, tokenize=True)`'s and nothing is added around them: the
template writes its own BOS (Llama-3) or none (ChatML), and its own end of turn. The loss
mask is 1 on every token overlapping an assistant content or the text up to and including
the control token that ends its turn. A conversation over `seq_len` tokens is cut to the
longest prefix ending on an assistant turn that fits, rendered anew (the template decides
what a shorter conversation looks like), or dropped (`chat:too_long`).
"""

from __future__ import annotations

from datetime import datetime

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.chat_template import ChatTemplate, TemplateChat, TemplateDrop
from lemur.data.counts import dropped_label, truncated_label
from lemur.data.read.chat import Message, parse_chatml
from lemur.data.recipe import Recipe
from lemur.data.tokenize.chat import (
    BAD_SPANS,
    LONG_POLICIES,
    MASK_KEY,
    NO_LOSS,
    TOKENS_KEY,
    TOO_LONG,
    ChatEncoder,
)
from lemur.tokenizer import open_tokenizer

# What `strftime_now` reads in a build (Llama-3.1's template writes "Today Date: ..."):
# a fixed day, so that shards do not depend on the day they were built. It is the date
# Llama-3.1's own template falls back to without `strftime_now`.
TEMPLATE_DATE = datetime(2024, 7, 26)


def uses_template(recipe: Recipe) -> bool:
    """Whether a build's chat documents are rendered by the model's own chat template."""
    return recipe.is_chat() and recipe.tokenizer.hf is not None


def chat_step(recipe: Recipe, tokenizer_path: str, batch_docs: int) -> PipelineStep:
    """The chat stage of a build: ChatML for a SentencePiece model, else the template."""
    long = recipe.chat_settings().long
    if not uses_template(recipe):
        return ChatEncoder(tokenizer_path, recipe.seq_len, long, batch_docs)
    engine = recipe.tokenizer.engine or "auto"
    return TemplateChatEncoder(tokenizer_path, recipe.seq_len, long, batch_docs, engine)


class TemplateChatEncoder(PipelineStep):
    """Renders and encodes chat documents with the model's chat template; applies `long`.

    Kept documents carry the rendered text (what dedup signs), their ids and mask
    (TOKENS_KEY, MASK_KEY) for TokenizeWriter, which writes them as they are. Drops are
    counted under the template's reasons (`chat:control_in_content`,
    `chat:template_error`, `chat:template_content`), TOO_LONG, NO_LOSS or BAD_SPANS (turn
    ends that do not delimit the ChatML turns); cuts under `truncated:<source>`.
    """

    name = "💬 lemur chat template tokens"
    type = "🔢 - TOKENIZER"

    def __init__(
        self,
        tokenizer_path: str,
        seq_len: int,
        long: str = "truncate",
        batch_docs: int = 256,
        engine: str = "auto",
    ) -> None:
        super().__init__()
        if long not in LONG_POLICIES:
            raise ValueError(f"chat.long must be one of {', '.join(LONG_POLICIES)}, got {long!r}")
        self.tokenizer_path = tokenizer_path
        self.budget = seq_len  # the template frames the conversation: nothing is added
        self.long = long
        self.batch_docs = batch_docs
        self.engine = engine

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Pass on each kept chat document with its ids and mask; count the rest."""
        tok = open_tokenizer(self.tokenizer_path, engine=self.engine)
        template = ChatTemplate(tok, clock=lambda: TEMPLATE_DATE)
        for batch in batched(data or [], self.batch_docs):
            with self.track_time("batch"):
                kept = [d for d in batch if self._encode(d, template)]
            yield from kept

    def _encode(self, doc: Document, template: ChatTemplate) -> bool:
        """Attach `doc`'s ids and mask (its text becomes the rendered one); False: dropped."""
        try:
            messages = parse_chatml(doc.text, doc.metadata.get("turn_ends") or [])
        except (ValueError, TypeError):  # a bug upstream, not bad input
            self.stat_update(dropped_label(str(doc.metadata.get("source")), BAD_SPANS))
            return False
        try:
            chat = self._fit(doc, messages, template)
        except TemplateDrop as e:
            self.stat_update(dropped_label(str(doc.metadata.get("source")), e.reason))
            return False
        if not chat.mask.any():
            self.stat_update(dropped_label(str(doc.metadata.get("source")), NO_LOSS))
            return False
        doc.text = chat.text
        # ChatML offsets mean nothing in the rendered text.
        doc.metadata.pop("loss_spans", None)
        doc.metadata.pop("turn_ends", None)
        doc.metadata[TOKENS_KEY], doc.metadata[MASK_KEY] = chat.ids, chat.mask
        return True

    def _fit(self, doc: Document, messages: list[Message], template: ChatTemplate) -> TemplateChat:
        """The whole conversation if it fits, else the longest prefix ending on an assistant
        turn that does (with `truncate`, counted), else TemplateDrop TOO_LONG."""
        chat = template.encode(messages)
        if len(chat.ids) <= self.budget:
            return chat
        cuts = [k + 1 for k, m in enumerate(messages[:-1]) if m["role"] == "assistant"]
        if self.long != "truncate" or not cuts:
            raise TemplateDrop(TOO_LONG)
        # Binary search over the cuts (a longer prefix renders at least as long).
        best, lo, hi = None, 0, len(cuts) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            part = template.encode(messages[: cuts[mid]])
            if len(part.ids) <= self.budget:
                best, lo = part, mid + 1
            else:
                hi = mid - 1
        if best is None:
            raise TemplateDrop(TOO_LONG)
        self.stat_update(truncated_label(str(doc.metadata.get("source"))))
        return best

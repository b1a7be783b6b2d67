"""Chat documents of a `tokenizer.json` build: encoded with the model's own chat template.

A chat document's messages (in its metadata: lemur/data/encode/chat.py) are rendered by the
folder's template (lemur/chat_template) and nothing else, so a document's ids are exactly
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
from lemur.data.corpus import Corpus
from lemur.data.encode.chat import NO_LOSS, TOO_LONG, ChatEncoder, ChatStep
from lemur.data.read.chat import Message
from lemur.tokenizer import open_tokenizer

# What `strftime_now` reads in a build (Llama-3.1's template writes "Today Date: ..."):
# a fixed day, so that shards do not depend on the day they were built. It is the date
# Llama-3.1's own template falls back to without `strftime_now`.
TEMPLATE_DATE = datetime(2024, 7, 26)


def conversation_steps(corpus: Corpus, tokenizer_path: str, batch_docs: int) -> list[PipelineStep]:
    """The steps that render and encode a corpus's conversations in the model's chat format
    (ChatML, or the tokenizer.json folder's template) before dedup signs them; none for a
    corpus of plain documents (TokenizeWriter encodes their text)."""
    recipe = corpus.recipe
    long = recipe.chat_settings().long
    if corpus.chat_format == "chatml":
        return [ChatEncoder(tokenizer_path, recipe.seq_len, long, batch_docs)]
    if corpus.chat_format == "template":
        engine = recipe.tokenizer.engine or "auto"
        return [TemplateChatEncoder(tokenizer_path, recipe.seq_len, long, batch_docs, engine)]
    return []


class TemplateChatEncoder(ChatStep):
    """Renders and encodes chat documents with the model's chat template; applies `long`.

    Kept documents carry the rendered text (what dedup signs), their ids and mask
    (TOKENS_KEY, MASK_KEY) for TokenizeWriter, which writes them as they are. Drops are
    counted under the template's reasons (`chat:control_in_content`,
    `chat:template_error`, `chat:template_content`), TOO_LONG, NO_LOSS or BAD_MESSAGES;
    cuts under `truncated:<source>`.
    """

    name = "💬 lemur chat template tokens"

    def __init__(
        self,
        tokenizer_path: str,
        seq_len: int,
        long: str = "truncate",
        batch_docs: int = 256,
        engine: str = "auto",
    ) -> None:
        super().__init__(tokenizer_path, seq_len, long, batch_docs)
        self.budget = seq_len  # the template frames the conversation: nothing is added
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
        messages = self.messages(doc)
        if messages is None:
            return False
        try:
            chat = self._fit(doc, messages, template)
        except TemplateDrop as e:
            self.drop(doc, e.reason)
            return False
        if not chat.mask.any():
            self.drop(doc, NO_LOSS)
            return False
        self.keep(doc, chat.text, chat.ids, chat.mask)
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
        self.count_cut(doc)
        return best

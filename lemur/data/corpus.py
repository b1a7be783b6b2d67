"""The kind of corpus a build makes: pre-training documents, or chat conversations.

Every way a chat build differs from a pre-training build is answered here, once, by the
object `corpus_of(recipe)` returns; the stages ask it what to do and never test the recipe
for chat themselves. A pre-training corpus (`Corpus`) is code and text judged by the quality
filters, mixed to `mix.ratio`, framed `BOS doc EOS`. A chat corpus (`ChatCorpus`) is
conversations: rendered in the model's chat format by the tokenize stage (ChatML with its two
markers as pieces of a SentencePiece model, or a tokenizer.json folder's own chat template:
lemur/data/encode/chat.py, template_chat.py), cut or dropped over `seq_len` (counted as
`truncated`), with a loss mask beside the tokens of every shard, taken whole or weighted per
source (`mix.weights`).
"""

from __future__ import annotations

from typing import Any

from lemur.chatml import CHAT_PIECES
from lemur.data.mix import MixInfeasible, MixPlan, plan_all, plan_mix
from lemur.data.recipe.recipe import Recipe


class Corpus:
    """A pre-training corpus: the quality filters judge it, `mix.ratio` mixes its domains."""

    name = "pretraining"
    # Shards carry a loss mask beside their tokens (a `.mask` per `.bin`).
    loss_masks = False
    # The code and web-text quality filters and PII redaction apply: they judge files and
    # web pages and rewrite text, neither of which a conversation is.
    judged_as_text = True
    # How documents are rendered before they are encoded: None, as they are; "chatml" or
    # "template" (the tokenizer.json folder's own chat template) for conversations.
    chat_format: str | None = None

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    def tokenizer_pieces(self) -> tuple[str, ...]:
        """The user-defined pieces a SentencePiece tokenizer of this corpus must hold."""
        return ()

    def budgeted_reading(self) -> bool:
        """Whether sources are read only as far as the mix needs (`mix.budgeted_reading`)."""
        return bool(self.recipe.mix.budgeted_reading)

    def mix_groups(self) -> tuple[str, ...]:
        """The mix group of each source: its domain."""
        return tuple(s.domain for s in self.recipe.sources)

    def mix_target(self, available: dict[str, int]) -> dict[str, float]:
        """The manifest's mix target by domain: the ratio."""
        return dict(self.recipe.mix.ratio)

    def plan_mix(self, available: dict[tuple[str, str], int]) -> MixPlan:
        """The token budget of each (group, language) unit; MixInfeasible if none fits."""
        mix = self.recipe.mix
        return plan_mix(available, mix.ratio, mix.total_tokens, mix.shares, mix.max_repeats)

    def work_key(self) -> dict[str, Any]:
        """What the token runs depend on beyond the sources, filters and tokenizer."""
        return {}

    def counts(self, truncated: int) -> dict[str, int]:
        """The manifest's counts of this kind (`truncated`: documents cut to `seq_len`)."""
        return {}

    def manifest_fields(self) -> dict[str, str]:
        """The manifest's fields of this kind, beside those every build has."""
        return {}


class ChatCorpus(Corpus):
    """Conversations, rendered in the model's chat format, loss on the assistant's turns."""

    name = "chat"
    loss_masks = True
    judged_as_text = False

    def __init__(self, recipe: Recipe) -> None:
        super().__init__(recipe)
        self.chat_format = "template" if recipe.tokenizer.hf is not None else "chatml"

    def tokenizer_pieces(self) -> tuple[str, ...]:
        """ChatML's two markers, one id each (a template build adds nothing)."""
        return CHAT_PIECES if self.chat_format == "chatml" else ()

    def budgeted_reading(self) -> bool:
        """Never: a chat build takes every conversation (or weighs them per source)."""
        return False

    def weighted(self) -> bool:
        """Whether `mix.weights` share the tokens between the chat sources."""
        return bool(self.recipe.mix.weights)

    def mix_groups(self) -> tuple[str, ...]:
        """The mix group of each source: its name when weighted, else its domain."""
        if self.weighted():
            return tuple(s.name for s in self.recipe.sources)
        return super().mix_groups()

    def mix_target(self, available: dict[str, int]) -> dict[str, float]:
        """The weights summed by domain, or what is there when unweighted."""
        weights = self.recipe.mix.weights
        if not weights:
            return {d: float(a) for d, a in available.items()}
        target: dict[str, float] = {}
        for s in self.recipe.sources:
            target[s.domain] = target.get(s.domain, 0.0) + weights.get(s.name, 0.0)
        return target

    def plan_mix(self, available: dict[tuple[str, str], int]) -> MixPlan:
        """Every conversation once, or tokens per source by `mix.weights` (no code:text
        ratio); MixInfeasible when no conversation is left (no corpus, no shard)."""
        recipe, mix = self.recipe, self.recipe.mix
        if not any(available.values()):
            raise MixInfeasible(
                f"chat: no conversation is left to train on (seq_len {recipe.seq_len}, "
                f"chat.long {recipe.chat_settings().long})"
            )
        if mix.weights:
            return plan_mix(available, mix.weights, mix.total_tokens, None, mix.max_repeats)
        return plan_all(available)

    def work_key(self) -> dict[str, Any]:
        """The cut: a conversation's tokens depend on `seq_len` and `chat.long`."""
        return {"chat": (self.recipe.seq_len, self.recipe.chat_settings())}

    def counts(self, truncated: int) -> dict[str, int]:
        """The conversations cut at a turn to fit `seq_len`."""
        return {"truncated": truncated}

    def manifest_fields(self) -> dict[str, str]:
        """`framing: template` when the chat template frames documents (no BOS/EOS added)."""
        return {"framing": "template"} if self.chat_format == "template" else {}


def corpus_of(recipe: Recipe) -> Corpus:
    """The kind of corpus a recipe builds: chat when its sources are conversations."""
    return ChatCorpus(recipe) if recipe.is_chat() else Corpus(recipe)

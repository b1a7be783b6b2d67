"""The recipe's `tokenizer:` section: a given SentencePiece model, an HF tokenizer.json, or
training settings."""

from __future__ import annotations

from dataclasses import dataclass

from lemur.data.recipe_errors import RecipeError


@dataclass(frozen=True)
class TokenizerTrainConfig:
    """Train a tokenizer on a sample of the corpus: a SentencePiece BPE model with Llama-2's
    conventions (`kind: sentencepiece`, the default), or a byte-level BPE tokenizer.json
    with Llama-3's pre-tokenizer (`kind: byte-bpe`; the SentencePiece settings below do
    not apply to it)."""

    kind: str | None = None  # None: sentencepiece (unset keeps older recipes' hashes)
    vocab_size: int = 32000
    sample_bytes: int = 200_000_000
    character_coverage: float = 0.9999
    max_sentence_length: int = 16384
    input_sentence_size: int = 2_000_000


TOKENIZER_ENGINES = ("auto", "tiktoken", "tokenizers")


@dataclass(frozen=True)
class TokenizerConfig:
    """An existing SentencePiece model (`model`: a file, or a shard directory whose
    tokenizer is taken), a Hugging Face `tokenizer.json` (`hf`: the file or a model folder
    holding it), or training settings (`train`).

    For `hf` only: `bos`/`eos` name the tokens a document is framed with (default: the
    folder's `bos_token`/`eos_token`), `no_bos` frames without a BOS, `engine` picks the
    encoder (`auto`: tiktoken where its ids are exact, else `tokenizers`).
    """

    model: str | None = None
    hf: str | None = None
    train: TokenizerTrainConfig | None = None
    bos: str | None = None
    eos: str | None = None
    # None (not False / "auto") when unset, so that older recipes keep their hashes.
    no_bos: bool | None = None
    engine: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.model, self.hf, self.train)) != 1:
            raise RecipeError("recipe: tokenizer: give exactly one of 'model', 'hf' or 'train'")
        hf_only = (self.bos, self.eos, self.no_bos, self.engine)
        if self.hf is None and any(x is not None for x in hf_only):
            raise RecipeError(
                "recipe: tokenizer: bos, eos, no_bos and engine apply to 'hf' tokenizers only"
            )
        if self.engine is not None and self.engine not in TOKENIZER_ENGINES:
            raise RecipeError(
                f"recipe: tokenizer.engine {self.engine!r} is not one of "
                f"{', '.join(TOKENIZER_ENGINES)}"
            )

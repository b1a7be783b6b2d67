"""The recipe's `tokenizer:` section: a given SentencePiece model, an HF tokenizer.json, or
training settings."""

from __future__ import annotations

from dataclasses import dataclass

from lemur.data.recipe.errors import RecipeError


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

    def __post_init__(self) -> None:
        key = "tokenizer.train"
        if self.kind not in (None, "sentencepiece", "byte-bpe"):
            raise RecipeError(
                f"recipe: {key}.kind {self.kind!r} is not one of sentencepiece, byte-bpe"
            )
        _check_vocab_size(self.kind, self.vocab_size, key)
        # SentencePiece's own limits, checked before reading anything.
        if not 0.98 <= self.character_coverage <= 1:
            raise RecipeError(
                f"recipe: {key}.character_coverage must be in [0.98, 1], "
                f"got {self.character_coverage}"
            )
        if not 10 <= self.max_sentence_length <= 2**30:
            raise RecipeError(f"recipe: {key}.max_sentence_length must be in [10, 2^30]")
        if self.sample_bytes < 1 or self.input_sentence_size < 0:
            raise RecipeError(f"recipe: {key}.sample_bytes must be >= 1, input_sentence_size >= 0")


class VocabSizeError(RecipeError):
    """A vocabulary size out of range; `bound` is the range (`> 256 and <= 2^32`)."""

    def __init__(self, message: str, bound: str) -> None:
        super().__init__(message)
        self.bound = bound


def _check_vocab_size(kind: str | None, vocab_size: int, key: str) -> None:
    """The one check of a trained vocabulary's size (the recipe's and `--vocab-size`)."""
    byte_bpe = kind == "byte-bpe"
    low = 258 if byte_bpe else 256  # byte-bpe: 256 bytes and 2 special tokens
    if low < vocab_size <= 2**32:  # ids must fit a uint32 shard
        return
    if vocab_size > low:
        rule = "<= 2^32"
    else:
        rule = "> 258 for byte-bpe (256 bytes and 2 special tokens)" if byte_bpe else "> 256"
    raise VocabSizeError(
        f"recipe: {key}.vocab_size must be {rule}, got {vocab_size}", f"> {low} and <= 2^32"
    )


TOKENIZER_ENGINES = ("auto", "tiktoken", "tokenizers")


@dataclass(frozen=True)
class TokenizerConfig:
    """An existing SentencePiece model (`model`: a file, or a shard directory whose
    tokenizer is taken), a Hugging Face `tokenizer.json` (`hf`: the file or a model folder
    holding it), or training settings (`train`).

    For `hf` only: `bos`/`eos` name the tokens a document is framed with (default: the
    folder's `bos_token`/`eos_token`), `no_bos` frames without a BOS, `engine` picks the
    encoder (`auto`: tiktoken where its ids are exact, else `tokenizers`). A given
    tokenizer (`model` or `hf`) must give back the text it encodes
    (`lemur.tokenizer.round_trip`) unless `lossy: allow`.
    """

    model: str | None = None
    hf: str | None = None
    train: TokenizerTrainConfig | None = None
    bos: str | None = None
    eos: str | None = None
    # None (not False / "auto") when unset, so that older recipes keep their hashes.
    no_bos: bool | None = None
    engine: str | None = None
    lossy: str | None = None  # "allow": take a tokenizer that does not give text back

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.model, self.hf, self.train)) != 1:
            raise RecipeError("recipe: tokenizer: give exactly one of 'model', 'hf' or 'train'")
        if self.lossy is not None and self.lossy != "allow":
            raise RecipeError(f"recipe: tokenizer.lossy {self.lossy!r}: the one value is 'allow'")
        if self.lossy is not None and self.train is not None:
            raise RecipeError(
                "recipe: tokenizer.lossy applies to a given tokenizer ('model' or 'hf'): "
                "a trained one gives its text back"
            )
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

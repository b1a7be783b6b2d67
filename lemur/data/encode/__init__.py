"""Tokenizing: train or load the SentencePiece model, and the step that writes token runs."""

from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.tokenizer import (
    TokenizerError,
    TokenizerSettingsError,
    load_llama2_processor,
    tokenizer_info,
    train_tokenizer,
)

__all__ = [
    "TokenizeWriter",
    "TokenizerError",
    "TokenizerSettingsError",
    "load_llama2_processor",
    "tokenizer_info",
    "train_tokenizer",
]

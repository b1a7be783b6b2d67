"""Tokenizers behind one interface: SentencePiece models and `tokenizer.json` files."""

from lemur.tokenizer.base import ChatMLTokenizer, Tokenizer, TokenizerError
from lemur.tokenizer.bytelevel import ByteLevelTokenizer
from lemur.tokenizer.hf_files import HFTokenizerFiles, read_hf_tokenizer
from lemur.tokenizer.load import is_tokenizer_json, open_tokenizer
from lemur.tokenizer.sentencepiece import SentencePieceTokenizer
from lemur.tokenizer.token_bytes import TokenBytes

__all__ = [
    "ByteLevelTokenizer",
    "ChatMLTokenizer",
    "HFTokenizerFiles",
    "SentencePieceTokenizer",
    "TokenBytes",
    "Tokenizer",
    "TokenizerError",
    "is_tokenizer_json",
    "open_tokenizer",
    "read_hf_tokenizer",
]

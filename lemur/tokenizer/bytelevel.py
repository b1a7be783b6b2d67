"""The `tokenizer.json` engine: byte-level BPE (Llama-3, Qwen2.5, Mistral's tekken, GPT-style).

The reference is the `tokenizers` library with special-token parsing off
(`encode_special_tokens = True`, no added BOS/EOS): a literal `<|endoftext|>` in a
document is text. Where tiktoken gives the same ids (`tiktoken_exact.tiktoken_plan`) it
encodes, 5x faster; the choice is automatic, logged by the build and in the manifest.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from lemur.tokenizer.base import TokenizerError
from lemur.tokenizer.hf_files import HFTokenizerFiles
from lemur.tokenizer.tiktoken_exact import (
    TO_BYTE_LEVEL,
    TiktokenPlan,
    restartable,
    tiktoken_plan,
    token_to_bytes,
)

# tiktoken's BPE slows down on very long pieces (and its regex overflows the stack on
# ~1 MB of spaces: tiktoken#195). No piece can be longer than the longest run of
# "word-ish" or "space-ish" bytes (`has_long_run`), so a text whose runs are all shorter
# than MAX_RUN bytes goes to tiktoken whole; in any other text, pieces longer than
# MAX_PIECE characters are merged by the reference's own BPE.
MAX_RUN = 4096
MAX_PIECE = 2048
ENGINES = ("auto", "tiktoken", "tokenizers")


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD (what tiktoken does; `tokenizers`
    refuses such strings), so both engines see the same characters."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _class_table(member: Any) -> bytes:
    return bytes(0x61 if member(b) else 0x20 for b in range(256))


_SPACE = {9, 10, 11, 12, 13, 32}
# Word-ish bytes: everything but ASCII whitespace, plus CR/LF (pieces end in them);
# space-ish bytes: ASCII whitespace and any non-ASCII byte (Unicode spaces), plus `/`
# (tekken's punctuation pieces end in `[\r\n/]*`). Bytes 0x1c-0x1f count as both. A regex
# piece of the byte-level patterns lies within one word-ish or one space-ish run, give or
# take a leading byte.
_WORDISH = _class_table(lambda b: b not in _SPACE or b in (10, 13) or 0x1C <= b <= 0x1F)
_SPACEISH = _class_table(lambda b: b in _SPACE or b >= 128 or b == 47 or 0x1C <= b <= 0x1F)
_LONG_RUN = b"a" * (MAX_RUN - 1)


def has_long_run(data: bytes) -> bool:
    """Whether a text (UTF-8) may hold a regex piece of MAX_RUN bytes or more.

    Two byte translations and two substring searches: ~400 MB/s, against tiktoken's ~20.
    """
    return _LONG_RUN in data.translate(_WORDISH) or _LONG_RUN in data.translate(_SPACEISH)


_references: dict[str, Any] = {}


def _reference(path: str, sha256: str) -> Any:
    """The `tokenizers` reference of a file, loaded once per process and content."""
    if sha256 not in _references:
        _references[sha256] = _load_reference(path)
    return _references[sha256]


def _load_reference(path: str) -> Any:
    from tokenizers import Tokenizer as Reference

    try:
        tok = Reference.from_file(path)
    except Exception as e:  # noqa: BLE001 - the Rust side raises plain Exceptions
        raise TokenizerError(f"{path}: `tokenizers` cannot load it ({e})") from None
    tok.encode_special_tokens = True
    tok.no_truncation()
    tok.no_padding()
    return tok


_plans: dict[str, TiktokenPlan] = {}


def _plan(sha256: str, data: dict[str, Any], reference: Any) -> TiktokenPlan:
    """`tiktoken_plan` once per process and file content (it takes a second or two)."""
    if sha256 not in _plans:
        _plans[sha256] = tiktoken_plan(data, reference.model.tokenize)
    return _plans[sha256]


_encodings: dict[str, tuple[Any, Any]] = {}


def _encoders(sha256: str, plan: TiktokenPlan) -> tuple[Any, Any]:
    """(tiktoken Encoding, compiled piece regex) of a plan, built once per process."""
    import regex
    import tiktoken

    if sha256 not in _encodings:
        encoding = tiktoken.Encoding(
            f"lemur-{sha256[:12]}",
            pat_str=plan.pattern,
            mergeable_ranks=plan.ranks,
            special_tokens={},
        )
        _encodings[sha256] = (encoding, regex.compile(plan.pattern))
    return _encodings[sha256]


class ByteLevelTokenizer:
    """A tokenizer.json tokenizer, encoded by tiktoken where exact, else by `tokenizers`."""

    kind = "tokenizer.json"

    def __init__(self, files: HFTokenizerFiles, engine: str = "auto") -> None:
        if engine not in ENGINES:
            raise TokenizerError(f"tokenizer engine {engine!r}: expected one of {ENGINES}")
        self.files = files
        self.sha256 = files.sha256
        self.reference = _reference(str(files.path), files.sha256)
        self.vocab_size = int(self.reference.get_vocab_size(with_added_tokens=True))
        self.bos_id = self._special_id(files.bos) if files.bos else None
        self.eos_id = self._special_id(files.eos) if files.eos else None
        self._tiktoken: Any = None
        self.engine_reason = "asked for in the recipe" if engine == "tokenizers" else ""
        if engine != "tokenizers":
            self._plan_tiktoken(engine)
        self.engine = "tiktoken" if self._tiktoken is not None else "tokenizers"

    def _special_id(self, token: str) -> int:
        i = self.reference.token_to_id(token)
        if i is None:
            raise TokenizerError(f"{self.files.path}: has no token {token!r}")
        return int(i)

    def _plan_tiktoken(self, engine: str) -> None:
        plan = _plan(self.files.sha256, self.files.data, self.reference)
        if not plan.exact:
            if engine == "tiktoken":
                raise TokenizerError(f"{self.files.path}: tiktoken is not exact: {plan.reason}")
            self.engine_reason = plan.reason
            return
        self._nfc = plan.nfc
        self._tiktoken, self._pieces = _encoders(self.files.sha256, plan)
        self._restartable = restartable(plan.pattern)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`: no BOS/EOS, special-token text encoded as text."""
        text = clean_text(text)
        if self._tiktoken is None:
            return self.reference.encode(text, add_special_tokens=False).ids
        if self._nfc:
            text = unicodedata.normalize("NFC", text)
        # A text of fewer than MAX_RUN / 4 characters has fewer than MAX_RUN bytes.
        if len(text) >= MAX_RUN // 4 and has_long_run(text.encode("utf-8")):
            return self._encode_long_pieces(text)
        return self._tiktoken.encode_ordinary(text)

    def _encode_long_pieces(self, text: str) -> list[int]:
        """tiktoken on the stretches between long pieces; the reference's BPE on those."""
        ids: list[int] = []
        start = 0
        for match in self._pieces.finditer(text):
            s, e = match.span()
            if e - s <= MAX_PIECE and self._restartable:
                continue
            if start < s:
                ids += self._tiktoken.encode_ordinary(text[start:s])
            piece = text[s:e].encode("utf-8").decode("latin-1").translate(TO_BYTE_LEVEL)
            ids += [t.id for t in self.reference.model.tokenize(piece)]
            start = e
        if start < len(text):
            ids += self._tiktoken.encode_ordinary(text[start:])
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text."""
        if self._tiktoken is not None:  # per text is faster than tiktoken's batch call
            return [self.encode(t) for t in texts]
        clean = [clean_text(t) for t in texts]
        out = self.reference.encode_batch_fast(clean, add_special_tokens=False)
        return [e.ids for e in out]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens spelled out)."""
        return self.reference.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of every id in the middle of a text; special tokens 0."""
        table = np.zeros(self.vocab_size, np.int64)
        for token, i in self.files.data["model"].get("vocab", {}).items():
            b = token_to_bytes(token)
            table[i] = len(b) if b is not None else len(token.encode("utf-8"))
        for content, t in self.files.added.items():
            table[t["id"]] = 0 if t.get("special") else len(content.encode("utf-8"))
        return table

    def piece_id(self, piece: str) -> int | None:
        """The id of `piece` when it is one token."""
        i = self.reference.token_to_id(piece)
        return None if i is None else int(i)

    def info(self) -> dict[str, Any]:
        """The manifest's tokenizer entry: kind, hash, vocab with added tokens, BOS/EOS."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "engine": self.engine,
        }
        if self.engine_reason:
            out["engine_reason"] = self.engine_reason
        return out

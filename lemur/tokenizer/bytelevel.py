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
from lemur.tokenizer.long_pieces import (
    MAX_PIECE,
    MAX_RUN,
    RunLengthBPE,
    grouped,
    has_long_run,
    long_pieces,
    stretch_cut,
)
from lemur.tokenizer.tiktoken_exact import (
    TO_BYTE_LEVEL,
    TiktokenPlan,
    restartable,
    tiktoken_plan,
    token_to_bytes,
)

ENGINES = ("auto", "tiktoken", "tokenizers")


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD (what tiktoken does; `tokenizers`
    refuses such strings), so both engines see the same characters."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _vocabulary(model: dict[str, Any]) -> list[tuple[str, int]]:
    """(token, id) of a tokenizer.json model: BPE, WordPiece and WordLevel map tokens to
    ids; a Unigram lists `[piece, score]` pairs, the id being the place in the list."""
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):
        return [(str(entry[0]), i) for i, entry in enumerate(vocab)]
    return [(str(token), int(i)) for token, i in vocab.items()]


_references: dict[str, Any] = {}


def _reference(path: str, sha256: str, data: dict[str, Any]) -> Any:
    """The `tokenizers` reference of a file, loaded once per process and content."""
    if sha256 not in _references:
        _references[sha256] = _load_reference(path, data)
    return _references[sha256]


def _load_reference(path: str, data: dict[str, Any]) -> Any:
    """The file loaded by `tokenizers`, every added token made special: with special-token
    parsing off, `tokenizers` still matches a non-special added token inside text (Qwen2.5-
    Coder's `<|fim_prefix|>`, `<|file_sep|>`), so that a code file spelling one would get
    its control id; as special they are encoded as text, as `<|endoftext|>` is."""
    import orjson
    from tokenizers import Tokenizer as Reference

    added = data.get("added_tokens") or []
    try:
        if all(t.get("special") for t in added):
            tok = Reference.from_file(path)
        else:
            spec = {**data, "added_tokens": [{**t, "special": True} for t in added]}
            tok = Reference.from_str(orjson.dumps(spec).decode())
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


_encodings: dict[str, tuple[Any, Any, Any]] = {}
# A special token no text holds as one: with it, tiktoken's `encode_to_numpy` (a buffer,
# no Python ints) takes its fast path; with no special token at all, its empty special
# regex matches at every character and costs more than the ints it saves. Never output:
# it is not allowed, so its text (should a document hold it) is encoded as text.
_UNUSED_SPECIAL = "<|lemur:unused-special|>"


def _encoders(sha256: str, plan: TiktokenPlan) -> tuple[Any, Any, Any]:
    """(tiktoken Encoding, piece regex, grouped piece regex) of a plan, once per process."""
    import regex
    import tiktoken

    if sha256 not in _encodings:
        encoding = tiktoken.Encoding(
            f"lemur-{sha256[:12]}",
            pat_str=plan.pattern,
            mergeable_ranks=plan.ranks,
            special_tokens={_UNUSED_SPECIAL: max(plan.ranks.values()) + 1},
        )
        pieces = regex.compile(plan.pattern)
        _encodings[sha256] = (encoding, pieces, regex.compile(grouped(plan.pattern)))
    return _encodings[sha256]


class ByteLevelTokenizer:
    """A tokenizer.json tokenizer, encoded by tiktoken where exact, else by `tokenizers`."""

    kind = "tokenizer.json"

    def __init__(self, files: HFTokenizerFiles, engine: str = "auto") -> None:
        if engine not in ENGINES:
            raise TokenizerError(f"tokenizer engine {engine!r}: expected one of {ENGINES}")
        self.files = files
        self.sha256 = files.sha256
        self.reference = _reference(str(files.path), files.sha256, files.data)
        self.vocab_size = int(self.reference.get_vocab_size(with_added_tokens=True))
        self.bos_id = self._special_id(files.bos) if files.bos else None
        self.eos_id = self._special_id(files.eos) if files.eos else None
        more = [i for i in files.generation_eos if i < self.vocab_size]
        self.stop_ids = tuple(dict.fromkeys(i for i in (self.eos_id, *more) if i is not None))
        self._tiktoken: Any = None
        # The id of tiktoken's stand-in special token, where tiktoken decodes as the file does
        # (every other id it knows is a base-vocabulary id: the same bytes as `tokenizers`).
        self._tiktoken_stand_in: int | None = None
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
        self._tiktoken, self._pieces, self._groups = _encoders(self.files.sha256, plan)
        self._restartable = restartable(plan.pattern)
        self._run_length = RunLengthBPE(plan.ranks)
        decoder = self.files.data.get("decoder") or {}
        if decoder.get("type") == "ByteLevel":  # bytes of the ids, nothing else: as tiktoken
            self._tiktoken_stand_in = self._tiktoken.encode_single_token(_UNUSED_SPECIAL)

    def encode(self, text: str) -> list[int]:
        """Ids of `text`: no BOS/EOS, special-token text encoded as text."""
        if self._tiktoken is None:
            return self.reference.encode(clean_text(text), add_special_tokens=False).ids
        text, long = self._prepare(text)
        return self._encode_long_pieces(text) if long else self._tiktoken.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` as a uint32 array, made without a Python int per id where tiktoken encodes."""
        if self._tiktoken is None:
            return np.asarray(self.encode(text), np.uint32)
        text, long = self._prepare(text)
        if long:
            return np.asarray(self._encode_long_pieces(text), np.uint32)
        return self._tiktoken.encode_to_numpy(text, disallowed_special=())

    def _prepare(self, text: str) -> tuple[str, bool]:
        """The text tiktoken's path encodes (lone surrogates replaced, NFC where the file
        normalizes), and whether it may hold a piece too long for tiktoken (`has_long_run`);
        its UTF-8 is made once for both checks."""
        try:
            data: bytes | None = text.encode("utf-8")
        except UnicodeEncodeError:
            text, data = clean_text(text), None
        if self._nfc and (normalized := unicodedata.normalize("NFC", text)) is not text:
            text, data = normalized, None
        # A text of fewer than MAX_RUN / 4 characters has fewer than MAX_RUN bytes.
        if len(text) < MAX_RUN // 4:
            return text, False
        return text, has_long_run(data if data is not None else text.encode("utf-8"))

    def _encode_long_pieces(self, text: str) -> list[int]:
        """tiktoken on the stretches between long pieces; `_piece_ids` on those, and on the
        pieces before each that a stretch may not end with (`stretch_cut`)."""
        ids: list[int] = []
        lo = 0
        if not self._restartable:  # every piece on its own: a stretch might split otherwise
            for match in self._pieces.finditer(text):
                ids += self._piece_ids(text, *match.span())
            return ids
        for piece in long_pieces(text, self._groups, self._pieces):
            cut, singles = stretch_cut(text, lo, piece, self._pieces)
            if lo < cut:
                ids += self._tiktoken.encode_ordinary(text[lo:cut])
            for s, e in [*singles, (piece.start, piece.end)]:
                ids += self._piece_ids(text, s, e)
            lo = piece.end
        if lo < len(text):
            ids += self._tiktoken.encode_ordinary(text[lo:])
        return ids

    def _piece_ids(self, text: str, start: int, end: int) -> list[int]:
        """The reference's ids of the piece `text[start:end]`."""
        if end - start > MAX_PIECE:
            runs = self._run_length.runs(text[start:end])
            merged = self._run_length.merge(runs) if runs is not None else None
            if merged is not None:
                return merged
        piece = text[start:end].encode("utf-8").decode("latin-1").translate(TO_BYTE_LEVEL)
        return [t.id for t in self.reference.model.tokenize(piece)]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """`encode_array` of each text (the build's tokenize stage)."""
        if self._tiktoken is not None:
            return [self.encode_array(t) for t in texts]
        return [np.asarray(ids, np.uint32) for ids in self.encode_batch(texts)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each text."""
        if self._tiktoken is not None:  # per text is faster than tiktoken's batch call
            return [self.encode(t) for t in texts]
        clean = [clean_text(t) for t in texts]
        out = self.reference.encode_batch_fast(clean, add_special_tokens=False)
        return [e.ids for e in out]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (special tokens spelled out; a numpy array's ids made ints at once).

        tiktoken decodes where it can (the FIM stage decodes what it rewrites): a ByteLevel
        decoder, only base-vocabulary ids (an added id, or one BPE cannot reach, is a KeyError
        there), valid UTF-8; otherwise `tokenizers` does, which replaces broken UTF-8 as its
        Rust side does."""
        ints = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        stand_in = self._tiktoken_stand_in
        if stand_in is not None and stand_in not in ints:
            try:
                return self._tiktoken.decode_bytes(ints).decode("utf-8")
            except (KeyError, OverflowError, UnicodeDecodeError):
                pass
        return self.reference.decode(ints, skip_special_tokens=False)

    def token_bytes(self) -> np.ndarray:
        """UTF-8 bytes of every id in the middle of a text; special tokens 0."""
        table = np.zeros(self.vocab_size, np.int64)
        for token, i in _vocabulary(self.files.data["model"]):
            b = token_to_bytes(token)
            table[i] = len(b) if b is not None else len(token.encode("utf-8"))
        for content, t in self.files.added.items():
            table[t["id"]] = 0 if t.get("special") else len(content.encode("utf-8"))
        return table

    def piece_id(self, piece: str) -> int | None:
        """The id of `piece` when it is one token."""
        i = self.reference.token_to_id(piece)
        return None if i is None else int(i)

    def is_control(self, i: int) -> bool:
        """Whether `i` is an added token, special or not: `encode` spells every added token's
        text as text (`_load_reference`), so no text encodes to one."""
        return any(t["id"] == i for t in self.files.added.values())

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

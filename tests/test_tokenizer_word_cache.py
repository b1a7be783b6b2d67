"""The word cache (lemur/tokenizer/word_cache.py): documents encoded stretch by stretch give
`encode`'s ids exactly, on real models (Llama-2-style SentencePiece with its dummy prefix,
one trained by the build's settings, with appended pieces) and hostile text; models where a
stretch's ids can depend on the text around it get no cache; the tokenize step writes the
same bytes with and without it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import is_utf8, pathological_texts, qwen_like_folder
from conftest import real_python_files, real_text_docs, train_sentencepiece
from datatrove.data import Document
from sentencepiece import sentencepiece_model_pb2 as pb

from lemur.data.encode.step import TokenizeWriter
from lemur.data.encode.tokenizer import extend_tokenizer
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.fim import FIM_PIECES
from lemur.tokenizer.fim_splice import WordSplicer
from lemur.tokenizer.word_cache import KEPT_CHARS, WordCache, lone_characters

HOSTILE = [
    "",
    "x",
    " ",
    "    ",
    "\n",
    "1 2  3   4\n",
    "  leading spaces and trailing   ",
    "\tdef f(a,  b):\n\t\treturn a  +b\n\n\n    # end   ",
    "é ü — 中文 😀  emoji🙂 and\u00a0nbsp \u2581literal\u2581marks ▁▁ x ▁ y▁ ▁z",
    "<s> </s> <PRE> ▁<SUF> <unk> tokens spelled as text  ",
    "9999999 000 \r\n\r\n crlf \x0b\x0c vt \x00 nul \x7f del",
    "a" * 300 + " " + "b" * 5,
    "x<|fim_prefix|> y <|file_sep|>z <fim_suffix> <|endoftext|>  <|im_start|>w",
    "v1.2.3-rc4 0x1F 3.14e-10 2026-12-02T14:05:22Z 1_000_000",
]


def _documents() -> list[str]:
    code = [p.read_text() for p in real_python_files(40)]
    text = [d["text"] for d in real_text_docs(60)]
    hostile = HOSTILE + [t[:20_000] for t in pathological_texts() if is_utf8(t)]
    return code + text + hostile + code[:10]  # seen again: from the cache


def _wrong(cache: WordCache, docs: list[str], batch: int = 7) -> list[str]:
    """The documents whose cached ids differ from the tokenizer's `encode`."""
    wrong = []
    for i in range(0, len(docs), batch):
        texts = docs[i : i + batch]
        for text, got in zip(texts, cache.encode(texts), strict=True):
            want = np.asarray(cache.tok.encode(text), cache.dtype)
            if not np.array_equal(np.frombuffer(got, cache.dtype), want):
                wrong.append(text[:40])
    return wrong


@pytest.fixture(scope="module")
def build_model_with_pieces(tokenizer_model, tmp_path_factory) -> Path:
    """The build-settings model with ChatML markers (user-defined) and CodeLlama's FIM
    pieces (control) appended."""
    out = tmp_path_factory.mktemp("wc") / "tokenizer.model"
    return extend_tokenizer(
        tokenizer_model, ("<|im_start|>", "<|im_end|>"), out, control=FIM_PIECES
    )


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
@pytest.mark.parametrize(
    "model", ["llama2_tokenizer", "tokenizer_model", "build_model_with_pieces"]
)
def test_cached_ids_equal_encode(model, dtype, request):
    """Real code, help text, hostile and pathological documents, in batches that reuse
    the cache and a cache so small it starts again: every id `encode`'s."""
    tok = open_tokenizer(request.getfixturevalue(model))
    cache = WordCache.for_tokenizer(tok, np.dtype(dtype))
    assert cache is not None
    docs = _documents()
    assert _wrong(cache, docs) == []
    assert len(cache) > 1000  # the documents went through the cache
    long = "a" * 300  # a stretch of HOSTILE's, encoded right (above) but not kept
    assert len(long) > KEPT_CHARS and long not in cache and " return" in cache
    small = WordCache(tok, np.dtype(dtype), lone_characters(tok), entries=50)
    texts = docs[:30] + HOSTILE
    assert _wrong(small, texts, batch=3) == []
    assert len(small) < len(set().union(*map(small.stretches, texts)))  # it started again


def test_lone_characters_of_the_build_model(tokenizer_model):
    """The build's settings (split digits, `\\n` and `\\t` user-defined) make digits,
    newlines and tabs lone; common letters and the space are not."""
    lone = lone_characters(open_tokenizer(tokenizer_model))
    assert set("0123456789\n\t") <= set(lone)
    assert not set("aet ") & set(lone)  # (an 800-piece model leaves `Z` or `;` lone)


def test_a_piece_holding_a_digit_makes_it_no_longer_lone(tokenizer_model, tmp_path):
    """With a piece `12`, digits are not lone: the cache splits no more at them, and a
    cache forced to split there gives other ids than `encode` (what the rule prevents)."""
    model = pb.ModelProto()
    model.ParseFromString(tokenizer_model.read_bytes())
    piece = model.pieces.add()
    piece.piece, piece.score, piece.type = "12", 10.0, 1  # NORMAL, scored to merge first
    (tmp_path / "digits.model").write_bytes(model.SerializeToString())
    tok = open_tokenizer(tmp_path / "digits.model")
    lone = lone_characters(tok)
    assert "1" not in lone and "2" not in lone and "3" in lone
    texts = ["x = 12 + 112", "v1.2 and 2012"]
    assert _wrong(WordCache.for_tokenizer(tok, np.dtype(np.uint16)), texts) == []
    forced = WordCache(tok, np.dtype(np.uint16), "0123456789")
    assert _wrong(forced, texts) == texts


def _with_piece(path: Path, out: Path, text: str, kind: int) -> Path:
    model = pb.ModelProto()
    model.ParseFromString(path.read_bytes())
    piece = model.pieces.add()
    piece.piece, piece.score, piece.type = text, 10.0, kind
    out.write_bytes(model.SerializeToString())
    return out


@pytest.mark.parametrize(
    ("piece", "kind"),
    [(")\u2581t", 5), ("a\u2581b", 1), ("\u2581\u2581if", 1)],
    ids=["unused-across", "normal-across", "two-spaces-then-word"],
)
def test_a_piece_across_a_word_start_refuses_the_cache(tokenizer_model, tmp_path, piece, kind):
    """A piece with `▁` after another character (unused pieces merge too), or two `▁`
    before a word (a literal `▁` before a space reads as such a run), refuses both the
    cache and the FIM splicer; a forced cache gives other ids than `encode`."""
    path = _with_piece(tokenizer_model, tmp_path / "m.model", piece, kind)
    tok = open_tokenizer(path)
    assert WordCache.for_tokenizer(tok, np.dtype(np.uint16)) is None
    assert WordSplicer.for_tokenizer(tok) is None
    if piece != "\u2581\u2581if":  # the cache itself keeps `▁ if` whole: only FIM's rule
        forced = WordCache(tok, np.dtype(np.uint16), lone_characters(tok))
        texts = ["f(x) to", "a b"]  # `)▁t` blocks `▁to` (measured on this model)
        assert _wrong(forced, texts) == [texts[piece[0] == "a"]]


def test_models_whose_stretches_can_merge_get_no_cache(tmp_path):
    """NFKC (the trainer's default), pieces across spaces, unigram, no byte fallback, and
    a byte-level tokenizer.json (its own engine caches words) get no cache."""
    cases = {
        "nfkc": {"model_type": "bpe"},
        "merged": {
            "model_type": "bpe",
            "normalization_rule_name": "identity",
            "split_by_whitespace": False,
        },
        "unigram": {
            "model_type": "unigram",
            "normalization_rule_name": "identity",
            "remove_extra_whitespaces": False,
        },
        "no-fallback": {
            "model_type": "bpe",
            "normalization_rule_name": "identity",
            "remove_extra_whitespaces": False,
            "byte_fallback": False,
        },
        "ok": {
            "model_type": "bpe",
            "normalization_rule_name": "identity",
            "remove_extra_whitespaces": False,
        },
    }
    got = {}
    for name, options in cases.items():
        (tmp_path / name).mkdir()
        tok = open_tokenizer(train_sentencepiece(tmp_path / name, **options))
        got[name] = WordCache.for_tokenizer(tok, np.dtype(np.uint16)) is not None
    assert got == {
        "nfkc": False,
        "merged": False,
        "unigram": False,
        "no-fallback": False,
        "ok": True,
    }
    texts = [p.read_text() for p in real_python_files(5)]
    folder = qwen_like_folder(tmp_path / "bpe", texts, vocab_size=600)
    assert WordCache.for_tokenizer(open_tokenizer(folder), np.dtype(np.uint16)) is None


@pytest.mark.parametrize("model", ["tokenizer_model", "llama2_tokenizer"])
def test_the_tokenize_step_writes_the_same_bytes_with_and_without_the_cache(
    model, tmp_path, monkeypatch, request
):
    """The token run, records and table of real documents: the same files either way (a
    model without and one with a dummy prefix)."""
    tokenizer_model = request.getfixturevalue(model)
    docs = [
        Document(text=t, id=f"d{i}", metadata={"source_index": 0, "language": "Python"})
        for i, t in enumerate(_documents()[:60])
    ]

    def run(out: Path) -> dict[str, bytes]:
        step = TokenizeWriter(str(tokenizer_model), str(out), batch_docs=16)
        fresh = (Document(text=d.text, id=d.id, metadata=dict(d.metadata)) for d in docs)
        list(step.run(fresh))
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    used = []
    original = WordCache.for_tokenizer.__func__

    def spy(cls, tok, dtype):
        cache = original(cls, tok, dtype)
        used.append(cache is not None)
        return cache

    monkeypatch.setattr(WordCache, "for_tokenizer", classmethod(spy))
    cached = run(tmp_path / "cached")
    monkeypatch.setattr(WordCache, "for_tokenizer", classmethod(lambda cls, tok, dtype: None))
    plain = run(tmp_path / "plain")
    assert used == [True]
    assert cached.keys() == plain.keys() and "00000.bin" in cached
    assert cached == plain
    table = json.loads(cached["00000.json"])
    assert table["dtype"] == "uint16"


def test_big_endian_dtype_bytes_are_swapped(tokenizer_model):
    """The cache writes the dtype's byte order, not the machine's."""
    tok = open_tokenizer(tokenizer_model)
    text = "def f(x):\n    return x + 1\n"
    for dtype in (np.dtype("<u2"), np.dtype(">u2"), np.dtype(">u4")):
        cache = WordCache(tok, dtype, lone_characters(tok))
        got = np.frombuffer(cache.encode([text])[0], dtype)
        assert got.tolist() == tok.encode(text)


def test_unused_and_multi_character_user_pieces(tokenizer_model, tmp_path):
    """Unused pieces within words (merged, then split back) keep the cache and its ids; a
    user-defined `\\n\\n` makes `\\n` no longer lone, and a `▁`-led user-defined piece is
    matched inside its stretch."""
    model = pb.ModelProto()
    model.ParseFromString(tokenizer_model.read_bytes())
    for text, kind in (("qz", 5), ("zv", 5), ("qzv", 5), ("\n\n", 4), ("\u2581<|x|>", 4)):
        piece = model.pieces.add()
        piece.piece, piece.score, piece.type = text, 10.0, kind
    (tmp_path / "m.model").write_bytes(model.SerializeToString())
    tok = open_tokenizer(tmp_path / "m.model")
    cache = WordCache.for_tokenizer(tok, np.dtype(np.uint16))
    assert cache is not None and "\n" not in lone_characters(tok)
    texts = ["aqzv qz zvq\n\n\nx <|x|> y<|x|>\n\n", *_documents()[:20], *HOSTILE]
    assert _wrong(cache, texts) == []

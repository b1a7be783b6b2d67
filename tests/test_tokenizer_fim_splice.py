"""The FIM splicer (lemur/tokenizer/fim_splice.py): FIM ids from a document's own ids equal
`encode_parts` of the same cut, on real models (Llama-2-style SentencePiece from the
mistral-common wheel, one trained by the build's settings, Llama-3 with Qwen2.5-Coder's
tokens on both engines, a byte-level BPE trained here with StarCoder's) and hostile text;
models where a word's ids can depend on the text around it get no splicer."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import (
    QWEN_CODER_TOKENS,
    add_tokens,
    is_utf8,
    llama3_folder,
    pathological_texts,
    qwen_like_folder,
)
from conftest import real_python_files, real_text_docs, train_sentencepiece

from lemur.data.encode.tokenizer import extend_tokenizer
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.fim import (
    FIM_PIECES,
    CodeMarkers,
    encode_parts,
    fim_layout,
    fim_parts,
    find_code_markers,
)
from lemur.tokenizer.fim_splice import WordSplicer

HOSTILE = [
    "",
    "x",
    " ",
    "    ",
    "1 2  3   4\n",
    "  leading spaces and trailing   ",
    "\tdef f(a,  b):\n\t\treturn a  +b\n\n\n    # end   ",
    "é ü — 中文 😀  emoji🙂 and\u00a0nbsp \u2581literal\u2581marks ▁▁ x",
    "<s> </s> <PRE> ▁<SUF> <unk> tokens spelled as text  ",
    "9999999 000 \r\n\r\n crlf \x0b\x0c vt",
    "a" * 300 + " " + "b" * 5,
    "x<|fim_prefix|> y <|file_sep|>z <fim_suffix> <|endoftext|>  <|im_start|>w",
]


@pytest.fixture(scope="module")
def spm_fim(llama2_tokenizer, tmp_path_factory) -> Path:
    """Llama-2-style SentencePiece (mistral-common v1) with CodeLlama's four pieces appended."""
    out = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    return extend_tokenizer(llama2_tokenizer, (), out, control=FIM_PIECES)


def _documents() -> list[str]:
    hostile = HOSTILE + [t[:3000] for t in pathological_texts() if t and is_utf8(t)]
    code = [p.read_text()[:4000] for p in real_python_files(14)[4:]]
    return code + [d["text"][:2500] for d in real_text_docs(6)] + hostile


def _cuts(text: str, rng: random.Random, n: int) -> list[tuple[int, int]]:
    """Cut points: both ends, next to every space of a few, and random ones."""
    size = len(text)
    points = {0, size, min(1, size), max(size - 1, 0)}
    spaces = [i for i, c in enumerate(text) if c == " "]
    for i in rng.sample(spaces, min(6, len(spaces))):
        points |= {max(i - 1, 0), i, min(i + 1, size)}
    points |= {rng.randint(0, size) for _ in range(6)}
    points_list = sorted(points)
    pairs = {(a, b) for a in points_list for b in points_list if a <= b}
    return sorted(rng.sample(sorted(pairs), min(n, len(pairs))))


def _compare(splicer: WordSplicer, markers: CodeMarkers, n_cuts: int = 40) -> tuple[int, list]:
    """(cuts checked, the cuts whose spliced ids differ from `encode_parts`'s)."""
    tok = splicer.tok
    rng = random.Random(0)
    checked, wrong = 0, []
    for text in _documents():
        doc_ids = np.asarray(tok.encode(text), np.uint32)
        text = tok.decode(doc_ids)  # the FIM stage cuts the decoded text
        for a, b in _cuts(text, rng, n_cuts):
            for spm_order in (False, True):
                layout = fim_layout(a, b, len(text), markers, spm=spm_order)
                want = encode_parts(
                    tok, fim_parts(text[:a], text[a:b], text[b:], markers, spm=spm_order)
                )
                if splicer.ids(layout, text, doc_ids) != want:
                    wrong.append((text[:40], a, b, spm_order))
                checked += 1
    return checked, wrong


@pytest.fixture(scope="module")
def lemur_trained_fim(tokenizer_model, tmp_path_factory) -> Path:
    """A BPE trained by the build's own settings (no dummy prefix, whitespace-only pieces,
    `\n` and `\t` user-defined), with CodeLlama's four pieces appended."""
    out = tmp_path_factory.mktemp("lemur-spm") / "tokenizer.model"
    return extend_tokenizer(tokenizer_model, (), out, control=FIM_PIECES)


@pytest.mark.parametrize("joined", [True, False], ids=["codellama-spm", "spm-apart"])
@pytest.mark.parametrize("model", ["spm_fim", "lemur_trained_fim"])
def test_splicer_equals_encode_parts(model, joined, request):
    """Every cut of real and hostile documents, PSM and SPM: the same ids as encoding the
    three parts; SPM's prefix and middle joined (CodeLlama) or encoded apart (Megatron)."""
    tok = open_tokenizer(request.getfixturevalue(model))
    markers = find_code_markers(tok)
    assert markers is not None and markers.style == "codellama"
    if not joined:
        markers = dataclasses.replace(markers, style="recipe")
        assert not markers.joins_spm
    splicer = WordSplicer.for_tokenizer(tok)
    assert splicer is not None
    checked, wrong = _compare(splicer, markers)
    assert checked > 2000 and wrong == []


@pytest.fixture(scope="module")
def llama3_qwen_fim(tmp_path_factory) -> Path:
    """Llama-3's tokenizer (llama-models wheel) with Qwen2.5-Coder's tokens, not special."""
    folder = llama3_folder(tmp_path_factory.mktemp("l3") / "fim")
    return add_tokens(folder, QWEN_CODER_TOKENS, special=False)


@pytest.fixture(scope="module")
def bpe_starcoder(tmp_path_factory) -> Path:
    """A byte-level BPE trained on stdlib code and text, with StarCoder's FIM tokens (its
    merges are not tiktoken's: `tokenizers` encodes it)."""
    texts = [p.read_text() for p in real_python_files(30)] + [d["text"] for d in real_text_docs(30)]
    folder = qwen_like_folder(tmp_path_factory.mktemp("bpe"), texts, vocab_size=2000)
    starcoder = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>"]
    return add_tokens(folder, starcoder, special=True)


@pytest.mark.parametrize(
    ("model", "engine", "style"),
    [
        ("llama3_qwen_fim", "auto", "qwen2.5-coder"),
        ("llama3_qwen_fim", "tokenizers", "qwen2.5-coder"),
        ("bpe_starcoder", "auto", "starcoder"),
    ],
)
def test_byte_level_splicer_equals_encode_parts(model, engine, style, request):
    """The same on byte-level BPE: every cut, PSM and SPM, the ids of encoding the parts."""
    tok = open_tokenizer(request.getfixturevalue(model), engine=engine)
    assert tok.engine == (
        "tiktoken" if model == "llama3_qwen_fim" and engine == "auto" else "tokenizers"
    )
    markers = find_code_markers(tok)
    assert markers is not None and markers.style == style
    splicer = WordSplicer.for_tokenizer(tok)
    assert splicer is not None
    checked, wrong = _compare(splicer, markers, n_cuts=25)
    assert checked > 1500 and wrong == []


def test_models_whose_words_can_merge_get_no_splicer(tmp_path):
    (tmp_path / "nfkc").mkdir()
    nfkc = train_sentencepiece(tmp_path / "nfkc", model_type="bpe")
    assert WordSplicer.for_tokenizer(open_tokenizer(nfkc)) is None  # default: nmt_nfkc
    (tmp_path / "merged").mkdir()
    merged = train_sentencepiece(
        tmp_path / "merged",
        model_type="bpe",
        normalization_rule_name="identity",
        split_by_whitespace=False,
    )
    (tmp_path / "unigram").mkdir()
    unigram = train_sentencepiece(
        tmp_path / "unigram",
        model_type="unigram",
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
    )
    # Its best path breaks ties by floating-point rounding of the whole text's sum: the
    # same word (`\n*****`: `** * **` or `** ** *`) is cut by what comes before it, so
    # splicing would give other ids than encoding the parts, as this forced splicer shows.
    tok = open_tokenizer(unigram)
    markers = CodeMarkers(style="recipe", prefix=0, middle=1, suffix=2)
    not_space = bytes(b != 0x20 for b in range(256))  # a word start as SentencePiece's
    checked, wrong = _compare(WordSplicer(tok, tok.encode_chat, not_space), markers, n_cuts=10)
    assert len(wrong) > 0
    assert WordSplicer.for_tokenizer(open_tokenizer(unigram)) is None
    tok = open_tokenizer(merged)
    pieces = [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]
    assert any("\u2581" in p.lstrip("\u2581") for p in pieces)  # a piece spans a word start
    assert WordSplicer.for_tokenizer(tok) is None


def test_an_unused_piece_across_a_word_start_refuses_the_splicer(llama2_tokenizer, tmp_path):
    """SentencePiece's BPE merges through UNUSED pieces (and splits them back afterwards):
    one holding `▁` after another character changes the next word's ids."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    model.ParseFromString(llama2_tokenizer.read_bytes())
    piece = model.pieces.add()
    piece.piece, piece.score, piece.type = ")\u2581t", 10.0, 5  # UNUSED
    (tmp_path / "unused.model").write_bytes(model.SerializeToString())
    tok = open_tokenizer(tmp_path / "unused.model")
    text = "f(x) then go"
    doc_ids = np.asarray(tok.encode(text), np.uint32)
    markers = CodeMarkers(style="recipe", prefix=0, middle=1, suffix=2)
    layout = fim_layout(0, 4, len(text), markers, spm=False)
    want = encode_parts(tok, fim_parts("", "f(x)", " then go", markers, spm=False))
    not_space = bytes(b != 0x20 for b in range(256))
    assert WordSplicer(tok, tok.encode_chat, not_space).ids(layout, text, doc_ids) != want
    assert WordSplicer.for_tokenizer(tok) is None


def test_text_an_nfc_model_would_normalize_is_not_spliced(llama3_qwen_fim, tmp_path):
    """With an NFC normalizer, a text that is not NFC is not what its ids decode to."""
    import shutil

    folder = tmp_path / "nfc"
    shutil.copytree(llama3_qwen_fim, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "NFC"}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    tok = open_tokenizer(folder)
    splicer = WordSplicer.for_tokenizer(tok)
    assert splicer is not None and splicer.nfc
    markers = find_code_markers(tok)
    raw = "e\u0301e\u0301 a b c d e f g h \u0344"  # decomposed: NFC composes it
    layout = fim_layout(7, 16, len(raw), markers, spm=False)
    assert splicer.ids(layout, raw, np.asarray(tok.encode(raw), np.uint32)) is None
    text = tok.decode(tok.encode(raw))  # what the FIM stage cuts: the ids' own text
    assert text != raw
    layout = fim_layout(7, 16, len(text), markers, spm=False)
    want = encode_parts(tok, fim_parts(text[:7], text[7:16], text[16:], markers, spm=False))
    assert splicer.ids(layout, text, np.asarray(tok.encode(text), np.uint32)) == want


def test_byte_level_models_that_split_otherwise_get_no_splicer(tmp_path):
    """A tokenizer.json whose regex keeps a line whole, or one that is not byte-level."""
    texts = [p.read_text() for p in real_python_files(5)]
    folder = qwen_like_folder(tmp_path / "bpe", texts, vocab_size=600)
    assert WordSplicer.for_tokenizer(open_tokenizer(folder)) is not None
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"[^\n]+\n?|\n"
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "tokenizer.json").write_text(json.dumps(spec))
    assert WordSplicer.for_tokenizer(open_tokenizer(tmp_path / "lines")) is None
    spec["pre_tokenizer"] = {
        "type": "Metaspace",
        "replacement": "\u2581",
        "prepend_scheme": "first",
        "split": True,
    }
    (tmp_path / "metaspace").mkdir()
    (tmp_path / "metaspace" / "tokenizer.json").write_text(json.dumps(spec))
    assert WordSplicer.for_tokenizer(open_tokenizer(tmp_path / "metaspace")) is None


def test_ids_that_are_not_the_texts_give_none(spm_fim):
    tok = open_tokenizer(spm_fim)
    splicer = WordSplicer.for_tokenizer(tok)
    text = "def add(a, b):\n    return a + b\n"
    markers = find_code_markers(tok)
    layout = fim_layout(4, 20, len(text), markers, spm=False)
    longer = np.asarray(tok.encode("def add(a, b):\n    return a + b\n\n"), np.uint32)
    with_unknown = np.concatenate([[tok.sp.unk_id()], tok.encode(text)]).astype(np.uint32)
    assert splicer.ids(layout, text, np.asarray(tok.encode(text), np.uint32)) is not None
    assert splicer.ids(layout, text, longer) is None  # the byte count differs
    assert splicer.ids(layout, text, with_unknown) is None

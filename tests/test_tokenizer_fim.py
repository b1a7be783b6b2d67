"""FIM markers and FIM ids on real tokenizers: Llama-3 (llama-models wheel) with Qwen2.5-Coder's
added FIM tokens, Llama-2-style SentencePiece (mistral-common wheel) with CodeLlama's pieces
appended, and a byte-level BPE trained here with StarCoder's special tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from bytelevel_fixtures import QWEN_CODER_TOKENS, add_tokens, llama3_folder, qwen_like_folder
from conftest import real_python_files, real_text_docs

from lemur.data.encode.tokenizer import extend_tokenizer
from lemur.data.fim.cut import fim_split
from lemur.data.recipe.fim import FimConfig
from lemur.tokenizer import TokenizerError, open_tokenizer
from lemur.tokenizer.fim import (
    FIM_PIECES,
    MARKER_STYLES,
    CodeMarkers,
    decode_continuing,
    encode_parts,
    fim_parts,
    fim_prompt_ids,
    find_code_markers,
)

STARCODER = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>"]


@pytest.fixture(scope="module")
def llama3_plain(tmp_path_factory) -> Path:
    """Llama-3's tokenizer folder (no FIM tokens)."""
    return llama3_folder(tmp_path_factory.mktemp("l3-plain"))


@pytest.fixture(scope="module")
def llama3_qwen_fim(llama3_plain, tmp_path_factory) -> Path:
    """Llama-3's tokenizer with Qwen2.5-Coder's FIM and repository tokens, not special."""
    import shutil

    folder = tmp_path_factory.mktemp("l3") / "fim"
    shutil.copytree(llama3_plain, folder)
    return add_tokens(folder, QWEN_CODER_TOKENS, special=False)


@pytest.fixture(scope="module")
def bpe_starcoder(tmp_path_factory) -> Path:
    """A byte-level BPE trained on stdlib code and text, with StarCoder2's special tokens."""
    texts = [p.read_text() for p in real_python_files(30)] + [d["text"] for d in real_text_docs(30)]
    folder = qwen_like_folder(tmp_path_factory.mktemp("bpe"), texts, vocab_size=2000)
    return add_tokens(folder, STARCODER, special=True)


@pytest.fixture(scope="module")
def spm_fim(llama2_tokenizer, tmp_path_factory) -> Path:
    """Llama-2-style SentencePiece (mistral-common v1) with CodeLlama's four pieces appended."""
    out = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    return extend_tokenizer(llama2_tokenizer, (), out, control=FIM_PIECES)


def _documents(n: int = 12) -> list[str]:
    """Real code with non-ASCII text: stdlib modules (cut short) and text documents."""
    code = [p.read_text()[:3000] for p in real_python_files(n)]
    return code + ["# é ü — 中文 😀\n" + d["text"][:1500] for d in real_text_docs(4)]


def test_markers_found_by_family(llama3_qwen_fim, bpe_starcoder, spm_fim, llama3_plain):
    qwen = find_code_markers(open_tokenizer(llama3_qwen_fim))
    assert qwen == CodeMarkers(
        style="qwen2.5-coder",
        prefix=128256,
        middle=128257,
        suffix=128258,
        pad=128259,
        repo_name=128260,
        file_sep=128261,
    )
    star = find_code_markers(open_tokenizer(bpe_starcoder))
    assert star is not None and star.style == "starcoder" and star.file_sep is not None
    assert star.repo_name is None  # this vocabulary has no <repo_name>
    spm = find_code_markers(open_tokenizer(spm_fim))
    assert spm == CodeMarkers(
        style="codellama", prefix=32000, suffix=32001, middle=32002, eot=32003
    )
    assert find_code_markers(open_tokenizer(llama3_plain)) is None


def test_markers_named_by_recipe(llama3_qwen_fim):
    tok = open_tokenizer(llama3_qwen_fim)
    names = {"prefix": "<|fim_suffix|>", "middle": "<|fim_middle|>", "suffix": "<|fim_prefix|>"}
    named = find_code_markers(tok, names)
    assert (named.style, named.prefix, named.suffix, named.pad) == ("recipe", 128258, 128256, None)
    with pytest.raises(TokenizerError, match="has no token '<nope>'"):
        find_code_markers(tok, {**names, "eot": "<nope>"})
    with pytest.raises(TokenizerError, match="no 'suffix' token"):
        find_code_markers(tok, {"prefix": "<|fim_prefix|>", "middle": "<|fim_middle|>"})


def test_named_markers_must_be_tokens_text_never_encodes_to(llama2_tokenizer, spm_fim):
    """`def`, `class`, `return` are ids every Python file encodes to: refused as markers
    (#44 item 14); CodeLlama's appended control pieces are taken."""
    words = {"prefix": "def", "middle": "class", "suffix": "return"}
    with pytest.raises(TokenizerError, match=r"'def' \(fim.markers.prefix\) is an ordinary"):
        find_code_markers(open_tokenizer(llama2_tokenizer), words)
    pieces = {"prefix": "\u2581<PRE>", "middle": "\u2581<MID>", "suffix": "\u2581<SUF>"}
    named = find_code_markers(open_tokenizer(spm_fim), pieces)
    assert (named.prefix, named.suffix, named.middle) == (32000, 32001, 32002)


def test_deepseek_markers(tmp_path):
    texts = [p.read_text() for p in real_python_files(5)]
    names = list(MARKER_STYLES["deepseek-coder"].values())
    folder = add_tokens(qwen_like_folder(tmp_path, texts, vocab_size=600), names, special=False)
    found = find_code_markers(open_tokenizer(folder))
    assert found is not None and found.style == "deepseek-coder"
    tok = open_tokenizer(folder)
    assert [found.prefix, found.suffix, found.middle] == [
        tok.piece_id("<\uff5cfim\u2581begin\uff5c>"),
        tok.piece_id("<\uff5cfim\u2581hole\uff5c>"),
        tok.piece_id("<\uff5cfim\u2581end\uff5c>"),
    ]


def _cuts(text: str, n: int = 4):
    settings = FimConfig(rate=1.0, spm_rate=0.5)
    for k in range(n):
        cut = fim_split(text, settings, f"doc-{k}", seed=7)
        yield cut.prefix, cut.middle, cut.suffix


@pytest.mark.parametrize("engine", ["auto", "tokenizers"])
@pytest.mark.parametrize("folder", ["llama3_qwen_fim", "bpe_starcoder"])
def test_ids_equal_the_reference_encoding_of_the_fim_string(folder, engine, request):
    """A tokenizer.json model's FIM prompt is a string whose markers `tokenizers` splits
    out: our ids are its encoding of `<PRE>pre<SUF>suf<MID>mid`, PSM and SPM."""
    from tokenizers import Tokenizer

    path = request.getfixturevalue(folder)
    tok = open_tokenizer(path, engine=engine)
    ref = Tokenizer.from_file(str(path / "tokenizer.json"))  # markers matched in the string
    markers = find_code_markers(tok)
    names = MARKER_STYLES[markers.style]
    pre_t, mid_t, suf_t = names["prefix"], names["middle"], names["suffix"]
    for text in _documents():
        for pre, mid, suf in _cuts(text):
            psm = encode_parts(tok, fim_parts(pre, mid, suf, markers, spm=False))
            assert (
                psm
                == ref.encode(f"{pre_t}{pre}{suf_t}{suf}{mid_t}{mid}", add_special_tokens=False).ids
            )
            spm = encode_parts(tok, fim_parts(pre, mid, suf, markers, spm=True))
            want = [*ref.encode(f"{pre_t}{suf_t}{suf}{mid_t}{pre}", add_special_tokens=False).ids]
            want += ref.encode(
                mid, add_special_tokens=False
            ).ids  # Megatron: the middle encoded on its own
            assert spm == want


def test_sentencepiece_ids_follow_codellama(spm_fim):
    """CodeLlama's `infilling_prompt_tokens` / paper: the prefix with the dummy-prefix space,
    suffix and middle without (`encode_infilling`: encode("☺" + s)[2:]); in SPM, prefix and
    middle as one text; `▁<EOT>` after the middle."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_fim))
    tok = open_tokenizer(spm_fim)
    m = find_code_markers(tok)

    def infilling(s: str) -> list[int]:
        return sp.encode("\u263a" + s)[2:]

    for text in _documents():
        for pre, mid, suf in _cuts(text):
            psm = encode_parts(tok, fim_parts(pre, mid, suf, m, spm=False))
            assert psm == [
                m.prefix,
                *sp.encode(pre),
                m.suffix,
                *infilling(suf),
                m.middle,
                *infilling(mid),
                m.eot,
            ]
            assert encode_parts(tok, fim_parts(pre, mid, suf, m, spm=True)) == [
                m.prefix,
                m.suffix,
                *infilling(suf),
                m.middle,
                *sp.encode(pre + mid),
                m.eot,
            ]


def _decode_continuing(tok, ids: list[int]) -> str:
    """CodeLlama's `decode_infilling` for SentencePiece (decode after a sentinel piece, so no
    leading space is dropped as the dummy prefix's); plain decode otherwise. Also checks
    `decode_continuing`, which `lemur-eval infill` decodes a middle with, against it."""
    want = tok.decode(ids)
    if tok.kind == "sentencepiece":
        want = tok.decode([tok.piece_id("\u263a"), *ids])[1:]
    assert decode_continuing(tok, ids) == want
    return want


@pytest.mark.parametrize("folder", ["llama3_qwen_fim", "bpe_starcoder", "spm_fim"])
def test_fim_documents_decode_to_the_three_parts(folder, request):
    """Cut at the marker ids, the ids decode to exactly the parts, in PSM or SPM order."""
    path = request.getfixturevalue(folder)
    tok = open_tokenizer(path)
    m = find_code_markers(tok)
    for text in _documents(6):
        for pre, mid, suf in _cuts(text, 6):
            for spm in (False, True):
                ids = encode_parts(tok, fim_parts(pre, mid, suf, m, spm=spm))
                end = len(ids) - (m.eot is not None)
                assert m.eot is None or ids[-1] == m.eot
                at = {i: ids.index(i) for i in (m.prefix, m.suffix, m.middle)}
                assert sorted(at, key=at.get) == [m.prefix, m.suffix, m.middle]
                suffix = _decode_continuing(tok, ids[at[m.suffix] + 1 : at[m.middle]])
                assert suffix == suf
                if spm:  # <PRE> <SUF> suffix <MID> prefix middle
                    assert at[m.prefix] == 0 and at[m.suffix] == 1
                    tail = ids[at[m.middle] + 1 : end]
                    assert tok.decode(tail) == pre + mid
                else:  # <PRE> prefix <SUF> suffix <MID> middle
                    assert at[m.prefix] == 0
                    assert tok.decode(ids[1 : at[m.suffix]]) == pre
                    assert _decode_continuing(tok, ids[at[m.middle] + 1 : end]) == mid


def test_text_that_spells_a_marker_never_gets_its_id(llama3_qwen_fim, spm_fim, bpe_starcoder):
    """A code file spelling `<|fim_prefix|>` (a non-special added token that `tokenizers`
    matches inside text) or `<PRE>` is encoded as its characters, on every engine."""
    doc = (
        "PRE = '<|fim_prefix|>'  # <|fim_middle|><|fim_suffix|><|file_sep|><|repo_name|>\n"
        "x = ' <PRE> <SUF> <MID> <EOT>' + \u2581<PRE> + '<fim_prefix><file_sep>'\n"
    )
    for path, engines in ((llama3_qwen_fim, ("auto", "tokenizers")), (bpe_starcoder, ("auto",))):
        for engine in engines:
            tok = open_tokenizer(path, engine=engine)
            m = find_code_markers(tok)
            ids = encode_parts(tok, fim_parts(doc[:30], doc[30:90], doc[90:], m, spm=False))
            assert [i for i in ids if i in m.ids] == [m.prefix, m.suffix, m.middle]
            assert not set(tok.encode(doc)) & set(m.ids)
            assert tok.decode(tok.encode(doc)) == doc
    tok = open_tokenizer(spm_fim)
    m = find_code_markers(tok)
    assert not set(tok.encode(doc)) & set(m.ids)
    ids = encode_parts(tok, fim_parts(doc[:30], doc[30:90], doc[90:], m, spm=True))
    assert [i for i in ids if i in m.ids] == [m.prefix, m.suffix, m.middle, m.eot]


@pytest.mark.parametrize("folder", ["llama3_qwen_fim", "spm_fim"])
def test_prompt_is_the_training_document_up_to_the_middle(folder, request):
    path = request.getfixturevalue(folder)
    tok = open_tokenizer(path)
    m = find_code_markers(tok)
    head = [] if tok.bos_id is None else [tok.bos_id]
    text = real_python_files(1)[0].read_text()[:2000]
    for pre, mid, suf in _cuts(text):
        doc = head + encode_parts(tok, fim_parts(pre, mid, suf, m, spm=False))
        prompt = fim_prompt_ids(tok, m, pre, suf, spm=False)
        assert prompt == doc[: len(prompt)] and doc[len(prompt) - 1] == m.middle
        spm_prompt = fim_prompt_ids(tok, m, pre, suf, spm=True)
        assert spm_prompt[: len(head) + 2] == [*head, m.prefix, m.suffix]
        assert spm_prompt[len(head) + 2 :].index(m.middle) >= 0
    assert fim_prompt_ids(tok, m, "a", "b", spm=False, bos_id=None)[0] == m.prefix


def test_appended_pieces_keep_every_id_and_are_control(llama2_tokenizer, spm_fim, tmp_path):
    import sentencepiece as spm

    old = spm.SentencePieceProcessor(model_file=str(llama2_tokenizer))
    new = spm.SentencePieceProcessor(model_file=str(spm_fim))
    assert new.vocab_size() == old.vocab_size() + 4
    assert all(old.id_to_piece(i) == new.id_to_piece(i) for i in range(old.vocab_size()))
    assert all(new.is_control(i) for i in range(old.vocab_size(), new.vocab_size()))
    again = extend_tokenizer(spm_fim, (), tmp_path / "again.model", control=FIM_PIECES)
    assert again.read_bytes() == spm_fim.read_bytes()  # extending twice changes nothing
    # A model that has the markers as user-defined pieces (matched inside text) gets them as
    # control pieces, at the same ids.
    user = extend_tokenizer(llama2_tokenizer, FIM_PIECES, tmp_path / "user.model")
    assert spm.SentencePieceProcessor(model_file=str(user)).encode(" <PRE>")[-1] == 32000
    fixed = extend_tokenizer(user, (), tmp_path / "fixed.model", control=FIM_PIECES)
    sp = spm.SentencePieceProcessor(model_file=str(fixed))
    assert sp.piece_to_id("\u2581<PRE>") == 32000 and 32000 not in sp.encode(" <PRE>")
    assert list(FIM_PIECES) == ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]

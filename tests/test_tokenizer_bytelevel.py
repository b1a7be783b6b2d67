"""The tokenizer.json engine against the `tokenizers` reference, on real tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bytelevel_fixtures import (
    llama3_folder,
    lossy_folder,
    mistral_folder,
    pathological_texts,
    qwen_like_folder,
    reference_ids,
    tekken_folder,
    with_byte_fallback,
)
from conftest import real_python_files, real_text_docs

from lemur.tokenizer import (
    ByteLevelTokenizer,
    SentencePieceTokenizer,
    TokenBytes,
    TokenizerError,
    open_tokenizer,
    read_hf_tokenizer,
)
from lemur.tokenizer.long_pieces import MAX_RUN, has_long_run
from lemur.tokenizer.round_trip import PROBE, round_trip_problem
from lemur.tokenizer.tiktoken_exact import restartable

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def real_documents(n_code: int = 120, n_text: int = 60) -> list[str]:
    """Real code (stdlib modules) and real English text (pydoc topics)."""
    code = [p.read_text(encoding="utf-8") for p in real_python_files(n_code)]
    return code + [d["text"] for d in real_text_docs(n_text)]


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Path:
    return llama3_folder(tmp_path_factory.mktemp("llama3"))


@pytest.fixture(scope="module")
def tekken(tmp_path_factory) -> Path:
    return tekken_folder(tmp_path_factory.mktemp("tekken"))


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory) -> Path:
    return qwen_like_folder(tmp_path_factory.mktemp("qwen"), real_documents(40, 20))


def assert_reference_ids(folder: Path, tok: ByteLevelTokenizer, texts: list[str]) -> None:
    for i, text in enumerate(texts):
        got, want = tok.encode(text), reference_ids(folder, text)
        assert got == want, f"document {i} ({text[:40]!r}...): ids differ from tokenizers'"


def test_llama3_is_encoded_by_tiktoken_with_the_reference_ids(llama3):
    tok = open_tokenizer(llama3)
    assert (tok.engine, tok.bos_id, tok.eos_id, tok.vocab_size) == (
        "tiktoken",
        128000,
        128001,
        128256,
    )
    assert_reference_ids(llama3, tok, real_documents() + pathological_texts())
    batch = real_documents(10, 5)
    assert tok.encode_batch(batch) == [reference_ids(llama3, t) for t in batch]


def test_tekken_is_encoded_by_tiktoken_with_the_reference_ids(tekken):
    tok = open_tokenizer(tekken)
    assert (tok.engine, tok.bos_id, tok.eos_id, tok.vocab_size) == ("tiktoken", 1, 2, 131072)
    assert_reference_ids(tekken, tok, real_documents(40, 20) + pathological_texts())


@pytest.mark.parametrize("folder", ["llama3", "tekken"])
def test_decode_equals_the_reference_decode(folder, request, monkeypatch):
    """tiktoken decodes valid UTF-8 of base-vocabulary ids (shown by decoding with the
    `tokenizers` reference removed); ids with special tokens or cutting a character in two
    go to the reference: every text equals `tokenizers`' decode."""
    from tokenizers import Tokenizer

    path = request.getfixturevalue(folder)
    tok = open_tokenizer(path)
    ref = Tokenizer.from_file(str(path / "tokenizer.json"))
    docs = [tok.encode(t) for t in real_documents(20, 10) + pathological_texts() if t]
    accent = tok.encode("é")
    if len(accent) == 1:  # a character whose bytes are two tokens elsewhere
        accent = tok.encode("\U0001f9ec")
    cases = [
        *docs,
        [tok.bos_id, *docs[0][:20], tok.eos_id],
        docs[1][:7] + [tok.eos_id] + docs[1][7:15],
        accent[:1],
        accent[1:] + docs[2][:5],
    ]
    want = [ref.decode(ids, skip_special_tokens=False) for ids in cases]
    assert [tok.decode(ids) for ids in cases] == want
    assert tok.decode(np.asarray(docs[3], np.uint32)) == want[3]
    assert "\ufffd" in want[-2]  # a broken character: the reference's replacement
    monkeypatch.setattr(tok, "reference", None)  # valid text never needs it
    assert [tok.decode(ids) for ids in docs] == want[: len(docs)]


def test_a_trained_bpe_falls_back_to_tokenizers_and_says_why(qwen_like):
    tok = open_tokenizer(qwen_like)
    # A trained BPE does not list every way to write a token as a merge: tiktoken would
    # merge pairs the reference never merges.
    assert tok.engine == "tokenizers"
    assert "which is no merge" in tok.info()["engine_reason"]
    assert (tok.bos_id, tok.eos_id) == (None, 0)  # Qwen2.5: no BOS, <|endoftext|> ends a document
    assert_reference_ids(qwen_like, tok, real_documents(30, 10) + pathological_texts()[2:])
    with pytest.raises(TokenizerError, match="tiktoken is not exact: .* which is no merge"):
        ByteLevelTokenizer(read_hf_tokenizer(qwen_like), engine="tiktoken")


def test_without_ignore_merges_unreachable_tokens_are_left_out_of_tiktoken(llama3, tmp_path):
    # Qwen2's tokenizer.json has ignore_merges false and an NFC normalizer: a whole piece is
    # never looked up in the vocabulary, so tokens its merges cannot reach must never be output.
    spec = json.loads((llama3 / "tokenizer.json").read_text())
    spec["model"]["ignore_merges"] = False
    spec["normalizer"] = {"type": "NFC"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    tok = open_tokenizer(tmp_path / "tokenizer.json")
    assert tok.engine == "tiktoken"
    assert len(tok._tiktoken._mergeable_ranks) < 128000  # some tokens are unreachable
    assert_reference_ids(tmp_path, tok, real_documents(30, 10) + pathological_texts())


def test_special_token_text_stays_text(llama3):
    tok = open_tokenizer(llama3)
    ids = tok.encode("<|begin_of_text|><|eot_id|>")
    assert (
        128000 not in ids and 128009 not in ids and tok.decode(ids) == "<|begin_of_text|><|eot_id|>"
    )


def test_bos_and_eos_settings(llama3, tmp_path):
    instruct = tmp_path / "instruct"
    instruct.mkdir()
    (instruct / "tokenizer.json").write_bytes((llama3 / "tokenizer.json").read_bytes())
    (instruct / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})
    )
    assert open_tokenizer(instruct).eos_id == 128009  # the folder's eos_token: <|eot_id|>
    assert open_tokenizer(instruct, eos="<|end_of_text|>").eos_id == 128001
    assert open_tokenizer(llama3, no_bos=True).bos_id is None
    # A bare tokenizer.json: the usual names of its added tokens.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((llama3 / "tokenizer.json").read_bytes())
    tok = open_tokenizer(bare / "tokenizer.json")
    assert (tok.bos_id, tok.eos_id) == (128000, 128001)
    with pytest.raises(TokenizerError, match="has no token '<nope>'"):
        open_tokenizer(llama3, eos="<nope>")


def test_token_bytes_add_up_to_the_utf8_length(llama3):
    tok = open_tokenizer(llama3)
    table = tok.token_bytes()
    for text in real_documents(5, 5) + ["héllo wörld ✓ 😀", "<|eot_id|>"]:
        assert table[tok.encode(text)].sum() == len(text.encode("utf-8"))
    assert table[128000] == 0 and table[128009] == 0
    framed = TokenBytes(tok)  # what bits per byte divide by: no dummy-prefix rule here
    for text in real_documents(3, 3):
        ids = tok.encode(text)
        assert framed.document_bytes([128000, *ids, 128001]) == len(tok.decode(ids).encode())


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no such tokenizer.json"):
        open_tokenizer(tmp_path / "missing.json")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a readable JSON file"):
        open_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}')
    with pytest.raises(TokenizerError, match=r"not a tokenizer.json \(no 'model'\)"):
        open_tokenizer(tmp_path)


def test_long_run_check_bounds_every_piece():
    assert not has_long_run(("def f(x):\n    return x + 1\n" * 2000).encode())
    for text in ("a" * MAX_RUN, " " * MAX_RUN, "\n/" * MAX_RUN, "é" * MAX_RUN, "\u3000 " * MAX_RUN):
        assert has_long_run(text.encode()), text[:4]
    assert restartable(r"\s+(?!\S)|[^\s\p{L}]+") and not restartable(r"(?<=a)b")
    assert not restartable(r"^\w+") and restartable(r"[^\r\n]+")


def test_real_tokenizers_give_the_probe_back(
    llama3, tekken, qwen_like, tmp_path, llama2_tokenizer, tokenizer_model
):
    # Every real pre-training tokenizer passes the round-trip check, or it refuses them.
    folders = [llama3, tekken, qwen_like, mistral_folder(tmp_path / "mistral")]
    for tok in [open_tokenizer(f) for f in folders]:
        assert round_trip_problem(tok) is None, tok.files.path
    for model in (llama2_tokenizer, tokenizer_model):  # Llama-2's SentencePiece, lemur's
        assert round_trip_problem(SentencePieceTokenizer(model)) is None
    mistral = open_tokenizer(tmp_path / "mistral")  # not byte-level: encoded by tokenizers
    assert (mistral.engine, mistral.bos_id, mistral.eos_id) == ("tokenizers", 1, 2)
    assert all(mistral.encode(x) == reference_ids(tmp_path / "mistral", x) for x in PROBE)


def test_lossy_tokenizers_are_named_by_what_they_lose(tmp_path):
    texts = real_documents(8, 10)
    wordpiece = open_tokenizer(lossy_folder(tmp_path / "wp", "wordpiece", texts))
    problem = round_trip_problem(wordpiece)
    # Where the text first differs, cut short: indentation, case and spacing lost.
    assert problem == (
        r"'def parse(path, *, strict=False):\n    " + '"""' + "Read `p...' decodes to "
        r"""'def parse ( path, *, strict = false ) : " " " re...' """
        "(11 of 11 probe texts do not come back)"
    )
    unigram = open_tokenizer(lossy_folder(tmp_path / "uni", "unigram", texts))
    assert round_trip_problem(unigram) == (
        r"""'int main(void) {\n\tfor (int i = 0; i < 10; i++) {...' decodes to """
        r"""'int main(void) {\n<unk>for (int i = 0; i < 10; i+...' """
        "(6 of 11 probe texts do not come back)"
    )


def test_a_unigram_tokenizer_json_is_encoded_by_tokenizers(tmp_path):
    texts = real_documents(8, 10)
    folder = with_byte_fallback(lossy_folder(tmp_path / "u", "unigram", texts), tmp_path / "bf")
    tok = open_tokenizer(folder)
    assert (tok.engine, tok.info()["engine_reason"]) == ("tokenizers", "model Unigram is not BPE")
    assert round_trip_problem(tok) is None  # byte fallback: every text comes back
    assert_reference_ids(folder, tok, real_documents(5, 5) + list(PROBE))
    table = tok.token_bytes()
    assert table.shape == (tok.vocab_size,) and table[tok.eos_id] == 0

"""Tokenizer: Llama-2 special ids and byte-exact round trips of code and text."""

from __future__ import annotations

import pytest

from lemur.data.encode.tokenizer import TokenizerError, load_llama2_processor, tokenizer_info

TRICKY = [
    "def f(x):\n\treturn x  \n\n\n",
    "\t\tdeeply\n\t\t\tindented\tcode\t\n",
    "trailing spaces   \nand\r\nCRLF\r\nlines\r\n",
    "    four spaces\n        eight spaces\n",
    "  leading and trailing  ",
    "naïve café — 日本語のテキスト, Ελληνικά, русский, emoji 🙂🚀 and \u00a0nbsp",
    "\n\n\nblank lines first",
    "digits 1234567890 3.14159 0xDEADBEEF",
    "",
    " ",
    "\x0b\x0c odd controls \x7f",
]


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_is_byte_exact(tokenizer_model, text):
    sp = load_llama2_processor(tokenizer_model)
    ids = sp.encode(text)
    assert sp.decode(ids) == text
    assert 0 not in ids  # byte fallback: nothing becomes <unk>


def test_llama_special_ids(tokenizer_model):
    sp = load_llama2_processor(tokenizer_model)
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, -1)
    assert sp.id_to_piece(1) == "<s>" and sp.id_to_piece(2) == "</s>"
    # digits are split one per piece
    pieces = [sp.id_to_piece(i) for i in sp.encode("2024")]
    assert pieces == ["2", "0", "2", "4"]
    info = tokenizer_info(tokenizer_model)
    assert info["vocab_size"] == sp.vocab_size() and len(info["sha256"]) == 64


def test_newline_and_tab_are_pieces(tokenizer_model):
    sp = load_llama2_processor(tokenizer_model)
    pieces = [sp.id_to_piece(i) for i in sp.encode("a\n\tb")]
    assert "\n" in pieces and "\t" in pieces


def test_bad_model_file(tmp_path):
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        load_llama2_processor(bad)


def test_a_failed_tokenize_task_leaves_no_file(tmp_path, tokenizer_model):
    from datatrove.data import Document

    from lemur.data.encode.step import TokenizeWriter

    def failing():
        for n in range(3):  # one batch each: their tokens are written before the failure
            yield Document(text=f"x = {n}", id=f"a/{n}", metadata={"source_index": 0})
        raise OSError("the source went away")

    step = TokenizeWriter(str(tokenizer_model), str(tmp_path / "tok"), batch_docs=1)
    with pytest.raises(OSError, match="the source went away"):
        list(step.run(failing(), rank=0))
    assert list((tmp_path / "tok").iterdir()) == []

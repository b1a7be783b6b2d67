"""HF tokenizer export: transformers encodes, decodes and renders chats as our build does."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import sentencepiece as spm
from conftest import real_python_files, real_text_docs
from datatrove.data import Document
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from lemur.chatml import CHAT_PIECES, IM_END, IM_START, render_chatml
from lemur.convert import cli as convert
from lemur.data.encode.chat import TOKENS_KEY, ChatEncoder
from lemur.data.encode.tokenizer import extend_tokenizer
from lemur.data.read.chat import MESSAGES_KEY
from lemur.eval.chat_prompt import chat_prompt_ids
from lemur.model import checkpoint
from lemur.model.config import config_from_preset
from lemur.model.grow import grow_vocab
from lemur.model.llama import init_params
from lemur.tokenizer import SentencePieceTokenizer, TokenizerError
from lemur.tokenizer import hf_writer as hf_tokenizer
from lemur.tokenizer.hf_writer import write_hf_tokenizer

transformers = pytest.importorskip("transformers")

MESSAGES = [
    {"role": "system", "content": "You are a careful coder."},
    {"role": "user", "content": " Sum 1234 and 5678?\nShow code.\n"},
    {"role": "assistant", "content": "def add(a, b):\n\treturn a + b  # 6912\n"},
    {"role": "user", "content": "naïve café — 日本語 🙂"},
    {"role": "assistant", "content": "  Two leading spaces, then\n\n\nthree newlines."},
]
TRICKY = [
    " leading space",
    "  two leading spaces",
    "\n\nnewlines first\n",
    "digits 1234567890 3.14159 0xDEADBEEF",
    "tabs\tand\t\tmore\ttabs",
    "naïve café — 日本語のテキスト, Ελληνικά, emoji 🙂🚀 and \u00a0nbsp",
    "\x0b\x0c odd controls \x7f",
    f"markers {IM_START}inside{IM_END} text",
    f"{IM_END}{IM_START} back to back",
]


def build_ids(model: Path, messages: list[dict[str, str]]) -> list[int]:
    """The ids the chat build writes for one conversation: `<s>` + ChatEncoder's ids + `</s>`."""
    doc = Document(text=render_chatml(messages)[0], id="c", metadata={MESSAGES_KEY: messages})
    (kept,) = ChatEncoder(str(model), seq_len=4096).run([doc])
    return [1, *kept.metadata[TOKENS_KEY].tolist(), 2]


@pytest.fixture(scope="module")
def chat_model(tokenizer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session tokenizer with the ChatML pieces appended (ids below the old vocab unchanged)."""
    out = tmp_path_factory.mktemp("chat") / "tokenizer.model"
    return extend_tokenizer(tokenizer_model, CHAT_PIECES, out)


@pytest.fixture(scope="module")
def exported(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chat tokenizer written as an HF tokenizer folder."""
    folder = tmp_path_factory.mktemp("hf")
    write_hf_tokenizer(chat_model, folder, model_max_length=4096)
    return folder


def load(folder: Path):
    """transformers' AutoTokenizer over an exported folder (offline)."""
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def ids_of(encoded) -> list[int]:
    """apply_chat_template's ids: a BatchEncoding in transformers 5, a list in 4."""
    return list(encoded if isinstance(encoded, list) else encoded["input_ids"])


def test_files_and_config(exported: Path, chat_model: Path) -> None:
    assert sorted(p.name for p in exported.iterdir()) == sorted(hf_tokenizer.FILES)
    assert (exported / "tokenizer.model").read_bytes() == chat_model.read_bytes()
    config = json.loads((exported / "tokenizer_config.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(chat_model))
    start, end = sp.piece_to_id(IM_START), sp.piece_to_id(IM_END)
    assert (start, end) == (sp.vocab_size() - 2, sp.vocab_size() - 1)
    assert config["added_tokens_decoder"][str(end)]["content"] == IM_END
    assert config["added_tokens_decoder"][str(end)]["special"] is True
    assert config["added_tokens_decoder"][str(sp.piece_to_id("\n"))]["special"] is False
    assert (config["add_bos_token"], config["add_eos_token"], config["model_max_length"]) == (
        True,
        False,
        4096,
    )
    tok = load(exported)
    assert type(tok).__name__.startswith("LlamaTokenizer")
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (1, 2, 0)
    assert tok.convert_tokens_to_ids([IM_START, IM_END]) == [start, end]
    assert len(tok) == sp.vocab_size()
    generation = json.loads((exported / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, [2, end])


def test_chat_template_gives_the_build_ids(exported: Path, chat_model: Path) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(chat_model))
    tok = load(exported)
    # A whole conversation is one shard document: <s> ChatML </s>.
    text = render_chatml(MESSAGES)[0]
    whole = ids_of(tok.apply_chat_template(MESSAGES, tokenize=True))
    assert whole == build_ids(chat_model, MESSAGES)
    assert whole == [sp.bos_id()] + sp.encode(text) + [sp.eos_id()]
    assert tok.apply_chat_template(MESSAGES, tokenize=False) == f"<s>{text}</s>"
    # The prompt a chat model answers: the turns so far, then an open assistant header.
    prompt = ids_of(
        tok.apply_chat_template(MESSAGES[:-1], tokenize=True, add_generation_prompt=True)
    )
    expected = sp.encode(render_chatml(MESSAGES[:-1])[0] + f"{IM_START}assistant\n")
    assert prompt == [sp.bos_id()] + expected
    assert sp.piece_to_id(IM_START) in prompt and sp.piece_to_id(IM_END) in prompt


@pytest.mark.parametrize("source", ["code", "text", "tricky"])
def test_encoding_matches_sentencepiece(exported: Path, chat_model: Path, source: str) -> None:
    sp = spm.SentencePieceProcessor(model_file=str(chat_model))
    tok = load(exported)
    if source == "code":  # modules the tokenizer was not trained on as well as ones it was
        texts = [p.read_text() for p in real_python_files(60)[20:]]
    elif source == "text":
        texts = [d["text"] for d in real_text_docs(120)]
    else:
        texts = TRICKY
    for text in texts:
        ids = sp.encode(text)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, text[:60]
        assert tok(text)["input_ids"] == [sp.bos_id()] + ids  # <s> only: prompts stay open
        assert tok.decode(ids) == text


def test_base_tokenizer_has_no_chat_template(tokenizer_model: Path, tmp_path: Path) -> None:
    write_hf_tokenizer(tokenizer_model, tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "chat_template" not in config
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 2
    special = json.loads((tmp_path / "special_tokens_map.json").read_text())
    assert special == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_model))
    text = render_chatml(MESSAGES[:2])[0]  # the markers are plain text to a base tokenizer
    assert load(tmp_path)(text, add_special_tokens=False)["input_ids"] == sp.encode(text)


def test_dummy_prefix_model(tmp_path: Path) -> None:
    """A Llama-2-style model (a "▁" before the text) exports with its prefix kept."""
    texts = [p.read_text() for p in real_python_files(8)] + [d["text"] for d in real_text_docs(10)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for t in texts for line in t.split("\n") if line.strip()),
        model_prefix=str(tmp_path / "llama"),
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
        num_threads=1,
    )
    model = tmp_path / "llama.model"
    write_hf_tokenizer(model, tmp_path / "hf")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = load(tmp_path / "hf")
    # Text that starts with a space differs (transformers adds no "▁" before one).
    for text in texts[:4] + [t for t in TRICKY if not t.startswith(" ")][:4]:
        assert sp.encode(text)[:2] and sp.id_to_piece(sp.encode(text)[0]).startswith("▁")
        assert tok(text, add_special_tokens=False)["input_ids"] == sp.encode(text), text[:60]
        assert tok.decode(sp.encode(text)) == text


def test_llama2_chat_ids_equal_the_template(llama2_tokenizer: Path, tmp_path: Path) -> None:
    """Llama-2's real tokenizer (a dummy prefix) extended with the markers: the build's ids,
    `generate --chat`'s prompts and the template's agree, with no `▁` before `<|im_start|>`."""
    model = extend_tokenizer(llama2_tokenizer, CHAT_PIECES, tmp_path / "tokenizer.model")
    write_hf_tokenizer(model, tmp_path / "hf")
    tok = load(tmp_path / "hf")
    start = spm.SentencePieceProcessor(model_file=str(model)).piece_to_id(IM_START)
    whole = build_ids(model, MESSAGES)
    assert whole[:2] == [1, start]  # not [1, 28705 "▁", start]
    assert ids_of(tok.apply_chat_template(MESSAGES, tokenize=True)) == whole
    ours = SentencePieceTokenizer(model)
    for k in (2, 4):  # the prompt before each reply: the start of the trained document
        prompt = ids_of(tok.apply_chat_template(MESSAGES[:k], add_generation_prompt=True))
        assert chat_prompt_ids(ours, MESSAGES[:k]) == prompt == whole[: len(prompt)]


def test_merges_rank_by_score(chat_model: Path) -> None:
    proto = hf_tokenizer.read_model_proto(chat_model)
    merges = hf_tokenizer.bpe_merges(proto)
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    ranks = [vocab[left + right] for left, right in merges]
    assert ranks == sorted(ranks)  # trained scores are minus the id
    assert all(proto.pieces[vocab[p]].type == 1 for pair in merges for p in pair)
    assert [IM_START[:1], IM_START[1:]] not in merges


def test_refuses_models_it_cannot_mirror(tmp_path: Path, tokenizer_model: Path) -> None:
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="junk.model: not a SentencePiece model"):
        write_hf_tokenizer(tmp_path / "junk.model", tmp_path / "out")
    with pytest.raises(TokenizerError, match="missing.model: cannot read"):
        write_hf_tokenizer(tmp_path / "missing.model", tmp_path / "out")
    proto = model_pb2.ModelProto()
    proto.ParseFromString(tokenizer_model.read_bytes())
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.UNIGRAM
    (tmp_path / "uni.model").write_bytes(proto.SerializeToString())
    with pytest.raises(TokenizerError, match="uni.model: cannot export to Hugging Face: not a BPE"):
        write_hf_tokenizer(tmp_path / "uni.model", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_to_hf_exports_a_grown_chat_model_with_its_tokenizer(
    tokenizer_model: Path, chat_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lemur-convert to-hf of a chat model: HF renders our ids and computes our logits."""
    pytest.importorskip("torch")
    from test_model_hf import _forward, _hf_logits

    base_vocab = spm.SentencePieceProcessor(model_file=str(tokenizer_model)).vocab_size()
    config = config_from_preset("tiny", vocab_size=base_vocab, init_std=0.1)
    params, config = grow_vocab(init_params(config, jax.random.key(3)), config, base_vocab + 2)
    checkpoint.save_params(tmp_path / "lemur", params, config, tokenizer=chat_model)
    assert checkpoint.tokenizer_path(tmp_path / "lemur") == tmp_path / "lemur" / "tokenizer.model"
    out = tmp_path / "hf"
    assert convert.main(["to-hf", str(tmp_path / "lemur"), str(out), "--dtype", "float32"]) == 0
    assert "and the tokenizer of" in capsys.readouterr().out

    ids = ids_of(load(out).apply_chat_template(MESSAGES, tokenize=True))
    assert ids == build_ids(chat_model, MESSAGES)
    model = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    assert model.generation_config.eos_token_id == [2, base_vocab + 1]
    tokens = np.asarray([ids])
    ours = np.asarray(_forward(params, tokens, config))
    assert np.abs(_hf_logits(model, tokens) - ours).max() <= 1e-4  # test_model_hf's tolerance

    # A tokenizer with more pieces than the model has ids is refused before any writing.
    small = tmp_path / "small"
    tiny = config_from_preset("tiny")  # 512 ids
    checkpoint.save_params(small, init_params(tiny, jax.random.key(0)), tiny, chat_model)
    capsys.readouterr()  # transformers' loading bars
    assert convert.main(["to-hf", str(small), str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert f"{base_vocab + 2} tokenizer pieces, the model has 512 ids" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()
    # --tokenizer exports another model's tokenizer (here the base one).
    argv = [
        "to-hf",
        str(tmp_path / "lemur"),
        str(tmp_path / "base"),
        "--tokenizer",
        str(tokenizer_model),
    ]
    assert convert.main(argv) == 0
    assert "chat_template" not in json.loads(
        (tmp_path / "base" / "tokenizer_config.json").read_text()
    )

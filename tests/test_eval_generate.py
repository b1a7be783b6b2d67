"""lemur.eval.generate: parity with transformers' greedy generate, sampling, stops, buckets."""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from lemur.chatml import IM_END, IM_START  # noqa: E402
from lemur.eval import generate as gen_lib  # noqa: E402
from lemur.eval.chat_prompt import chat_prompt  # noqa: E402
from lemur.eval.decoding import GenerationConfig, bucket, continuation_text  # noqa: E402
from lemur.eval.load import load_model  # noqa: E402
from lemur.eval.sampling import Sampling, sample  # noqa: E402
from lemur.model import hf, llama  # noqa: E402
from lemur.model.config import LlamaConfig, Params, param_shapes
from lemur.tokenizer import ChatMLTokenizer, SentencePieceTokenizer  # noqa: E402

VOCAB = 256
GREEDY = GenerationConfig(max_new_tokens=48, batch_size=8)


def random_params(config: LlamaConfig, seed: int) -> Params:
    """Numpy params: N(0, init_std) matrices and norms of 1 +- 0.2, so logits spread out
    (numpy instead of init_params: nothing to compile)."""
    rng = np.random.default_rng(seed)

    def leaf(path: tuple, shape: tuple[int, ...]) -> np.ndarray:
        if "norm" in jax.tree_util.keystr(path):
            return (1 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
        return (config.init_std * rng.standard_normal(shape)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(
        leaf, param_shapes(config), is_leaf=lambda x: isinstance(x, tuple)
    )


@functools.cache
def _model(vocab: int = VOCAB) -> tuple[LlamaConfig, Params]:
    """A random GQA Llama: 4 query heads sharing 2 kv heads."""
    config = LlamaConfig(
        vocab_size=vocab,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        dtype="float32",
        init_std=0.1,
        max_seq_len=512,
    )
    return config, random_params(config, 7)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random model exported to an HF folder with lemur.model.hf."""
    config, params = _model()
    out = tmp_path_factory.mktemp("hf")
    hf.write_hf_checkpoint(out, config, hf.params_to_hf(params, config, "float32"), dtype="float32")
    return out


def _prompts() -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [[1, *rng.integers(3, VOCAB, n).tolist()] for n in (5, 17, 31)]


def test_greedy_equals_transformers_generate(hf_dir: Path) -> None:
    """48 greedy tokens for 3 prompts of different lengths, batched (left-padded) here and
    one prompt at a time in transformers: token for token."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # a random model: never stop early
    loaded = load_model(hf_dir, dtype="float32")  # converted back on the fly
    assert loaded.kind == "hf" and loaded.config.n_kv_heads == 2
    ours = gen_lib.generate_ids(loaded.params, loaded.config, _prompts(), GREEDY, eos_id=None)
    for prompt, completion in zip(_prompts(), ours, strict=True):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=48,
                min_new_tokens=48,
                pad_token_id=0,
            )
        theirs = out[0, len(prompt) :].tolist()
        assert completion.tokens == theirs
        assert completion.finish == "length" and len(theirs) == 48


def test_batch_size_does_not_change_greedy_output() -> None:
    config, params = _model()
    batched = gen_lib.generate_ids(params, config, _prompts(), GREEDY, eos_id=None)
    single = gen_lib.generate_ids(
        params, config, _prompts(), dataclasses.replace(GREEDY, batch_size=1), eos_id=None
    )
    assert [c.tokens for c in batched] == [c.tokens for c in single]


def test_one_compilation_per_bucket() -> None:
    """Prompt lengths 3..16 and 40..48 new tokens share one prefill and one decode program."""
    config, params = _model()
    gen_lib.generate_ids(params, config, [[1, 5, 6]], GREEDY, eos_id=None)
    start, cont = gen_lib.prefill_row._cache_size(), gen_lib.decode_chunk._cache_size()
    for n, new in ((9, 40), (16, 41), (4, 47)):
        gen = dataclasses.replace(GREEDY, max_new_tokens=new)
        gen_lib.generate_ids(params, config, [[1] + [7] * (n - 1)], gen, eos_id=None)
    assert (gen_lib.prefill_row._cache_size(), gen_lib.decode_chunk._cache_size()) == (start, cont)
    assert [bucket(n) for n in (1, 16, 17, 24, 25, 33, 49, 65, 97, 129)] == [
        16,
        16,
        24,
        24,
        32,
        48,
        64,
        96,
        128,
        192,
    ]


def test_sampling_is_seeded_and_respects_top_k() -> None:
    config, params = _model()
    sampled = dataclasses.replace(
        GREEDY, max_new_tokens=24, sampling=Sampling(temperature=1.0, top_k=5), seed=3
    )
    a = gen_lib.generate_ids(params, config, _prompts(), sampled, eos_id=None)
    b = gen_lib.generate_ids(params, config, _prompts(), sampled, eos_id=None)
    c = gen_lib.generate_ids(
        params, config, _prompts(), dataclasses.replace(sampled, seed=4), eos_id=None
    )
    assert [x.tokens for x in a] == [x.tokens for x in b] != [x.tokens for x in c]
    # Every sampled token is among the 5 most likely under the full forward.
    prompt, tokens = _prompts()[0], a[0].tokens
    logits = np.asarray(llama.forward(params, np.array([prompt + tokens]), config))[0]
    for i, t in enumerate(tokens):
        top5 = np.argsort(logits[len(prompt) - 1 + i])[-5:]
        assert t in top5


def test_sample_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    keys = jax.random.split(jax.random.key(0), 400)
    draw = jax.vmap(lambda k: sample(logits, k, Sampling(1.0, 0, 0.7)))(keys)
    assert set(np.asarray(draw).ravel().tolist()) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    greedy = sample(logits, keys[0], Sampling())
    assert np.asarray(greedy).tolist() == [0]


def test_eos_ends_a_row_and_others_go_on() -> None:
    config, params = _model()
    free = gen_lib.generate_ids(params, config, _prompts(), GREEDY, eos_id=None)
    eos = free[1].tokens[10]  # pretend the 11th token of prompt 1 is </s>
    ended = gen_lib.generate_ids(params, config, _prompts(), GREEDY, eos_id=eos)
    assert ended[1].finish == "eos" and len(ended[1].tokens) <= 10
    for f, e in zip(free, ended, strict=True):
        cut = f.tokens.index(eos) if eos in f.tokens else len(f.tokens)
        assert e.tokens == f.tokens[:cut]


def test_stop_strings_cut_text_and_tokens(tokenizer_model: Path) -> None:
    tok = SentencePieceTokenizer(tokenizer_model)
    config, params = _model(tok.vocab_size)
    prompts = ["def add(a, b):\n    return", "The quick brown fox"]
    free = gen_lib.generate(params, config, tok, prompts, GREEDY)
    text = free[0].text
    stop = text[5:8]  # a stop string that certainly occurs in the free completion
    cut = gen_lib.generate(params, config, tok, prompts, dataclasses.replace(GREEDY, stop=(stop,)))
    assert cut[0].finish == "stop"
    assert cut[0].text == text[: text.find(stop)]
    assert stop in continuation_text(tok, [1, *tok.encode(prompts[0])], cut[0].tokens)
    assert stop not in continuation_text(tok, [1, *tok.encode(prompts[0])], cut[0].tokens[:-1])


def test_chat_needs_chatml_pieces(tokenizer_model: Path) -> None:
    tok = SentencePieceTokenizer(tokenizer_model)
    with pytest.raises(ValueError, match="ChatML"):
        chat_prompt(tok, "hi")


def test_chat_wraps_prompts_in_chatml(tmp_path: Path) -> None:
    """With a tokenizer that has the ChatML pieces, --chat sends one id per marker."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    lines = ["def add(a, b):", "    return a + b", "The quick brown fox jumps.", "Hello there"]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 20),
        model_writer=model,
        model_type="bpe",
        vocab_size=300,
        byte_fallback=True,
        hard_vocab_limit=False,
        minloglevel=2,
        user_defined_symbols=[IM_START, IM_END, "\n"],
    )
    (tmp_path / "chat.model").write_bytes(model.getvalue())
    tok = SentencePieceTokenizer(tmp_path / "chat.model")
    assert isinstance(tok, ChatMLTokenizer)  # what chat_prompt_ids encodes ChatML with
    prompt = chat_prompt(tok, "Say hi", system="Be brief")
    assert prompt == (
        "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nSay hi"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    start = tok.piece_id(IM_START)
    assert start is not None and tok.encode(prompt).count(start) == 3
    config, params = _model(tok.vocab_size)
    [out] = gen_lib.generate(
        params, config, tok, ["Say hi"], dataclasses.replace(GREEDY, max_new_tokens=8), chat=True
    )
    assert IM_END not in out.text and 0 < len(out.tokens) <= 8


def test_the_cache_check_sizes_the_cache_generate_allocates(monkeypatch) -> None:
    """check_cache_fits counts the cache `_generate_batch` makes: the prompt's bucket plus
    GenerationConfig.decode_slots (the new tokens after the first, in whole chunks)."""
    from lemur import machine
    from lemur.cli_common import UserError

    config = LlamaConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=64)
    item = jax.numpy.dtype(config.compute_dtype).itemsize
    gen = GenerationConfig(max_new_tokens=20, chunk=8)
    assert gen.decode_slots == 24 and bucket(20) == 24
    need = 2 * config.n_layers * 3 * (24 + 24) * config.n_kv_heads * config.head_dim * item
    monkeypatch.setattr(machine, "device_memory_bytes", lambda: need)
    gen_lib.check_cache_fits(config, 3, 20, gen)  # exactly fits
    monkeypatch.setattr(machine, "device_memory_bytes", lambda: need - 1)
    with pytest.raises(UserError, match=r"the KV cache of 3 x 48 tokens \(20 of prompt"):
        gen_lib.check_cache_fits(config, 3, 20, gen)


def test_a_prompt_spelling_an_added_token_gets_its_id_as_in_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44 item 24: `lemur-eval generate` on a Qwen2.5-Coder-style tokenizer.json sends the
    ids transformers' `tokenizer(prompt)` gives: a prompt spelling `<|fim_prefix|>` (added,
    not special) or `<|endoftext|>` (special) gets those tokens' ids, not their characters'
    (the build, whose text never becomes a control id, keeps encoding them as text)."""
    import json

    import transformers
    from bytelevel_fixtures import qwen_like_folder
    from conftest import real_python_files
    from test_eval_infill import _spy_generation, _with_qwen_fim

    from lemur.eval import cli
    from lemur.model import checkpoint
    from lemur.model.config import config_from_preset
    from lemur.tokenizer import open_tokenizer

    texts = [p.read_text() for p in real_python_files(30)]
    folder = _with_qwen_fim(qwen_like_folder(tmp_path / "tok", texts, vocab_size=2000))
    tok = open_tokenizer(folder)
    config = config_from_preset("tiny", vocab_size=tok.vocab_size, max_seq_len=256)
    params = jax.jit(llama.init_params, static_argnums=0)(config, jax.random.key(0))
    checkpoint.save_params(tmp_path / "ckpt", jax.device_get(params), config)
    prompts = [
        "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
        "x = 1<|endoftext|>y  =  2",
        "def plain():\n    return 'no added token'",
    ]
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    want = [hf(p)["input_ids"] for p in prompts]
    assert want[0][0] == hf.convert_tokens_to_ids("<|fim_prefix|>")
    calls = _spy_generation(monkeypatch)
    out = tmp_path / "out.jsonl"
    argv = ["generate", str(tmp_path / "ckpt"), "--tokenizer", str(folder)]
    argv += [a for p in prompts for a in ("--prompt", p)]
    assert cli.main([*argv, "--max-new-tokens", "2", "--out", str(out)]) == 0
    assert calls[0]["prompts"] == want
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt_tokens"] for r in rows] == [len(w) for w in want]

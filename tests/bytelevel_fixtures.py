"""Real byte-level BPE tokenizers for tests, made at test time from files inside wheels.

- Llama-3: the 128,000 tiktoken ranks in the `llama-models` wheel, turned into a
  tokenizer.json by transformers' TikTokenConverter, with Llama-3's 256 special tokens
  (`<|begin_of_text|>` = 128000) and its BOS post-processor.
- tekken: Mistral's tiktoken-style vocabulary in the `mistral-common` wheel (131,072 ids,
  1,000 special ids first), converted the same way.
- A Qwen2.5-like folder: a small byte-level BPE trained with `tokenizers` on stdlib text,
  Qwen2's pre-tokenizer pattern and NFC normalizer, no BOS, ChatML specials.
`random_llama3_model` saves a random tiny Llama-3-style model beside Llama-3's files,
`random_qwen_coder_model` a Qwen2-style one beside them with Qwen2.5-Coder's FIM tokens.
Nothing is committed or downloaded.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(2, 247)),
]
# Qwen2.5-Coder's FIM and repository tokens, in its id order (151659-151664 there).
QWEN_CODER_TOKENS = [
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
# Llama-3-Instruct's chat template (the published one, without tool calling).
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _wheel_file(module: str, *parts: str) -> Path:
    mod = __import__(module)
    return Path(os.path.dirname(mod.__file__), *parts)


def llama3_folder(out: Path, instruct: bool = False) -> Path:
    """An HF folder with Llama-3's real tokenizer (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _wheel_file("llama_models", "llama3", "tokenizer.model")
    tok = TikTokenConverter(
        str(ranks), pattern=LLAMA3_PATTERN, extra_special_tokens=LLAMA3_SPECIALS
    ).converted()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 128000)],
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>" if instruct else "<|end_of_text|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": True,
    }
    if instruct:
        config["chat_template"] = LLAMA3_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


def random_llama3_model(out: Path, **config) -> Path:
    """A random tiny Llama-3-style model saved by transformers (vocab 128,256, fp32), with
    Llama-3's tokenizer files; `config` overrides LlamaConfig's settings."""
    import torch
    import transformers

    torch.manual_seed(0)
    settings = dict(
        vocab_size=128256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=128000,
        eos_token_id=128001,
        initializer_range=0.1,
    )
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings | config)).save_pretrained(
        out
    )
    return llama3_folder(out)


def add_tokens(folder: Path, tokens: list[str], special: bool) -> Path:
    """`folder`'s tokenizer.json with `tokens` added after its vocabulary (as Qwen2.5-Coder's
    FIM tokens are: not special; StarCoder2's: special)."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t in tokens])
    tok.save(str(folder / "tokenizer.json"))
    return folder


def random_qwen_coder_model(out: Path, vocab_size: int) -> Path:
    """A random tiny Qwen2-style model (`Qwen2ForCausalLM`, tied head, fp32) with Qwen2.5's
    framing on Llama-3's real vocabulary: Qwen2.5-Coder's six FIM and repository tokens added
    as its tokenizer.json has them (not special, ids 128256-128261), Qwen2.5's normalizer and
    pre-tokenizer, no BOS (`bos_token: null`), documents ended by `<|end_of_text|>`."""
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=128001,
        initializer_range=0.1,
    )
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    llama3_folder(out)
    add_tokens(out, QWEN_CODER_TOKENS, special=False)
    # Qwen2.5's pipeline, which transformers' Qwen2Tokenizer imposes on a qwen2 folder
    # whatever its tokenizer.json says: NFC, Qwen2's split (digits one by one), no BOS added.
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(out / "tokenizer.json"))
    settings = {"bos_token": None, "eos_token": "<|end_of_text|>", "unk_token": None}
    settings |= {"pad_token": "<|end_of_text|>", "tokenizer_class": "Qwen2Tokenizer"}
    settings |= {"model_max_length": 32768}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=1))
    return out


def tekken_folder(out: Path) -> Path:
    """A tokenizer.json of Mistral's tekken vocabulary (ids 0-999 special, `<s>` = 1)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    data = json.loads(_wheel_file("mistral_common", "data", "tekken_240718.json").read_text())
    specials = data["config"]["default_num_special_tokens"]
    n = data["config"]["default_vocab_size"] - specials
    out.mkdir(parents=True, exist_ok=True)
    ranks = out / "tekken.tiktoken"
    ranks.write_text(
        "".join(f"{v['token_bytes']} {v['rank'] + specials}\n" for v in data["vocab"][:n])
    )
    tok = TikTokenConverter(str(ranks), pattern=data["config"]["pattern"]).converted()
    ranks.unlink()
    tok.save(str(out / "tokenizer.json"))
    spec = json.loads((out / "tokenizer.json").read_text())
    names = ["<unk>", "<s>", "</s>", *(f"<SPECIAL_{i}>" for i in range(3, specials))]
    # As in HF's Mistral files: the special tokens are also the model vocabulary's first ids.
    spec["model"]["vocab"] = {**{n: i for i, n in enumerate(names)}, **spec["model"]["vocab"]}
    spec["added_tokens"] = [
        {
            "id": i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in enumerate(names)
    ]
    (out / "tokenizer.json").write_text(json.dumps(spec))
    (out / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    return out


def qwen_like_folder(out: Path, texts: list[str], vocab_size: int = 3000) -> Path:
    """A Qwen2.5-style folder: trained byte-level BPE, NFC, no BOS, ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": QWEN_TEMPLATE,
        "model_max_length": 32768,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


@functools.lru_cache(maxsize=4)
def _reference(path: str, mtime: float):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    return tok


def reference_ids(folder: Path, text: str) -> list[int]:
    """The reference encoding: `tokenizers`, special-token parsing off, nothing added."""
    file = folder / "tokenizer.json"
    tok = _reference(str(file), file.stat().st_mtime)
    clean = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return tok.encode(clean, add_special_tokens=False).ids


def is_utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8 (no lone surrogate): what the build's documents are."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def pathological_texts() -> list[str]:
    """Documents that break naive encoders: long runs, literal special tokens, surrogates."""
    return [
        " " * 1_000_000,  # tiktoken alone overflows its regex stack here
        "a" * 200_000,
        "7" * 50_000,
        "\n" * 50_000 + "x",
        "=" * 100_000,
        "\n/" * 20_000,
        "é" * 20_000 + " done",
        "\u3000 " * 10_000,
        "def f():\n" + "    " * 5_000 + "return 1\n",
        "ab " * 5000 + "-" * 6000 + "\n\n\n" * 3000 + "tail",
        "x<|begin_of_text|>y<|end_of_text|><|eot_id|> <s></s><unk> <|endoftext|><|im_start|>",
        "lone \ud800 surrogate \udfff and a pair \ud83d\ude00",
        "e\u0301 NFC-able and ﬁ ligature, Ａ fullwidth",
        "",
    ]


def mistral_folder(out: Path) -> Path:
    """Mistral v3's real SentencePiece BPE (32,768 pieces, byte fallback) as a tokenizer.json,
    converted by transformers as it converts a model folder's `tokenizer.model` (`Metaspace`
    with a dummy prefix on the first piece)."""
    import shutil

    import transformers

    src = out / "sentencepiece"
    src.mkdir(parents=True)
    model = _wheel_file("mistral_common", "data", "mistral_instruct_tokenizer_240323.model.v3")
    shutil.copyfile(model, src / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "legacy": False}
    config |= {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (src / "tokenizer_config.json").write_text(json.dumps(config))
    transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(out))
    shutil.rmtree(src)
    return out


def lossy_folder(out: Path, kind: str, texts: list[str]) -> Path:
    """A tokenizer.json trained with `tokenizers` on `texts` that does not give text back:
    `wordpiece` (BERT's: lowercased, split on spaces and punctuation, `##` pieces, `[UNK]`),
    `whitespace-bpe` (BPE over `Whitespace` pre-tokens: spaces and newlines dropped) or
    `unigram` (`Metaspace`, `<unk>` for what the sample lacks: tabs, `\\r`, most non-ASCII)
    or `seen-bytes-bpe` (a byte-level BPE trained without the full byte alphabet: `<unk>`
    for each byte the sample lacks, here Cyrillic's, Arabic's, ...)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<unk>", "</s>"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=specials)
    elif kind == "seen-bytes-bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=specials)
    elif kind == "whitespace-bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=specials)
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
        tok.decoder = decoders.Metaspace(prepend_scheme="never")
        trainer = trainers.UnigramTrainer(
            vocab_size=800, special_tokens=specials, unk_token="<unk>"
        )
    trainer.show_progress = False
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out


def with_byte_fallback(unigram: Path, out: Path) -> Path:
    """A copy of a trained Unigram tokenizer.json with SentencePiece's byte fallback (the
    256 `<0xNN>` pieces, decoded back to bytes), so that it gives every text back."""
    spec = json.loads((unigram / "tokenizer.json").read_text())
    spec["model"]["vocab"] += [[f"<0x{b:02X}>", -100.0] for b in range(256)]
    spec["model"]["byte_fallback"] = True
    replace = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
    steps = [replace, {"type": "ByteFallback"}, {"type": "Fuse"}]
    spec["decoder"] = {"type": "Sequence", "decoders": steps}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out

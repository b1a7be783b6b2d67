"""Training a byte-level BPE `tokenizer.json` on the corpus (for models trained from scratch).

The `tokenizers` trainer learns the merges (Llama-3's pre-tokenizer pattern, a byte-level
alphabet, so every text encodes with no unknown token). The file written lists every way
to write a token as two tokens as a merge, in the order of the ids they make, and looks a
whole piece up first (`ignore_merges`): BPE by rank, as tiktoken does it. So the trained
tokenizer is one tiktoken encodes exactly (`lemur.tokenizer.tiktoken_exact`), at its speed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from loguru import logger

from lemur.atomic_files import temp_name
from lemur.data.recipe.tokenizer import TokenizerTrainConfig
from lemur.tokenizer.bytelevel import clean_text
from lemur.tokenizer.long_pieces import MAX_RUN, has_long_run

# Llama-3's pre-tokenizer: contractions, words with one leading non-letter, numbers in
# runs of at most three digits, punctuation runs, newlines, spaces.
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def _rank_merges(vocab: dict[str, int], specials: set[int]) -> list[list[str]]:
    """Every split of every token into two tokens, ordered by the id it makes."""
    merges = []
    for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        if i in specials or len(token) < 2:
            continue
        splits = [(token[:c], token[c:]) for c in range(1, len(token))]
        found = [(vocab[a], vocab[b], a, b) for a, b in splits if a in vocab and b in vocab]
        merges += [[a, b] for _, _, a, b in sorted(found)]
    return merges


def _trainable(texts: Iterable[str]) -> Iterator[str]:
    """The sample as the trainer can take it: lone surrogates replaced, and no text holding
    a piece of MAX_RUN bytes or more (the trainer's merge updates are linear in a piece's
    length per merge: a megabyte of one character would stall training for hours)."""
    skipped = 0
    for text in texts:
        text = clean_text(text)
        if len(text) >= MAX_RUN // 4 and has_long_run(text.encode("utf-8")):
            skipped += 1
            continue
        yield text
    if skipped:
        logger.info(f"byte-bpe training: {skipped} sample documents with very long runs left out")


def train_byte_bpe(
    texts: Iterable[str],
    config: TokenizerTrainConfig,
    out_dir: str | os.PathLike[str],
    specials: Sequence[str] = (),
) -> Path:
    """Train on `texts`; write `out_dir/tokenizer.json` and `tokenizer_config.json` whole.

    `specials` (a FIM build's markers) are special tokens after BOS and EOS (ids 2, 3, ...).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=[BOS, EOS, *specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_trainable(texts), trainer)
    spec = json.loads(tok.to_str())
    specials = {t["id"] for t in spec["added_tokens"]}
    spec["model"]["merges"] = _rank_merges(spec["model"]["vocab"], specials)
    spec["model"]["ignore_merges"] = True
    out = Path(out_dir)
    tmp = temp_name(out)  # a killed build's is removed on resume (remove_stale_temporaries)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config_file = {"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"}
    (tmp / "tokenizer_config.json").write_text(json.dumps(config_file, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out / "tokenizer.json"

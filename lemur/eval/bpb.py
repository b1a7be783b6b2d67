"""Bits per byte: the loss in a unit that does not depend on the tokenizer.

    bits per byte = (sum of the NLL of the predicted tokens, in nats) / ln 2
                    / (UTF-8 bytes of the text those tokens decode to)

Nats per token change with the vocabulary (a bigger vocabulary packs more text into a
token, so each token is harder to predict); bits per byte compare a 32k-vocabulary Llama-2
with any other model on the same text. The NLL includes the prediction of `</s>` (a
document's end is part of its probability), which decodes to no bytes.

Bytes are counted per token from a table (`lemur.tokenizer.TokenBytes`), so the trainer
can count them for any window without decoding; the bytes of a document's tokens equal
`len(decode(ids).encode())`, which the tests check on real code and text. The one case a
per-token count cannot follow is a run of byte pieces that is not valid UTF-8 (decode
turns it into U+FFFD, 3 bytes); real text, which the tokenizer encoded, never contains one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lemur.cli_common import UserError
from lemur.model import llama
from lemur.model.config import LlamaConfig, Params
from lemur.shards.check import ShardDir
from lemur.tokenizer import TokenBytes, Tokenizer, open_tokenizer
from lemur.tokenizer.token_bytes import bits_per_byte


@dataclasses.dataclass
class Score:
    """Summed NLL, scored tokens and their bytes of one domain or language."""

    tokens: int = 0
    nll: float = 0.0
    bytes: int = 0

    def add(self, tokens: int, nll: float, n_bytes: int) -> None:
        """Accumulate one window's (or part's) numbers."""
        self.tokens += tokens
        self.nll += nll
        self.bytes += n_bytes

    def to_json(self) -> dict[str, Any]:
        """Counts plus nats/token and bits/byte."""
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "nll_nats": self.nll,
            "nats_per_token": self.nll / self.tokens if self.tokens else math.nan,
            "bits_per_byte": bits_per_byte(self.nll, self.bytes),
        }


@functools.partial(jax.jit, static_argnames=("config", "document_attention"))
def token_nll(
    params: Params,
    batch: Mapping[str, jax.Array],
    *,
    config: LlamaConfig,
    document_attention: bool = False,
) -> jax.Array:
    """Per-target NLL in nats (B x L, fp32), 0 where `loss_mask` is 0."""
    kwargs = {}
    if document_attention:
        kwargs = {"segment_ids": batch["segment_ids"], "positions": batch["positions"]}
    logits_BxLxV = llama.forward(params, batch["inputs"], config, **kwargs)
    picked_BxL = jnp.take_along_axis(logits_BxLxV, batch["targets"][..., None], axis=-1)[..., 0]
    nll_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1) - picked_BxL
    return nll_BxL * batch["loss_mask"].astype(jnp.float32)


class LanguageTagger:
    """Language of a decoded val document: by content for code, fastText for the rest.

    Shards keep no per-document language, so per-language scores re-tag the documents
    they touch. Code has no file name here, so it is tagged as the build tags a row
    without one (`content_language`: a shebang or modeline, else Magika).
    """

    def __init__(self) -> None:
        self._text: Any = None

    def __call__(self, domain: str, text: str) -> str:
        """A Linguist name for code, an ISO 639-1 code for text, or "unknown"."""
        if domain == "code":
            from lemur.data.filter.tagging import content_language

            return content_language(text)
        if self._text is None:
            from lemur.data.filter.tagging import TextLanguageID

            self._text = TextLanguageID()
        return self._text(text)[0]


@dataclasses.dataclass(frozen=True)
class BpbSettings:
    """How val windows are cut and scored."""

    seq_len: int = 2048
    batch_size: int = 8
    max_windows: int | None = None  # per domain: the first windows, in order
    document_attention: bool = True  # score each document alone (segment mask, positions)
    languages: bool = True


def _stack(records: list[dict[str, np.ndarray]], rows: int) -> dict[str, np.ndarray]:
    """A fixed-shape batch; missing rows are zeros (loss_mask 0, so they count nothing)."""
    batch = {k: np.stack([r[k] for r in records]) for k in records[0]}
    pad = rows - len(records)
    return {k: np.pad(v, ((0, pad), (0, 0))) for k, v in batch.items()} if pad else batch


class _Documents:
    """Which document each target of a window belongs to, and that document's language."""

    def __init__(
        self,
        source: Any,
        tokenizer: Tokenizer,
        domain: str,
        tagger: LanguageTagger,
    ) -> None:
        from lemur.shards.format import open_index, open_tokens

        self.source, self.tok, self.domain, self.tagger = source, tokenizer, domain, tagger
        d, dtype = source.directory, source.dtype.name
        self.ends = [np.asarray(open_index(d, s), np.int64) for s in source.shards]
        self.tokens = [open_tokens(d, s, dtype) for s in source.shards]
        self.cache: dict[tuple[int, int], str] = {}

    def split(self, index: int) -> tuple[np.ndarray, list[str]]:
        """(document number of each target of window `index`, language of each number)."""
        shard, start = self.source.locate(index)
        positions = start + 1 + np.arange(self.source.seq_len)
        docs = np.searchsorted(self.ends[shard], positions, side="right")
        uniq, inverse = np.unique(docs, return_inverse=True)
        return inverse, [self.language(shard, int(j)) for j in uniq]

    def language(self, shard: int, doc: int) -> str:
        """The (cached) language of one document."""
        key = (shard, doc)
        if key not in self.cache:
            lo = int(self.ends[shard][doc - 1]) if doc else 0
            ids = np.asarray(self.tokens[shard][lo : int(self.ends[shard][doc])], np.int64)
            framing = (self.tok.bos_id, self.tok.eos_id)
            text = self.tok.decode([int(t) for t in ids if t not in framing])
            self.cache[key] = self.tagger(self.domain, text)
        return self.cache[key]


def _score_domain(
    params: Params,
    config: LlamaConfig,
    source: Any,
    token_bytes: TokenBytes,
    settings: BpbSettings,
    docs: _Documents | None,
    progress: Callable[[int, int], None],
) -> dict[str, Any]:
    """Score the first windows of one val domain: totals and, with `docs`, per language;
    `progress(windows done, windows)` after each batch."""
    n = len(source) if settings.max_windows is None else min(len(source), settings.max_windows)
    total, by_language = Score(), {}
    progress(0, n)
    for first in range(0, n, settings.batch_size):
        index = list(range(first, min(n, first + settings.batch_size)))
        batch = _stack([source[i] for i in index], settings.batch_size)
        nll = np.asarray(
            token_nll(params, batch, config=config, document_attention=settings.document_attention),
            np.float64,
        )
        mask = batch["loss_mask"].astype(np.int64)
        nbytes = token_bytes.target_bytes(batch["inputs"], batch["targets"]) * mask
        for row, i in enumerate(index):
            total.add(int(mask[row].sum()), float(nll[row].sum()), int(nbytes[row].sum()))
            if docs is not None:
                inverse, names = docs.split(i)
                for k, name in enumerate(names):
                    part = inverse == k
                    by_language.setdefault(name, Score()).add(
                        int(mask[row][part].sum()),
                        float(nll[row][part].sum()),
                        int(nbytes[row][part].sum()),
                    )
        progress(index[-1] + 1, n)
    return {
        **total.to_json(),
        "windows": n,
        "languages": {k: v.to_json() for k, v in sorted(by_language.items()) if v.tokens},
    }


def check_windows(shard_dir: ShardDir, seq_len: int) -> None:
    """UserError naming `--seq-len` and the build's `val_fraction` when a val domain of
    `shard_dir` holds no whole window (seq_len + 1 tokens in one shard): there is nothing
    to score there, and a table without its numbers would pass for a result."""
    for domain in shard_dir.domains("val"):
        longest = max(int(s["tokens"]) for s in shard_dir.shards("val", domain))
        if longest < seq_len + 1:
            raise UserError(
                f"{shard_dir}: val shards of domain {domain!r} hold no window of --seq-len "
                f"{seq_len} (a window takes seq_len + 1 tokens; the longest shard has "
                f"{longest:,}): lower --seq-len to {longest - 1} or less, or build with a "
                "larger val_fraction"
            )


def score_directory(
    params: Params,
    config: LlamaConfig,
    directory: str | os.PathLike[str] | ShardDir,
    settings: BpbSettings,
    tagger: LanguageTagger | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """Bits per byte and nats per token of every val domain of a shard directory (UserError
    when a domain holds no window: `check_windows`); `progress(stage, windows done,
    windows)` as each domain's batches are scored (the stage is `bpb DIR DOMAIN`)."""
    from lemur.shards.windows import ShardSource

    shard_dir = ShardDir.of(directory)
    check_windows(shard_dir, settings.seq_len)
    tok = open_tokenizer(shard_dir.tokenizer_path)
    if tok.vocab_size > config.vocab_size:
        raise UserError(
            f"{directory}: tokenizer of {tok.vocab_size} ids, the model has "
            f"vocab_size {config.vocab_size} (built with another tokenizer?)"
        )
    token_bytes = TokenBytes(tok)
    tagger = tagger or LanguageTagger()
    report = progress or (lambda stage, done, n: None)
    domains: dict[str, Any] = {}
    for domain in shard_dir.domains("val"):
        source = ShardSource(
            shard_dir, settings.seq_len, split="val", domain=domain, vocab_size=config.vocab_size
        )
        docs = _Documents(source, tok, domain, tagger) if settings.languages else None
        stage = f"bpb {directory} {domain}"
        domains[domain] = _score_domain(
            params,
            config,
            source,
            token_bytes,
            settings,
            docs,
            lambda done, n, stage=stage: report(stage, done, n),
        )
    return {
        "directory": str(directory),
        "tokenizer_sha256": shard_dir.tokenizer.get("sha256"),
        "seq_len": settings.seq_len,
        "document_attention": settings.document_attention,
        "domains": domains,
    }

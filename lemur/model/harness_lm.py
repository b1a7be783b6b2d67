"""An lm-evaluation-harness model over a lemur model's (config, params, tokenizer).

`harness_lm(config, params, tokenizer, ...)` returns an instance of lm-eval's `TemplateLM`
that `lm_eval.simple_evaluate(model=...)` runs: `loglikelihood` and
`loglikelihood_rolling` through lemur.model.scoring (batched, longest first, bucketed
lengths), `generate_until` through lemur.model.batch_decode (the KV cache). Both
`lemur-eval harness` (a loaded checkpoint) and the training loop's harness hook (the live
params) build it, which is why it lives in the model layer.

It scores as lm-eval's HF backend (`--model hf`) scores the `lemur-convert to-hf` export:
- tokens: the export's tokenizer (`hf_encoder`), with the BOS in front when it would add
  it (the model has a BOS and `add_bos_token` is not False), not when the text already
  starts with the BOS's spelling; an empty context is the prefix token (BOS, else EOS);
- context/continuation split, left truncation to max_length + 1 tokens, rolling windows
  (`get_rolling_token_windows` + `make_disjoint_window`, context 1) as that backend does;
- generation: contexts left-truncated to max_length - max_gen_toks, EOS added to the stop
  strings, the text cut at the first stop string; greedy unless `do_sample` with a
  temperature > 0 (then temperature, top_k, top_p).
max_length is the model's `max_seq_len` (what the export writes as
max_position_embeddings).

lm_eval is an optional extra (`pip install 'lemur[harness]'`): this module imports without
it, and `harness_lm` raises `HarnessMissing` (one line) when it is absent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from lemur.model import batch_decode, scoring
from lemur.model.config import LlamaConfig, Params
from lemur.tokenizer import Tokenizer, hf_writer

INSTALL_HINT = "lm-evaluation-harness is not installed: pip install 'lemur[harness]'"


class HarnessMissing(ImportError):
    """lm_eval cannot be imported (one line: how to install it)."""


def lm_eval_module() -> Any:
    """The `lm_eval` package, or HarnessMissing."""
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401 - the base class harness_lm subclasses
    except ImportError as e:
        raise HarnessMissing(f"{INSTALL_HINT} ({e})") from None
    return lm_eval


def hf_engine(tokenizer: Tokenizer, tokenizer_json: Path | None = None) -> Any | None:
    """The `tokenizers` engine of the model's HF tokenizer, which is what transformers'
    AutoTokenizer runs (tested): `tokenizer_json` when the model carries one (an HF
    folder's own), else for a SentencePiece model the tokenizer.json that `lemur-convert
    to-hf` writes (lemur.tokenizer.hf_writer), for a tokenizer.json model that file with its
    added tokens parsed. None when there is no file to read."""
    import tokenizers

    if tokenizer_json is not None:
        return tokenizers.Tokenizer.from_file(str(tokenizer_json))
    path = getattr(tokenizer, "path", None)
    if tokenizer.kind == "sentencepiece" and path is not None:
        proto = hf_writer.read_model_proto(path)
        return tokenizers.Tokenizer.from_str(json.dumps(hf_writer.tokenizer_json(proto)))
    files = getattr(tokenizer, "files", None)
    if tokenizer.kind == "tokenizer.json" and files is not None:
        return tokenizers.Tokenizer.from_file(str(files.path))
    return None


def hf_encoder(
    tokenizer: Tokenizer, tokenizer_json: Path | None = None
) -> Callable[[str], list[int]]:
    """Ids of a text as the export's tokenizer gives them, nothing added (lm-eval's HF
    backend encodes so). SentencePiece itself differs for a text that starts with
    whitespace: it adds its dummy-prefix space there, the export's Metaspace does not."""
    engine = hf_engine(tokenizer, tokenizer_json)
    if engine is None:
        return tokenizer.encode
    return lambda text: engine.encode(text, add_special_tokens=False).ids


def hf_decoder(
    tokenizer: Tokenizer, tokenizer_json: Path | None = None
) -> Callable[[Sequence[int]], str]:
    """Text of ids as the export's tokenizer decodes them, special tokens skipped (lm-eval's
    HF backend decodes generations so): a broken UTF-8 run of byte tokens becomes one
    replacement character per byte, where SentencePiece keeps the valid ones."""
    engine = hf_engine(tokenizer, tokenizer_json)
    if engine is None:
        return lambda ids: tokenizer.decode([t for t in ids if not tokenizer.is_control(t)])
    return lambda ids: engine.decode([int(i) for i in ids], skip_special_tokens=True)


def _bos_text(tokenizer: Tokenizer) -> str | None:
    """How the BOS is spelt (`<s>`): what a text that already starts with it starts with."""
    if tokenizer.bos_id is None:
        return None
    sp = getattr(tokenizer, "sp", None)  # SentencePiece decodes a control id to ""
    text = sp.id_to_piece(tokenizer.bos_id) if sp is not None else ""
    return text or tokenizer.decode([tokenizer.bos_id]) or None


class LemurLMCore:
    """lm-eval's `TemplateLM` methods on a lemur model (mixed into that class by
    `harness_lm`, so this module needs no lm_eval)."""

    backend = "causal"

    def __init__(
        self,
        config: LlamaConfig,
        params: Params,
        tokenizer: Tokenizer,
        *,
        batch_size: int = 16,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        seed: int = 0,
        progress: Callable[[str, int, int], None] | None = None,
        tokenizer_json: Path | None = None,
    ) -> None:
        super().__init__()  # lm-eval's LM: rank, world size, cache hook
        if tokenizer.eos_id is None and tokenizer.bos_id is None:
            raise ValueError("the tokenizer names neither a BOS nor an EOS: no prefix token")
        self.config, self.params, self.tokenizer = config, params, tokenizer
        self._batch, self._max_gen_toks, self.add_bos_token = (
            batch_size,
            max_gen_toks,
            add_bos_token,
        )
        self._key = jax.random.key(seed)
        self._calls = 0
        self._progress = progress
        self._bos = _bos_text(tokenizer)
        self._decode_params: Params | None = None
        self._decode = hf_decoder(tokenizer, tokenizer_json)
        self._encode = hf_encoder(tokenizer, tokenizer_json)

    @property
    def eot_token_id(self) -> int:
        """EOS (lm-eval's end of text), else BOS."""
        eos = self.tokenizer.eos_id
        return eos if eos is not None else int(self.tokenizer.bos_id)  # type: ignore[arg-type]

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the first rolling window condition on: BOS, else EOS."""
        bos = self.tokenizer.bos_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        """The context: the model's max_seq_len."""
        return self.config.max_seq_len

    @property
    def max_gen_toks(self) -> int:
        """New tokens when a task names no max_gen_toks."""
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        """Sequences per device call."""
        return self._batch

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **kwargs: Any,
    ) -> list[int]:
        """Ids of `string`, BOS first as the HF backend's tokenizer puts it (see module doc)."""
        add = add_special_tokens
        if add is None:
            add = self.add_bos_token is not False
            if self._bos is not None and string.startswith(self._bos):
                add = False
        ids = self._encode(string)
        if add and self.tokenizer.bos_id is not None:
            ids = [self.tokenizer.bos_id, *ids]
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        """Text of `tokens` as the HF backend decodes them (see `hf_decoder`)."""
        return self._decode(tokens)

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **_: Any
    ) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probabilities, whether it was all greedy) of each
        (key, context ids, continuation ids), the input cut to the last max_length + 1."""
        seqs = [(ctx + cont)[-(self.max_length + 1) :] for _, ctx, cont in requests]
        scores = self._score(seqs, "loglikelihood")
        out = []
        for (key, _, cont), s in zip(requests, scores, strict=True):
            n = len(cont)
            answer = (float(s.logprobs[-n:].astype("float64").sum()), bool(s.greedy[-n:].all()))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
            out.append(answer)
        return out

    def _score(self, seqs: list[list[int]], what: str) -> list[scoring.TokenScores]:
        """token_logprobs in slices (so progress moves), each slice batched and bucketed."""
        step = max(self._batch * 16, 256)
        out: list[scoring.TokenScores] = []
        for start in range(0, len(seqs), step):
            if self._progress is not None:
                self._progress(what, start, len(seqs))
            out += scoring.token_logprobs(
                self.config, self.params, seqs[start : start + step], self._batch
            )
        if self._progress is not None:
            self._progress(what, len(seqs), len(seqs))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-probability of each whole text over disjoint max_length windows."""
        from lm_eval import utils

        windows: list[tuple[None, list[int], list[int]]] = []
        counts = []
        for (string,) in [r.args for r in requests]:
            pairs = utils.get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            mine = [(None, *utils.make_disjoint_window(p)) for p in pairs]
            windows += mine
            counts.append(len(mine))
        scores = self._loglikelihood_tokens(windows)  # type: ignore[arg-type]
        out, at = [], 0
        for req, n in zip(requests, counts, strict=True):
            total = sum(ll for ll, _ in scores[at : at + n])
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
            out.append(total)
            at += n
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's generation, grouped by its settings, longest contexts first."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(requests)
        done = 0
        for members in groups.values():
            context_ids = {i: self.tok_encode(requests[i].args[0]) for i in members}
            members.sort(key=lambda i: -len(context_ids[i]))
            for start in range(0, len(members), self._batch):
                if self._progress is not None:
                    self._progress("generate_until", done, len(requests))
                batch = members[start : start + self._batch]
                texts = self._generate(
                    [requests[i].args[0] for i in batch], requests[batch[0]].args[1]
                )
                for i, text in zip(batch, texts, strict=True):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                done += len(batch)
        if self._progress is not None:
            self._progress("generate_until", len(requests), len(requests))
        return out

    def _generate(self, contexts: list[str], gen_kwargs: dict[str, Any]) -> list[str]:
        """One batch of contexts sharing `gen_kwargs`: generated, decoded, cut at stops."""
        from lm_eval.models.utils import (
            handle_stop_sequences,
            normalize_gen_kwargs,
            postprocess_generated_text,
        )

        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        eos = self.tokenizer.eos_id
        eos_text = None if eos is None else self._spelling(eos)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
        max_new = int(kwargs.pop("max_gen_toks"))
        if max_new >= self.max_length:
            raise ValueError(
                f"max_gen_toks {max_new} leaves no room for a context in the model's "
                f"{self.max_length} tokens"
            )
        prompts = [
            self.tok_encode(c, left_truncate_len=self.max_length - max_new) for c in contexts
        ]

        def is_done(_: int, ids: list[int]) -> bool:
            text = self.tok_decode(ids)
            return any(s and s in text for s in until)

        self._calls += 1
        if self._decode_params is None:  # per-layer weights: decoding reads them every token
            from lemur.model.decode import split_layers

            self._decode_params = split_layers(self.params)
        new = batch_decode.generate_tokens(
            self.config,
            self._decode_params,
            prompts,
            max_new,
            self.tokenizer.stop_ids,
            _sampling(kwargs),
            jax.random.fold_in(self._key, self._calls),
            is_done,
        )
        return [postprocess_generated_text(self.tok_decode(ids), until, None) for ids in new]

    def _spelling(self, token: int) -> str:
        """A special token's text as the HF tokenizer decodes it (`</s>`)."""
        sp = getattr(self.tokenizer, "sp", None)
        return sp.id_to_piece(token) if sp is not None else self.tokenizer.decode([token])


def _sampling(kwargs: dict[str, Any]) -> batch_decode.Sampling:
    """Greedy unless do_sample with a temperature > 0 (HF generate's meaning of the kwargs)."""
    temperature = float(kwargs.get("temperature") or 0.0)
    if not kwargs.get("do_sample") or temperature == 0:
        return batch_decode.Sampling()
    top_p = float(kwargs.get("top_p") or 1.0)
    return batch_decode.Sampling(temperature, int(kwargs.get("top_k") or 0), top_p)


def harness_lm(config: LlamaConfig, params: Params, tokenizer: Tokenizer, **options: Any) -> Any:
    """An lm-eval `TemplateLM` instance over the model (options: see `LemurLMCore`);
    HarnessMissing without lm_eval."""
    lm_eval_module()
    from lm_eval.api.model import TemplateLM

    cls = type("LemurLM", (LemurLMCore, TemplateLM), {"__module__": __name__})
    return cls(config, params, tokenizer, **options)

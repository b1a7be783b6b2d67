"""Loading a recipe: YAML, presets, `--set` overrides, validation (RecipeError on any mistake)."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any

import yaml

from lemur import typed_yaml
from lemur.data.recipe import (
    BUILTIN_BENCHMARKS,
    CHAT_DOMAIN,
    CHAT_LONG,
    CHAT_SCHEMAS,
    FORMATS,
    PII_KINDS,
    SOURCE_PRESETS,
    DecontaminateConfig,
    PiiConfig,
    Recipe,
    RecipeError,
    SourceConfig,
    TokenizerTrainConfig,
)
from lemur.data.run.settings import check_executor
from lemur.typed_yaml import TypedLoader

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_LOADER = TypedLoader(RecipeError, "recipe")


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides (value parsed as YAML; list items by index, `sources.0.name`)."""
    return typed_yaml.apply_overrides(raw, overrides, RecipeError)


def expand_paths(source: SourceConfig) -> list[str]:
    """Expand `~` and globs of a source's paths; each entry must match something."""
    out: list[str] = []
    for p in source.paths:
        pattern = os.path.expanduser(p)
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise RecipeError(f"recipe: source '{source.name}': path '{p}' matches nothing")
        out.extend(matches)
    return out


def output_problem(path: str) -> str | None:
    """Why `path` cannot be a directory we create or write into; None when it can."""
    p = Path(path).expanduser()
    if os.path.exists(p) and not os.path.isdir(p):
        return "exists and is not a directory"
    parent = p
    while not os.path.exists(parent) and parent != parent.parent:
        parent = parent.parent
    if not os.path.isdir(parent):
        return f"cannot be created: '{parent}' is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be written: '{parent}' is not writable"
    return None


def _validate_output(recipe: Recipe, check_paths: bool) -> None:
    """Output directories: never empty (that would be the current directory), and writable."""
    for key, value in (
        ("output", recipe.output),
        ("rejects", recipe.rejects),
        ("work_dir", recipe.work_dir),
    ):
        if value is None:
            continue
        if not value.strip():
            raise RecipeError(f"recipe: {key} is empty")
        problem = output_problem(value) if check_paths else None
        if problem:
            raise RecipeError(f"recipe: {key} '{value}' {problem}")


def check_train_settings(train: TokenizerTrainConfig, key: str = "tokenizer.train") -> None:
    """SentencePiece's own limits on the training settings, checked before reading anything."""
    if train.kind not in (None, "sentencepiece", "byte-bpe"):
        raise RecipeError(
            f"recipe: {key}.kind {train.kind!r} is not one of sentencepiece, byte-bpe"
        )
    if train.kind == "byte-bpe" and train.vocab_size <= 258:
        raise RecipeError(
            f"recipe: {key}.vocab_size must be > 258 for byte-bpe (256 bytes and 2 special "
            f"tokens), got {train.vocab_size}"
        )
    if not 256 < train.vocab_size <= 2**32:
        raise RecipeError(f"recipe: {key}.vocab_size must be > 256, got {train.vocab_size}")
    if not 0.98 <= train.character_coverage <= 1:
        raise RecipeError(
            f"recipe: {key}.character_coverage must be in [0.98, 1], got {train.character_coverage}"
        )
    if not 10 <= train.max_sentence_length <= 2**30:
        raise RecipeError(f"recipe: {key}.max_sentence_length must be in [10, 2^30]")
    if train.sample_bytes < 1 or train.input_sentence_size < 0:
        raise RecipeError(f"recipe: {key}.sample_bytes must be >= 1, input_sentence_size >= 0")


def _validate(recipe: Recipe, check_paths: bool) -> None:
    _validate_output(recipe, check_paths)
    _validate_sources(recipe, check_paths)
    _validate_mix(recipe)
    _validate_sizes(recipe)
    _validate_executor_and_tokenizer(recipe, check_paths)


def _validate_sources(recipe: Recipe, check_paths: bool) -> None:
    if not recipe.sources:
        raise RecipeError("recipe: 'sources' is empty")
    names = set()
    for i, s in enumerate(recipe.sources):
        key = f"sources[{i}]"
        if not _NAME_RE.match(s.name):
            raise RecipeError(f"recipe: {key}.name {s.name!r} must be letters, digits, _ . -")
        if s.name in names:
            raise RecipeError(f"recipe: {key}.name {s.name!r} is used twice")
        names.add(s.name)
        if not _NAME_RE.match(s.domain):
            raise RecipeError(f"recipe: {key}.domain {s.domain!r} must be letters, digits, _ . -")
        if s.format not in FORMATS:
            raise RecipeError(
                f"recipe: {key}.format {s.format!r} is not one of {', '.join(FORMATS)}"
            )
        _validate_schema(s, key)
        if not s.paths:
            raise RecipeError(f"recipe: {key}.paths is empty")
        if s.max_file_bytes <= 0:
            raise RecipeError(f"recipe: {key}.max_file_bytes must be > 0")
        if check_paths:
            expand_paths(s)


def _validate_chat(recipe: Recipe) -> None:
    """A chat build takes only chat sources; `mix.weights` and `chat:` only apply to one."""
    mix = recipe.mix
    if not recipe.is_chat():
        if mix.weights is not None:
            raise RecipeError("recipe: mix.weights is for chat builds (sources of format chat)")
        if recipe.chat is not None:
            raise RecipeError("recipe: chat: applies only to builds of chat sources")
        return
    for i, s in enumerate(recipe.sources):
        if s.format != "chat":
            raise RecipeError(
                f"recipe: sources[{i}] '{s.name}' is format {s.format!r}: a chat build takes only "
                f"chat sources (build pre-training and chat corpora separately)"
            )
    long = recipe.chat_settings().long
    if long not in CHAT_LONG:
        raise RecipeError(f"recipe: chat.long {long!r} is not one of {', '.join(CHAT_LONG)}")
    names = [s.name for s in recipe.sources]
    for name, w in (mix.weights or {}).items():
        if name not in names:
            raise RecipeError(f"recipe: mix.weights.{name}: no chat source is named '{name}'")
        if not w > 0:
            raise RecipeError(f"recipe: mix.weights.{name} must be > 0, got {w}")
    if mix.weights and len(mix.weights) < len(names):
        missing = next(n for n in names if n not in mix.weights)
        raise RecipeError(f"recipe: mix.weights has no entry for source '{missing}'")
    if not mix.weights and mix.total_tokens is not None:
        raise RecipeError("recipe: mix.total_tokens in a chat build needs mix.weights")


def _validate_schema(s: SourceConfig, key: str) -> None:
    """`format: chat` names one of the chat schemas; no other format takes a schema."""
    if s.format != "chat":
        if s.schema is not None:
            raise RecipeError(f"recipe: {key}.schema is only for format chat, not {s.format!r}")
        return
    if s.schema is None:
        raise RecipeError(
            f"recipe: {key}.schema is required for format chat: one of {', '.join(CHAT_SCHEMAS)}"
        )
    if s.schema not in CHAT_SCHEMAS:
        raise RecipeError(
            f"recipe: {key}.schema {s.schema!r} is not one of {', '.join(CHAT_SCHEMAS)}"
        )


def _validate_mix(recipe: Recipe) -> None:
    _validate_chat(recipe)
    if recipe.is_chat():  # the code:text ratio and language shares do not apply to chat
        if not recipe.mix.max_repeats >= 1:
            raise RecipeError("recipe: mix.max_repeats must be >= 1")
        return
    domains = recipe.domains()
    ratio = recipe.mix.ratio
    for d, r in ratio.items():
        # 0 is allowed: the domain gives val shards but no train tokens (a one-domain arm of
        # a ratio sweep keeps the other domain's held-out set). Written so that NaN fails.
        if not r >= 0:
            raise RecipeError(f"recipe: mix.ratio.{d} must be >= 0, got {r}")
        if d not in domains:
            raise RecipeError(f"recipe: mix.ratio.{d}: no source has domain '{d}'")
    for d in domains:
        if d not in ratio:
            raise RecipeError(f"recipe: mix.ratio has no entry for domain '{d}'")
    if not any(r > 0 for r in ratio.values()):
        raise RecipeError("recipe: mix.ratio needs at least one domain above 0")
    if recipe.mix.total_tokens is not None and not recipe.mix.total_tokens > 0:
        raise RecipeError("recipe: mix.total_tokens must be > 0")
    if not recipe.mix.max_repeats >= 1:
        raise RecipeError("recipe: mix.max_repeats must be >= 1")
    _validate_budget(recipe)
    for d, per in (recipe.mix.shares or {}).items():
        if d not in domains:
            raise RecipeError(f"recipe: mix.shares.{d}: no source has domain '{d}'")
        for lang, share in per.items():
            if not 0 <= share <= 1:
                raise RecipeError(f"recipe: mix.shares.{d}.{lang} must be in [0, 1], got {share}")
        if sum(per.values()) > 1 + 1e-9:
            raise RecipeError(f"recipe: mix.shares.{d} sum to {sum(per.values()):.4f} > 1")


def _validate_budget(recipe: Recipe) -> None:
    """The budgeted-reading knobs: a margin of at least 1, a sample fraction in (0, 1]."""
    mix = recipe.mix
    if mix.read_margin is not None and not mix.read_margin >= 1:
        raise RecipeError(f"recipe: mix.read_margin must be >= 1, got {mix.read_margin}")
    if mix.sample_fraction is not None and not 0 < mix.sample_fraction <= 1:
        raise RecipeError(
            f"recipe: mix.sample_fraction must be in (0, 1], got {mix.sample_fraction}"
        )


def _validate_sizes(recipe: Recipe) -> None:
    if recipe.seq_len < 1:
        raise RecipeError(f"recipe: seq_len must be >= 1, got {recipe.seq_len}")
    if not 0 <= recipe.val_fraction < 0.5:
        raise RecipeError(f"recipe: val_fraction must be in [0, 0.5), got {recipe.val_fraction}")
    if recipe.shard_tokens < 1024:
        raise RecipeError("recipe: shard_tokens must be >= 1024")
    if recipe.tokenize_batch_docs < 1:
        raise RecipeError("recipe: tokenize_batch_docs must be >= 1")
    dd = recipe.dedup
    if dd.ngram < 1 or dd.bands < 1 or dd.rows < 1:
        raise RecipeError("recipe: dedup.ngram, dedup.bands and dedup.rows must be >= 1")
    if dd.bucket_tasks is not None and dd.bucket_tasks < 1:
        raise RecipeError(f"recipe: dedup.bucket_tasks must be >= 1, got {dd.bucket_tasks}")
    if dd.sketch_size < 0:
        raise RecipeError(f"recipe: dedup.sketch_size must be >= 0, got {dd.sketch_size}")
    if not dd.merge_buffer_mb > 0:
        raise RecipeError(f"recipe: dedup.merge_buffer_mb must be > 0, got {dd.merge_buffer_mb}")
    if not 0 < dd.min_similarity <= 1:
        raise RecipeError(
            f"recipe: dedup.min_similarity must be in (0, 1], got {dd.min_similarity}"
        )


def _validate_executor_and_tokenizer(recipe: Recipe, check_paths: bool) -> None:
    check_executor(recipe.executor)
    tok = recipe.tokenizer
    model = Path(tok.model).expanduser() if tok.model is not None else None
    if model is not None and check_paths and not model.is_file():
        if not (model / "manifest.json").is_file():  # a shard directory lends its tokenizer
            raise RecipeError(
                f"recipe: tokenizer.model '{tok.model}' is not a file or a shard directory"
            )
    if tok.hf is not None and check_paths:
        hf = Path(tok.hf).expanduser()
        if not (hf / "tokenizer.json" if hf.is_dir() else hf).is_file():
            raise RecipeError(
                f"recipe: tokenizer.hf '{tok.hf}' is not a tokenizer.json or a folder holding one"
            )
    if tok.model is not None and check_paths:
        _check_given_tokenizer(tok.model)
    if tok.train is not None:
        check_train_settings(tok.train)


def _check_given_tokenizer(value: str) -> None:
    """Load the model `tokenizer.model` names (a file, or a shard directory's), so that an
    unusable one is a recipe mistake found before any input is read (exit 2)."""
    from lemur.data.tokenize.prepare import given_model
    from lemur.data.tokenize.tokenizer import TokenizerError, load_tokenizer

    try:
        load_tokenizer(given_model(value))
    except TokenizerError as e:
        raise RecipeError(f"recipe: tokenizer.model: {e}") from None


def _validate_decontaminate(dc: DecontaminateConfig, check_paths: bool) -> None:
    """Benchmarks: unique names, built-in ones without a path, JSONL ones with path and fields."""
    if dc.ngram < 4:
        raise RecipeError(f"recipe: decontaminate.ngram must be >= 4, got {dc.ngram}")
    if dc.min_matches < 1:
        raise RecipeError(f"recipe: decontaminate.min_matches must be >= 1, got {dc.min_matches}")
    names: set[str] = set()
    for i, b in enumerate(dc.benchmarks):
        key = f"decontaminate.benchmarks[{i}]"
        if not _NAME_RE.match(b.name) or b.name in names:
            raise RecipeError(f"recipe: {key}.name {b.name!r} must be unique: letters, digits, _.-")
        names.add(b.name)
        if b.path is None:
            if b.name not in BUILTIN_BENCHMARKS:
                raise RecipeError(
                    f"recipe: {key}: '{b.name}' is not built in ({', '.join(BUILTIN_BENCHMARKS)}); "
                    f"give a JSONL 'path' and 'fields'"
                )
            continue
        if not b.fields:
            raise RecipeError(f"recipe: {key}.fields must list the JSONL keys to index")
        if check_paths and not Path(b.path).expanduser().is_file():
            raise RecipeError(f"recipe: {key}.path '{b.path}' is not a file")


def _validate_pii(pii: PiiConfig) -> None:
    """Known redaction kinds and well-formed domain names."""
    for kind in pii.kinds:
        if kind not in PII_KINDS:
            raise RecipeError(f"recipe: pii.kinds: {kind!r} is not one of {', '.join(PII_KINDS)}")
    for d in pii.domains:
        if not _NAME_RE.match(d):
            raise RecipeError(f"recipe: pii.domains: {d!r} must be letters, digits, _ . -")


def _apply_benchmark_names(raw: dict[str, Any]) -> dict[str, Any]:
    """`benchmarks: [humaneval]` is short for `[{name: humaneval}]`."""
    dc = raw.get("decontaminate")
    if not isinstance(dc, dict) or not isinstance(dc.get("benchmarks"), list | str):
        return raw
    given = dc["benchmarks"] if isinstance(dc["benchmarks"], list) else [dc["benchmarks"]]
    items = [{"name": b} if isinstance(b, str) else b for b in given]
    return {**raw, "decontaminate": {**dc, "benchmarks": items}}


def _apply_presets(raw: dict[str, Any]) -> dict[str, Any]:
    sources = raw.get("sources")
    if not isinstance(sources, list):
        return raw
    out = []
    for i, src in enumerate(sources):
        if isinstance(src, dict) and src.get("preset") is not None:
            preset = SOURCE_PRESETS.get(str(src["preset"]))
            if preset is None:
                raise RecipeError(
                    f"recipe: sources[{i}].preset {src['preset']!r} is not one of "
                    f"{', '.join(SOURCE_PRESETS)}"
                )
            src = {**preset, **src}
        if isinstance(src, dict) and src.get("format") == "chat" and "domain" not in src:
            src = {**src, "domain": CHAT_DOMAIN}
        out.append(src)
    return {**raw, "sources": out}


def _apply_mix_preset(raw: dict[str, Any]) -> dict[str, Any]:
    from lemur.data.pack.mix import MIX_PRESETS

    mix = raw.get("mix")
    if not isinstance(mix, dict) or mix.get("preset") is None:
        return raw
    preset = MIX_PRESETS.get(str(mix["preset"]))
    if preset is None:
        raise RecipeError(
            f"recipe: mix.preset {mix['preset']!r} is not one of {', '.join(MIX_PRESETS)}"
        )
    return {**raw, "mix": {**preset, **mix}}


def recipe_from_dict(raw: dict[str, Any], check_paths: bool = True) -> Recipe:
    """Build and validate a Recipe from plain data."""
    if not isinstance(raw, dict):
        raise RecipeError("recipe: top level must be a mapping")
    raw = _apply_benchmark_names(_apply_mix_preset(_apply_presets(raw)))
    recipe = _LOADER.build(Recipe, raw)
    _validate(recipe, check_paths)
    _validate_decontaminate(recipe.decontaminate, check_paths)
    _validate_pii(recipe.pii)
    return recipe


def load_recipe(
    path: str | os.PathLike, overrides: list[str] | None = None, check_paths: bool = True
) -> Recipe:
    """Read a YAML recipe file, apply `--set` overrides and validate it."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"{p}: recipe file not found")
    try:
        raw = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise RecipeError(f"{p}: not valid YAML{where}") from None
    raw = apply_overrides(raw or {}, overrides or [])
    return recipe_from_dict(raw, check_paths)

"""Loading a recipe: YAML, presets, `--set` overrides, the paths it names (RecipeError on any
mistake; the values check themselves in the recipe's dataclasses)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from lemur import typed_yaml
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.recipe import Recipe
from lemur.data.recipe.sources import CHAT_DOMAIN, SOURCE_PRESETS, expand_paths
from lemur.typed_yaml import TypedLoader

_LOADER = TypedLoader(RecipeError, "recipe")


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b=value` overrides (value parsed as YAML; list items by index, `sources.0.name`)."""
    return typed_yaml.apply_overrides(raw, overrides, RecipeError)


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


def check_recipe_paths(recipe: Recipe) -> None:
    """What the recipe names on disk: writable outputs, sources that match files, a usable
    given tokenizer, benchmark files (the values were checked when the recipe was made)."""
    for key, value in (
        ("output", recipe.output),
        ("rejects", recipe.rejects),
        ("work_dir", recipe.work_dir),
    ):
        problem = output_problem(value) if value is not None else None
        if problem:
            raise RecipeError(f"recipe: {key} '{value}' {problem}")
    for i, s in enumerate(recipe.sources):
        expand_paths(s, i)
    tok = recipe.tokenizer
    if tok.model is not None:
        model = Path(tok.model).expanduser()
        # A shard directory lends its tokenizer.
        if not model.is_file() and not (model / "manifest.json").is_file():
            raise RecipeError(
                f"recipe: tokenizer.model '{tok.model}' is not a file or a shard directory"
            )
    if tok.hf is not None:
        hf = Path(tok.hf).expanduser()
        if not (hf / "tokenizer.json" if hf.is_dir() else hf).is_file():
            raise RecipeError(
                f"recipe: tokenizer.hf '{tok.hf}' is not a tokenizer.json or a folder holding one"
            )
    if tok.train is None:
        _check_given_tokenizer(recipe)
    for i, b in enumerate(recipe.decontaminate.benchmarks):
        if b.path is not None and not Path(b.path).expanduser().is_file():
            raise RecipeError(
                f"recipe: decontaminate.benchmarks[{i}].path '{b.path}' is not a file"
            )
    _check_classifier_models(recipe)
    _check_exclude_files(recipe)


def _check_exclude_files(recipe: Recipe) -> None:
    """Each `exclude:` file reads as lines of text: a missing or unreadable list is a recipe
    mistake found before any input is read (exit 2), named with its key."""
    from lemur.data.read.exclude import ExcludeFileError, read_entries

    for kind, path in (recipe.exclude.files() if recipe.exclude else {}).items():
        if path is not None:
            try:
                read_entries(path, kind)
            except ExcludeFileError as e:
                raise RecipeError(str(e)) from None


def _check_classifier_models(recipe: Recipe) -> None:
    """Each classifier's model loads and has its label: a missing, damaged or wrong model
    is a recipe mistake found before any input is read (exit 2)."""
    from lemur.data.filter.classifier import ClassifierError, open_model

    for i, c in enumerate(recipe.filters.classifier or []):
        try:
            open_model(c.model, c.fasttext_label)
        except ClassifierError as e:
            raise RecipeError(f"recipe: filters.classifier[{i}].model: {e}") from None


def _check_given_tokenizer(recipe: Recipe) -> None:
    """Load the tokenizer `tokenizer.model` or `tokenizer.hf` names and check it (framing,
    round trip: `check_given_tokenizer`), so that an unusable one is a recipe mistake found
    before any input is read or the output is made (exit 2)."""
    from lemur.data.encode.prepare import check_given_tokenizer
    from lemur.data.encode.tokenizer import TokenizerError

    key = "model" if recipe.tokenizer.model is not None else "hf"
    try:
        check_given_tokenizer(recipe)
    except TokenizerError as e:
        raise RecipeError(f"recipe: tokenizer.{key}: {e}") from None


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
    from lemur.data.mix import MIX_PRESETS

    mix = raw.get("mix")
    if not isinstance(mix, dict) or mix.get("preset") is None:
        return raw
    preset = MIX_PRESETS.get(str(mix["preset"]))
    if preset is None:
        raise RecipeError(
            f"recipe: mix.preset {mix['preset']!r} is not one of {', '.join(MIX_PRESETS)}"
        )
    return {**raw, "mix": {**preset, **mix}}


def _apply_output(raw: dict[str, Any]) -> dict[str, Any]:
    """`output: {path: DIR, provenance: true}` is `output: DIR` with the recipe's
    `provenance` on (the form `to_dict` writes); off, the key is left out, so the recipe's
    hash stays that of a plain `output: DIR`."""
    output, provenance = raw.get("output"), raw.get("provenance")
    if isinstance(output, dict):
        unknown = sorted(set(output) - {"path", "provenance"})
        if unknown:
            raise RecipeError(
                f"recipe: output.{unknown[0]}: unknown key (output takes path, provenance)"
            )
        if "path" not in output:
            raise RecipeError("recipe: output: missing key 'path' (the shard directory)")
        output, provenance = output["path"], output.get("provenance", provenance)
    out = {k: v for k, v in raw.items() if k != "provenance"}
    if "output" in raw:
        out["output"] = output
    if provenance is not None and provenance is not False:
        out["provenance"] = provenance  # typed: a value that is not a bool is refused
    return out


def _output_overrides(
    raw: dict[str, Any], overrides: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """`--set output.provenance=true` on a recipe whose `output` is a path: the path becomes
    `output.path` first (and `--set output=DIR` beside it sets `output.path`)."""
    if not any(o.startswith("output.") for o in overrides):
        return raw, overrides
    if isinstance(raw.get("output"), str):
        raw = {**raw, "output": {"path": raw["output"]}}
    return raw, ["output.path=" + o[7:] if o.startswith("output=") else o for o in overrides]


def recipe_from_dict(raw: dict[str, Any], check_paths: bool = True) -> Recipe:
    """Build a Recipe from plain data (RecipeError naming the key on any mistake); with
    `check_paths`, also check the files and directories it names."""
    if not isinstance(raw, dict):
        raise RecipeError("recipe: top level must be a mapping")
    raw = _apply_benchmark_names(_apply_mix_preset(_apply_presets(_apply_output(raw))))
    recipe = _LOADER.build(Recipe, raw)  # each section checks its values as it is made
    if check_paths:
        check_recipe_paths(recipe)
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
    raw, overrides = _output_overrides(raw or {}, overrides or [])
    raw = apply_overrides(raw, overrides)
    return recipe_from_dict(raw, check_paths)

"""Recipe loading: typed config, validation errors case by case, overrides, CLI exit codes."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe_loader import apply_overrides, load_recipe, recipe_from_dict


def _recipe(tmp_path: Path, **changes) -> dict:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    raw = {
        "output": str(tmp_path / "out"),
        "tokenizer": {"train": {"vocab_size": 1000}},
        "mix": {"ratio": {"code": 10, "text": 1}},
        "sources": [
            {"name": "c", "domain": "code", "format": "files", "paths": [str(tmp_path)]},
            {"name": "t", "domain": "text", "format": "jsonl", "paths": [str(data)]},
        ],
    }
    raw.update(changes)
    return raw


def test_valid_recipe_types_and_defaults(tmp_path):
    r = recipe_from_dict(
        _recipe(tmp_path, mix={"ratio": {"code": 10, "text": 1}, "total_tokens": "90e9"})
    )
    assert r.mix.total_tokens == 90e9  # YAML 1.1 reads 90e9 as a string; we accept it
    assert r.mix.ratio == {"code": 10.0, "text": 1.0}
    assert r.seq_len == 4096 and r.seed == 1234
    assert r.sources[1].text_key == "text"
    assert r.tokenizer.train.vocab_size == 1000
    assert len(r.sha256()) == 64


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sedd": 1}, "unknown key 'sedd'"),
        ({"mix": {"ratoi": {"code": 1}}}, "unknown key 'mix.ratoi'"),
        ({"seq_len": "long"}, "seq_len must be an integer, got 'long'"),
        ({"seq_len": 4.5}, "seq_len must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"mix": {"ratio": {"code": -1, "text": 1}}}, "mix.ratio.code must be >= 0, got -1"),
        ({"mix": {"ratio": {"code": 0, "text": 0}}}, "mix.ratio needs at least one domain above 0"),
        (
            {"mix": {"ratio": {"code": 1e308, "text": 1e308}}},
            "mix.ratio's weights sum to infinity",
        ),
        ({"work_dir": " "}, "work_dir is empty"),
        ({"mix": {"ratio": {"code": 10}}}, "mix.ratio has no entry for domain 'text'"),
        (
            {"mix": {"ratio": {"code": 1, "text": 1, "math": 1}}},
            "mix.ratio.math: no source has domain 'math'",
        ),
        ({"mix": {"ratio": "10:1"}}, "mix.ratio must be a mapping"),
        ({"tokenizer": {}}, "give exactly one of 'model', 'hf' or 'train'"),
        (
            {"tokenizer": {"model": "/nonexistent/tok.model"}},
            "tokenizer.model '/nonexistent/tok.model' is not a file",
        ),
        ({"executor": {"kind": "spark"}}, "executor.kind 'spark' is not one of"),
        ({"val_fraction": 0.9}, "val_fraction must be in [0, 0.5)"),
        ({"sources": []}, "'sources' is empty"),
        (
            {
                "mix": {
                    "ratio": {"code": 1, "text": 1},
                    "shares": {"code": {"Python": 0.8, "C": 0.3}},
                }
            },
            "mix.shares.code sum to 1.1000 > 1",
        ),
        (
            {"mix": {"ratio": {"code": 1, "text": 1}, "shares": {"math": {"x": 0.5}}}},
            "mix.shares.math: no source has domain 'math'",
        ),
        ({"mix": {"preset": "nope"}}, "mix.preset 'nope' is not one of lemur"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path, change, message):
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(_recipe(tmp_path, **change))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_sources(tmp_path):
    raw = _recipe(tmp_path)
    raw["sources"][1]["paths"] = [str(tmp_path / "missing/*.jsonl")]
    with pytest.raises(RecipeError, match=r"source 't': path '.*missing/\*.jsonl' matches nothing"):
        recipe_from_dict(raw)
    with pytest.raises(RecipeError) as e:
        recipe_from_dict(raw)
    assert str(e.value).endswith("point it at your files: --set 'sources.1.paths=[DIR_OR_GLOB]'")
    raw = _recipe(tmp_path)
    raw["sources"][1]["format"] = "csv"
    with pytest.raises(
        RecipeError, match=r"sources\[1\].format 'csv' is not one of jsonl, parquet, files"
    ):
        recipe_from_dict(raw)
    raw = _recipe(tmp_path)
    del raw["sources"][0]["domain"]
    with pytest.raises(RecipeError, match=r"missing key 'sources\[0\].domain'"):
        recipe_from_dict(raw)
    raw = _recipe(tmp_path)
    raw["sources"][1]["name"] = "c"
    with pytest.raises(RecipeError, match="used twice"):
        recipe_from_dict(raw)


def test_overrides(tmp_path):
    raw = apply_overrides(
        _recipe(tmp_path), ["mix.ratio.code=8", "sources.1.text_key=content", "seq_len=2048"]
    )
    r = recipe_from_dict(raw)
    assert r.mix.ratio["code"] == 8.0 and r.sources[1].text_key == "content" and r.seq_len == 2048
    with pytest.raises(RecipeError, match="no list item '5'"):
        apply_overrides(_recipe(tmp_path), ["sources.5.name=x"])
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        apply_overrides(_recipe(tmp_path), ["seq_len"])


def test_load_recipe_file_errors(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [\n  - {name: a\n")
    with pytest.raises(RecipeError, match=r"not valid YAML \(line"):
        load_recipe(bad)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lemur.data.cli", *args], capture_output=True, text=True
    )


def test_cli_bad_recipe_exit_2_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, sedd=1)))
    res = _cli("build", str(path))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "lemur-data: error: recipe: unknown key 'sedd' (known: chat, decontaminate, dedup, exclude, "
        "executor, export, filters, fim, inspect, mix, output, pii, provenance, rejects, repos, seed, "
        "seq_len, shard_tokens, sources, tokenize_batch_docs, tokenizer, val_fraction, work_dir)"
    ]
    assert "Traceback" not in res.stderr


def test_unusable_tokenizer_model_is_exit_2_before_reading(tmp_path):
    """docs/recipe.md: a given model that is not a SentencePiece model with <s>=1, </s>=2 is a
    one-line error naming it, exit 2, before any input is read."""
    bogus = tmp_path / "passwd"
    bogus.write_text("root:x:0:0:root:/root:/bin/bash\n")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, tokenizer={"model": str(bogus)})))
    res = _cli("build", str(path))
    assert res.returncode == 2, res.stderr
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"lemur-data: error: recipe: tokenizer.model: {bogus}: not a SentencePiece model"
    ), err
    assert not (tmp_path / "out").exists()
    # A shard directory lends the tokenizer its manifest names: that file must be usable too.
    shards = tmp_path / "shards"
    shards.mkdir()
    manifest = {"format": "lemur-shards/1", "dtype": "uint16", "seq_len": 8, "shards": []}
    (shards / "manifest.json").write_text(
        json.dumps({**manifest, "tokenizer": {"file": "gone.model"}})
    )
    with pytest.raises(RecipeError, match=r"tokenizer.model: .*gone.model: not a SentencePiece"):
        recipe_from_dict(_recipe(tmp_path, tokenizer={"model": str(shards)}))


def test_cli_dry_run_prints_resolved_recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path)))
    res = _cli("build", str(path), "--dry-run", "--set", "mix.ratio.code=4")
    assert res.returncode == 0, res.stderr
    resolved = yaml.safe_load(res.stdout)
    assert resolved["mix"]["ratio"] == {"code": 4.0, "text": 1.0}
    assert resolved["seq_len"] == 4096
    assert not (tmp_path / "out").exists()


def test_shipped_recipes_parse():
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "recipes").glob("*.yaml"))
    assert files, "no example recipes shipped"
    for f in files:
        load_recipe(f, check_paths=False)


@pytest.mark.parametrize(
    "override, key",
    [
        ("mix.max_repeats=.nan", "mix.max_repeats"),
        ("mix.max_repeats=.inf", "mix.max_repeats"),
        ("mix.ratio.code=.nan", "mix.ratio.code"),
        ("mix.ratio.text=.inf", "mix.ratio.text"),
        ("mix.total_tokens=.nan", "mix.total_tokens"),
        ("mix.total_tokens=.inf", "mix.total_tokens"),
        ("mix.shares.code.Python=.nan", "mix.shares.code.Python"),
        ("val_fraction=.nan", "val_fraction"),
        ("dedup.min_similarity=.nan", "dedup.min_similarity"),
        ("executor.mem_per_cpu_gb=.inf", "executor.mem_per_cpu_gb"),
        ("tokenizer.train.character_coverage=.nan", "tokenizer.train.character_coverage"),
        ("filters.code.min_alnum_fraction=.nan", "filters.code.min_alnum_fraction"),
        ("seq_len=.inf", "seq_len"),
    ],
)
def test_nan_and_inf_are_refused_naming_the_key(tmp_path, override, key):
    # Every comparison with NaN is false, so NaN would pass a range check such as
    # `max_repeats < 1` and remove the repeat cap; inf breaks the mix plan's arithmetic.
    with pytest.raises(RecipeError, match=rf"^recipe: {re.escape(key)} must be"):
        recipe_from_dict(apply_overrides(_recipe(tmp_path), [override]))


@pytest.mark.parametrize(
    "train, message",
    [
        ({"vocab_size": 10}, "tokenizer.train.vocab_size must be > 256, got 10"),
        ({"character_coverage": 0.5}, "tokenizer.train.character_coverage must be in [0.98, 1]"),
        ({"max_sentence_length": 5}, "tokenizer.train.max_sentence_length must be in [10, 2^30]"),
        ({"sample_bytes": 0}, "tokenizer.train.sample_bytes must be >= 1"),
    ],
)
def test_tokenizer_train_settings_sentencepiece_refuses(tmp_path, train, message):
    with pytest.raises(RecipeError, match=re.escape(message)):
        recipe_from_dict(_recipe(tmp_path, tokenizer={"train": train}))


def test_empty_output_is_refused(tmp_path):
    # `--set output=` would otherwise build into the current directory.
    for check_paths in (True, False):
        with pytest.raises(RecipeError, match="^recipe: output is empty$"):
            recipe_from_dict(apply_overrides(_recipe(tmp_path), ["output="]), check_paths)


def _replaced(r, **changes):
    """`dataclasses.replace` of a section of `r` (dotted key) or of `r` itself."""
    (key, value), *_ = changes.items()
    section, _, field = key.rpartition("__")
    if not section:
        return dataclasses.replace(r, **{field: value})
    return dataclasses.replace(getattr(r, section), **{field: value})


@pytest.mark.parametrize(
    "override, change",
    [
        ("seq_len=0", {"seq_len": 0}),
        ("output=' '", {"output": " "}),
        ("val_fraction=0.7", {"val_fraction": 0.7}),
        ("pii.domains=['co de']", {"pii__domains": ["co de"]}),
        ("pii.kinds=[phone]", {"pii__kinds": ["phone"]}),
        ("mix.max_repeats=0.5", {"mix__max_repeats": 0.5}),
        ("mix.ratio.code=-1", {"mix__ratio": {"code": -1.0, "text": 1.0}}),
        ("dedup.min_similarity=0", {"dedup__min_similarity": 0.0}),
        ("executor.retries=-1", {"executor__retries": -1}),
        ("executor.kind=spark", {"executor__kind": "spark"}),
        ("decontaminate.ngram=2", {"decontaminate__ngram": 2}),
    ],
)
def test_replace_runs_the_checks_loading_runs(tmp_path, override, change):
    """One validation style: a section made with `dataclasses.replace` (or directly) raises
    the very RecipeError that loading the same value raises."""
    r = recipe_from_dict(_recipe(tmp_path))
    with pytest.raises(RecipeError) as loaded:
        recipe_from_dict(apply_overrides(_recipe(tmp_path), [override]))
    with pytest.raises(RecipeError) as replaced:
        _replaced(r, **change)
    assert str(replaced.value) == str(loaded.value)


def test_recipe_made_directly_runs_the_checks_loading_runs(tmp_path):
    """`Recipe(...)` checks the rules spanning sections: sources, the ratio's domains,
    the training vocabulary, each naming the key as loading does."""
    from lemur.data.recipe.recipe import MixConfig, Recipe
    from lemur.data.recipe.tokenizer import TokenizerConfig, TokenizerTrainConfig

    r = recipe_from_dict(_recipe(tmp_path))
    cases = [
        (
            lambda: dataclasses.replace(
                r, sources=[r.sources[0], dataclasses.replace(r.sources[1], format="csv")]
            ),
            ["sources.1.format=csv"],
        ),
        (
            lambda: dataclasses.replace(r, sources=[r.sources[0], r.sources[0]]),
            ["sources.1.name=c"],
        ),
        (lambda: dataclasses.replace(r, mix=MixConfig(ratio={"code": 1})), ["mix.ratio={code: 1}"]),
        (
            lambda: Recipe(
                output=r.output,
                sources=r.sources,
                tokenizer=TokenizerConfig(train=TokenizerTrainConfig(vocab_size=10)),
            ),
            ["tokenizer.train.vocab_size=10"],
        ),
        (lambda: Recipe(output=r.output, sources=[], tokenizer=r.tokenizer), ["sources=[]"]),
    ]
    for make, overrides in cases:
        with pytest.raises(RecipeError) as loaded:
            recipe_from_dict(apply_overrides(_recipe(tmp_path), overrides))
        with pytest.raises(RecipeError) as made:
            make()
        assert str(made.value) == str(loaded.value), overrides


def test_filters_text_enabled_switches_the_four_text_rules_off_at_once(tmp_path):
    from lemur.data.stages.reading import make_filters

    def kinds(filters: dict) -> list[str]:
        recipe = recipe_from_dict(_recipe(tmp_path, filters=filters))
        return [type(f).__name__ for f in make_filters(recipe)]

    text_rules = ["C4Filter", "GopherQualityFilter", "FineWebFilter", "GopherRepetitionFilter"]
    assert set(text_rules) <= set(kinds({}))
    off = kinds({"text": {"enabled": False}})
    assert not set(text_rules) & set(off)
    assert off == kinds(
        {
            "text": {
                k: {"enabled": False}
                for k in ("c4", "gopher_quality", "fineweb", "gopher_repetition")
            }
        }
    )
    assert "GopherQualityFilter" in kinds({"code": {"enabled": False}})  # code's switch alone


def test_build_reads_the_recipe_once(tmp_path, monkeypatch, capsys):
    """`lemur-data build` reads and validates its recipe once (#35): the paths are checked on
    the recipe already read, after the demo conversations it may name are written."""
    from lemur.data import cli

    path = tmp_path / "r.yaml"
    raw = _recipe(tmp_path)
    raw["sources"][0]["paths"] = [str(tmp_path / "missing-*.jsonl")]
    path.write_text(yaml.safe_dump(raw))
    reads = []
    real_load = yaml.safe_load

    def counted(text):
        reads.append(text)
        return real_load(text)

    monkeypatch.setattr(yaml, "safe_load", counted)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["build", str(path)])
    assert exit_info.value.code == 2
    assert "missing-*.jsonl" in capsys.readouterr().err
    assert len(reads) == 1, f"the recipe was read {len(reads)} times"

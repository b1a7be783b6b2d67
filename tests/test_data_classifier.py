"""Quality classifiers: training separates held-out text, the build stage's scores are
fastText's, `keep_top` cuts the same documents on every executor, a re-cut reads cached
scores, and a bad model file is a one-line error."""

from __future__ import annotations

import random
import re
import sysconfig
from pathlib import Path

import pytest
import yaml
from conftest import write_jsonl
from datatrove.data import Document

from lemur.data.build import build
from lemur.data.filter.classifier import ClassifierFilter, normalise
from lemur.data.filter.classifier_train import TrainSettings, auc, evaluate, fit, split
from lemur.data.recipe.classifier import ClassifierConfig
from lemur.data.recipe_loader import recipe_from_dict

# Small and quick: tiny vectors and hash table; enough epochs to separate prose from code.
SETTINGS = TrainSettings(dim=16, epoch=10, bucket=20_000, lr=0.2)


def prose_paragraphs() -> list[str]:
    """Paragraphs of Python's help topics: well-formed English documentation."""
    from pydoc_data.topics import topics

    paras = [p.strip() for name in sorted(topics) for p in topics[name].split("\n\n")]
    return [p for p in paras if len(p.split()) >= 12]


def code_paragraphs(n: int = 1500) -> list[str]:
    """Blocks of 4-10 lines of the Python standard library: not prose."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        out += ["\n".join(lines[i : i + 8]) for i in range(0, len(lines) - 8, 40)]
        if len(out) >= n:
            break
    return out[:n]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A classifier trained on prose (positive) against code (negative)."""
    out = tmp_path_factory.mktemp("model") / "prose.bin"
    pos, neg = split(prose_paragraphs(), SETTINGS, "p"), split(code_paragraphs(), SETTINGS, "n")
    fit(pos.train, neg.train, SETTINGS, out)
    return out


def test_trained_classifier_separates_held_out_text_better_than_shuffled_labels(tmp_path):
    pos, neg = split(prose_paragraphs(), SETTINGS, "p"), split(code_paragraphs(), SETTINGS, "n")
    fit(pos.train, neg.train, SETTINGS, tmp_path / "real.bin")
    real = evaluate(tmp_path / "real.bin", pos.valid, neg.valid, SETTINGS)
    # The same training texts with their labels shuffled, judged on the same held-out split.
    texts = pos.train + neg.train
    random.Random(0).shuffle(texts)
    fit(texts[: len(pos.train)], texts[len(pos.train) :], SETTINGS, tmp_path / "shuffled.bin")
    shuffled = evaluate(tmp_path / "shuffled.bin", pos.valid, neg.valid, SETTINGS)
    assert real["valid_positive"] > 50 and real["valid_negative"] > 50
    print(f"held-out AUC {real['auc']:.3f} against {shuffled['auc']:.3f} with shuffled labels")
    assert real["auc"] > shuffled["auc"] + 0.2
    assert real["precision"] > shuffled["precision"] and real["recall"] > 0.5


def test_auc_counts_ties_as_half():
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.5], [0.5]) == 0.5
    assert auc([0.9, 0.4], [0.5, 0.1]) == 0.75


def mixed_documents(n: int, seed: int = 0) -> list[dict]:
    """`n` documents mixing prose and code paragraphs in seeded shares: scores spread."""
    rng = random.Random(seed)
    prose, code = prose_paragraphs(), code_paragraphs()
    docs = []
    for i in range(n):
        k = rng.randint(1, 3)
        share = rng.random()
        parts = [rng.choice(prose) if rng.random() < share else rng.choice(code) for _ in range(k)]
        docs.append({"id": f"d{i}", "text": f"Document {i}.\n" + "\n\n".join(parts)})
    return docs


def test_scores_in_metadata_are_fasttext_predicts_on_every_document(model):
    import fasttext

    config = ClassifierConfig(name="prose", model=str(model), label="hq")
    f = ClassifierFilter(config, ["s"], {}, cache_dir=str(model.parent / "cache"))
    docs = [
        Document(text=d["text"], id=d["id"], metadata={"source": "s"}) for d in mixed_documents(500)
    ]
    kept = list(f.run(iter(docs)))
    assert len(kept) == 500  # no rule: every document is kept, with its score
    reference = fasttext.load_model(str(model))
    for doc in kept:
        labels, probs = reference.predict(normalise(doc.text, " "), k=-1)
        assert doc.metadata["quality"]["prose"] == float(
            dict(zip(labels, probs, strict=False))["__label__hq"]
        )
    assert len({d.metadata["quality"]["prose"] for d in kept}) > 400  # spread, not constant


def recipe(tmp: Path, name: str, classifier: dict, executor: dict | None = None, **extra) -> dict:
    """One text source of the mixed documents, filters and dedup off, the given classifier."""
    return {
        "output": str(tmp / name),
        "seed": 3,
        "val_fraction": 0.01,
        "seq_len": 256,
        "shard_tokens": 200_000,
        "tokenizer": {"train": {"vocab_size": 400, "sample_bytes": 200_000}},
        "mix": {"ratio": {"text": 1}},
        "executor": executor or {"kind": "local", "tasks": 2, "workers": 1},
        "dedup": {"exact": False, "near": False},
        "decontaminate": {"benchmarks": []},
        "sources": [
            {"name": "mixed", "domain": "text", "format": "jsonl", "paths": [str(tmp / "d*.jsonl")]}
        ],
        "filters": {
            "text": {"enabled": False},
            "classifier": [{"name": "prose", "label": "hq", **classifier}],
        },
        **extra,
    }


def write_source(tmp: Path, n: int) -> None:
    """The mixed documents in two JSONL files (so two tasks share them)."""
    docs = mixed_documents(n)
    write_jsonl(tmp / "d0.jsonl", docs[: n // 2])
    write_jsonl(tmp / "d1.jsonl", docs[n // 2 :])


def shard_bytes(out: Path, manifest: dict) -> list[bytes]:
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def test_keep_top_keeps_a_tenth_of_10000_documents_alike_on_local_and_ray(tmp_path, model):
    ray = pytest.importorskip("ray")
    write_source(tmp_path, 10_000)
    rule = {"model": str(model), "keep_top": 0.1, "sample_docs": 10_000}
    local = build(recipe_from_dict(recipe(tmp_path, "local", rule)))
    entry = local["classifiers"]["prose"]
    print(f"keep_top 0.1: kept {entry['kept']:,} of 10,000 (cut {entry['thresholds']['mixed']})")
    assert entry["sample_docs"] == {"mixed": 10_000}
    assert 900 <= entry["kept"] <= 1100 and entry["kept"] + entry["dropped"] == 10_000
    assert local["counts"]["dropped"] == {"quality:prose": entry["dropped"]}
    assert entry["scored"] == 10_000 and entry["cached"] == 0
    ex = entry["examples"]
    assert min(e["score"] for e in ex["kept_low"]) >= entry["thresholds"]["mixed"]
    assert max(e["score"] for e in ex["dropped_high"]) < entry["thresholds"]["mixed"]
    executor = {"kind": "ray", "tasks": 2, "workers": 2, "address": "local"}
    remote = build(recipe_from_dict(recipe(tmp_path, "ray", rule, executor)))
    assert not ray.is_initialized()
    assert remote["classifiers"]["prose"]["thresholds"] == entry["thresholds"]
    assert remote["classifiers"]["prose"]["kept"] == entry["kept"]
    assert shard_bytes(tmp_path / "ray", remote) == shard_bytes(tmp_path / "local", local)


def test_a_recut_from_cached_scores_equals_a_fresh_build_with_that_cut(tmp_path, model):
    write_source(tmp_path, 600)
    first = {"model": str(model), "keep_top": 0.5}
    work = str(tmp_path / "work")
    a = build(recipe_from_dict(recipe(tmp_path, "a", first, work_dir=work)))
    assert a["classifiers"]["prose"]["scored"] == 600
    cut = {"model": str(model), "min_score": 0.3}
    recut = build(
        recipe_from_dict(recipe(tmp_path, "b", cut, work_dir=work, rejects=str(tmp_path / "rej")))
    )
    own = tmp_path / "own.bin"  # a copy, retrained below
    own.write_bytes(model.read_bytes())
    cut = {"model": str(own), "min_score": 0.3}
    fresh = build(recipe_from_dict(recipe(tmp_path, "c", cut)))
    assert recut["classifiers"]["prose"]["scored"] == 0  # every score from the cache
    assert recut["classifiers"]["prose"]["cached"] == 600
    assert fresh["classifiers"]["prose"]["scored"] == 600
    assert recut["counts"]["dropped"] == fresh["counts"]["dropped"]
    assert 0 < fresh["classifiers"]["prose"]["dropped"] < 600
    assert shard_bytes(tmp_path / "b", recut) == shard_bytes(tmp_path / "c", fresh)
    # The dropped documents, written by the rejects writer, carry their scores.
    import gzip
    import json

    rows = [
        json.loads(line)
        for p in sorted((tmp_path / "rej" / "classifier-prose").glob("*.jsonl.gz"))
        for line in gzip.open(p, "rt")
    ]
    assert len(rows) == fresh["classifiers"]["prose"]["dropped"]
    assert all(r["metadata"]["quality"]["prose"] < 0.3 for r in rows)
    assert {r["metadata"]["filter_reason"] for r in rows} == {"quality:prose"}
    # The same recipe again is up to date; with the model retrained into its file it is not.
    assert build(recipe_from_dict(recipe(tmp_path, "c", cut))) == fresh
    pos, neg = split(prose_paragraphs(), SETTINGS, "p"), split(code_paragraphs(), SETTINGS, "n")
    fit(pos.train[:100], neg.train[:100], SETTINGS, own)
    again = build(recipe_from_dict(recipe(tmp_path, "c", cut)))
    assert again["classifiers"]["prose"]["scored"] == 600
    assert again["classifiers"]["prose"]["key"] != fresh["classifiers"]["prose"]["key"]


def bad_model_error(tmp_path, capsys, model_path: Path, label: str = "hq") -> str:
    from lemur.data.cli import main

    write_source(tmp_path, 20)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(tmp_path, "out", {"model": str(model_path)})))
    raw = yaml.safe_load(path.read_text())
    raw["filters"]["classifier"][0]["label"] = label
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SystemExit) as e:
        main(["build", str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing made
    return err


def test_a_missing_model_is_a_one_line_error_naming_it(tmp_path, capsys):
    err = bad_model_error(tmp_path, capsys, tmp_path / "nope.bin")
    assert err.endswith(f"filters.classifier[0].model: {tmp_path / 'nope.bin'}: no such model file")


@pytest.mark.parametrize("damage", ["truncated", "not_fasttext", "halved"])
def test_a_damaged_model_is_a_one_line_error_naming_it(tmp_path, capsys, model, damage):
    data = model.read_bytes()
    bad = tmp_path / "bad.bin"
    cut = {"truncated": len(data) - 7, "halved": len(data) // 2, "not_fasttext": 0}[damage]
    bad.write_bytes(data[:cut] if cut else b"PK\x03\x04 a zip file, not a model" * 10)
    err = bad_model_error(tmp_path, capsys, bad)
    assert f"filters.classifier[0].model: {bad}: " in err
    assert ("no fastText signature" if damage == "not_fasttext" else "truncated") in err


def test_a_model_without_the_label_is_a_one_line_error_naming_it(tmp_path, capsys, model):
    err = bad_model_error(tmp_path, capsys, model, label="edu")
    assert err.endswith(
        f"{model}: has no label '__label__edu' (its labels: __label__cc, __label__hq)"
    ) or err.endswith(
        f"{model}: has no label '__label__edu' (its labels: __label__hq, __label__cc)"
    )


def test_classifier_train_command_writes_the_model_and_its_card(tmp_path, capsys):
    import json

    from lemur.data.cli import main

    write_jsonl(tmp_path / "pos.jsonl", [{"text": t} for t in prose_paragraphs()[:300]])
    write_jsonl(tmp_path / "neg.jsonl", [{"body": t} for t in code_paragraphs(300)])
    out = tmp_path / "m" / "q.bin"
    args = ["classifier", "train", "--positive", str(tmp_path / "pos.jsonl"), "--negative"]
    args += [str(tmp_path / "neg.jsonl"), "--out", str(out), "--dim", "8", "--bucket", "5000"]
    with pytest.raises(SystemExit) as e:  # `body` is not the default `text` field
        main([*args, "--epoch", "2"])
    assert e.value.code == 2
    write_jsonl(tmp_path / "neg.jsonl", [{"text": t} for t in code_paragraphs(300)])
    assert main([*args, "--epoch", "5", "--valid-fraction", "0.2"]) == 0
    assert "held-out: precision" in capsys.readouterr().out
    card = json.loads(out.with_suffix(".json").read_text())
    assert card["labels"] == {"positive": "__label__hq", "negative": "__label__cc"}
    assert card["documents"] == {
        "train_positive": 240,
        "train_negative": 240,
        "valid_positive": 60,
        "valid_negative": 60,
    }
    assert card["settings"]["dim"] == 8 and card["settings"]["word_ngrams"] == 2
    assert (
        card["data"]["positive"][0]["documents"] == 300
        and len(card["data"]["positive"][0]["sha256"]) == 64
    )
    assert 0.5 < card["metrics"]["auc"] <= 1 and 0 <= card["metrics"]["precision"] <= 1


@pytest.mark.parametrize(
    ("classifiers", "message"),
    [
        ([{"min_score": 0.5, "keep_top": 0.1}], "give min_score or keep_top, not both"),
        ([{"keep_top": 0}], "keep_top must be in (0, 1], got 0"),
        ([{"min_score": 1.5}], "min_score must be in [0, 1], got 1.5"),
        ([{"domains": ["code"]}], "domains: no source has domain 'code'"),
        ([{"sources": ["web"]}], "sources: no source is named 'web'"),
        ([{}, {}], "filters.classifier 'prose': the name is used twice"),
    ],
)
def test_classifier_settings_are_checked_naming_the_key(tmp_path, classifiers, message):
    from lemur.data.recipe.errors import RecipeError

    raw = recipe(tmp_path, "out", {"model": "m.bin"})
    raw["filters"]["classifier"] = [{"name": "prose", "model": "m.bin", **c} for c in classifiers]
    with pytest.raises(RecipeError, match=re.escape(message)):
        recipe_from_dict(raw, check_paths=False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--valid-fraction", "-0.5"], "--valid-fraction must be in [0, 1), got -0.5"),
        (
            ["--valid-fraction", "1"],
            "--valid-fraction must be in [0, 1), got 1.0 (1 holds out every document)",
        ),
        (["--dim", "0"], "--dim must be >= 1, got 0"),
        (["--epoch", "0"], "--epoch must be >= 1, got 0"),
        (["--lr", "-1"], "--lr must be a finite number > 0, got -1.0"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--word-ngrams", "0"], "--word-ngrams must be >= 1, got 0"),
        (["--min-count", "0"], "--min-count must be >= 1, got 0"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (
            ["--bucket", "0"],
            "--bucket must be >= 1 for word n-grams (--word-ngrams 2), got 0; or --word-ngrams 1",
        ),
        (
            ["--label", "cc"],
            "--label and --negative-label are both '__label__cc': the two classes need two labels",
        ),
        (["--label", "high quality"], "--label 'high quality': a fastText label has no spaces"),
        (["--negative-label", ""], "--negative-label is empty"),
    ],
)
def test_classifier_train_refuses_nonsense_settings(tmp_path, capsys, flags, message):
    """Each setting fastText cannot train with (or trains backwards with) is one line naming
    its flag, exit 2, nothing written (#44 item 21)."""
    from lemur.data.cli import main

    write_jsonl(tmp_path / "pos.jsonl", [{"text": t} for t in prose_paragraphs()[:40]])
    write_jsonl(tmp_path / "neg.jsonl", [{"text": t} for t in code_paragraphs(40)])
    out = tmp_path / "m" / "q.bin"
    args = ["classifier", "train", "--positive", str(tmp_path / "pos.jsonl"), "--negative"]
    args += [str(tmp_path / "neg.jsonl"), "--out", str(out), "--dim", "4", "--bucket", "500"]
    with pytest.raises(SystemExit) as e:
        main([*args, *flags])
    err = capsys.readouterr().err
    assert (e.value.code, err) == (2, f"lemur-data: error: {message}\n")
    assert not (tmp_path / "m").exists()


def test_all_documents_held_out_names_valid_fraction(tmp_path):
    """Three documents at --valid-fraction 0.9 leave none to train on: said so, naming the
    flag (it said "no positive documents with text to train on")."""
    from lemur.cli_common import UserError
    from lemur.data.filter.classifier_train import train

    settings = TrainSettings(valid_fraction=0.9)
    with pytest.raises(UserError) as e:
        train(["a b c", "d e f", "g h i"], ["x y", "z w"], settings, tmp_path / "q.bin", {})
    assert str(e.value) == (
        "--valid-fraction 0.9 holds out all 3 positive documents: none left to train on; "
        "lower it or give more documents"
    )
    assert list(tmp_path.iterdir()) == []

"""The build's quality classifier stages (`filters.classifier`): their filters, the
`keep_top` cuts found once per build from a seeded sample of each source, and the
manifest's `classifiers` section (docs/filters.md#quality-classifiers).

A `keep_top` cut is the score at that percentile of a sample of the source's documents as
the stage sees them: read, tagged and passed through the filters before it (the heuristic
filters and earlier classifiers), in an order seeded by the recipe's seed. It is computed
here, in the driver, and handed to every task inside the filter, so every task of every
executor applies the same cut; it is recorded in the manifest.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import get_filter_result

from lemur.atomic_files import atomic_write_text
from lemur.data import work as work_folders
from lemur.data.filter.base import LemurFilter
from lemur.data.filter.classifier import (
    EXAMPLES,
    ClassifierFilter,
    ScoreCache,
    Scorer,
    model_fingerprint,
)
from lemur.data.filter.tagging import LanguageTagger
from lemur.data.read.listing import InputFile, list_inputs
from lemur.data.read.sources import SourcesReader
from lemur.data.recipe.classifier import ClassifierConfig
from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.recipe import Recipe

if TYPE_CHECKING:  # training imports fastText's trainer: only `lemur-data classifier train`
    from lemur.data.filter.classifier_train import TrainSettings

CUTS = "cuts.json"


def classifier_key(config: ClassifierConfig) -> str:
    """What a classifier's scores depend on: the model's content, label and normalisation."""
    parts = [model_fingerprint(config.model), config.fasttext_label]
    parts += [config.newline, config.lowercase]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def classifier_keys(recipe: Recipe) -> list[str]:
    """Every classifier's key, in order (a part of the tokenize work's key)."""
    return [classifier_key(c) for c in recipe.filters.classifier or []]


def classifiers_unchanged(recipe: Recipe, manifest: dict[str, Any]) -> bool:
    """Whether a build's manifest scored with the recipe's classifiers as they are now (a
    model retrained into the same file makes the build out of date)."""
    recorded = [c.get("key") for c in manifest.get("classifiers", {}).values()]
    return recorded == classifier_keys(recipe)


def top_threshold(scores: list[float], keep_top: float) -> float:
    """The score of the document at rank ceil(keep_top x n), best first: keeping scores at
    or above it keeps `keep_top` of the sample (more only where scores tie)."""
    if not scores:
        return 0.0  # nothing of the source reaches the stage: there is nothing to cut
    ranked = sorted(scores, reverse=True)
    k = max(1, math.ceil(keep_top * len(ranked) - 1e-9))
    return ranked[k - 1]


def _survivors(docs: Iterator[Document], tagger: LanguageTagger, filters: list[LemurFilter]):
    """The documents the filters before a classifier keep (as in a task, in that order)."""
    for doc in tagger.run(docs, 0, 1):
        if all(get_filter_result(f.filter(doc))[0] for f in filters):
            yield doc


def sample_scores(
    recipe: Recipe,
    config: ClassifierConfig,
    source: str,
    inputs: list[InputFile],
    before: list[LemurFilter],
) -> list[float]:
    """Scores of up to `sample_docs` documents of `source` reaching the classifier: its
    files in a seeded order, read whole until the sample is full (all of a smaller source)."""
    index = next(i for i, s in enumerate(recipe.sources) if s.name == source)
    files = [f for f in inputs if f.source == index]
    random.Random(f"{recipe.seed}:{config.name}:{source}").shuffle(files)
    reader = SourcesReader(inputs, recipe.sources, errors_dir="")

    def documents() -> Iterator[Document]:
        for f in files:
            yield from reader.read(f)

    # Copies: the sample must not add to the counts the task's own steps report.
    steps = copy.deepcopy(before)
    cache = work_folders.quality_cache(recipe.work_root(), config.name, classifier_key(config))
    scorer = Scorer(config, ScoreCache(cache / f"sample-{source}.npz"))
    scores: list[float] = []
    for doc in _survivors(documents(), LanguageTagger(), steps):
        scores.append(scorer(doc.text))
        if len(scores) >= config.sample_docs:
            break
    scorer.cache.save()
    return scores


def classifier_filters(
    recipe: Recipe,
    before: list[LemurFilter],
    inputs: list[InputFile] | None = None,
    run_dir: Path | None = None,
) -> list[ClassifierFilter]:
    """The recipe's classifier filters, after the filters `before`, with their cuts; with a
    tokenize run's folder, the cuts are recorded there and each task writes its summary."""
    filters: list[ClassifierFilter] = []
    record: dict[str, Any] = {}
    for config in recipe.filters.classifier or []:
        sources = [s.name for s in recipe.sources if config.applies(s)]
        key = classifier_key(config)
        cuts: dict[str, float] = {}
        sampled: dict[str, int] = {}
        if config.keep_top is not None:
            inputs = inputs if inputs is not None else list_inputs(recipe).files
            for source in sources:
                scores = sample_scores(recipe, config, source, inputs, [*before, *filters])
                cuts[source], sampled[source] = top_threshold(scores, config.keep_top), len(scores)
        summaries = work_folders.quality_run(run_dir) / config.name if run_dir else None
        cache = work_folders.quality_cache(recipe.work_root(), config.name, key)
        filters.append(
            ClassifierFilter(
                config, sources, cuts, str(cache), str(summaries) if summaries else None
            )
        )
        record[config.name] = _record(config, key, sources, cuts, sampled)
    if run_dir is not None and record:
        path = work_folders.quality_run(run_dir) / CUTS
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True))
    return filters


def _record(
    config: ClassifierConfig,
    key: str,
    sources: list[str],
    cuts: dict[str, float],
    sampled: dict[str, int],
) -> dict[str, Any]:
    """A classifier's entry in the manifest, before the tasks' counts are added."""
    rule: dict[str, Any]
    if config.keep_top is not None:
        rule = {"keep_top": config.keep_top, "thresholds": cuts, "sample_docs": sampled}
    elif config.min_score is not None:
        rule = {"min_score": config.min_score}
    else:
        rule = {"score_only": True}
    return {
        "model": config.model,
        "model_fingerprint": model_fingerprint(config.model),
        "key": key,  # the fingerprint, label and normalisation: what the scores depend on
        "label": config.fasttext_label,
        "normalisation": {"newline": config.newline, "lowercase": config.lowercase},
        "sources": sources,
        **rule,
    }


def classifier_section(recipe: Recipe, run_dir: Path, n_tasks: int) -> dict[str, Any]:
    """The manifest's `classifiers` (nothing without classifiers): per classifier its rule
    and cuts, what the tasks scored or took from the cache, kept and dropped, and the
    extreme documents of each side."""
    if not recipe.filters.classifier:
        return {}
    folder = work_folders.quality_run(run_dir)
    section = json.loads((folder / CUTS).read_text())
    for name, entry in section.items():
        totals = {"scored": 0, "cached": 0, "kept": 0, "dropped": 0}
        examples: dict[str, list[dict[str, Any]]] = {}
        for rank in range(n_tasks):
            path = folder / name / f"{rank:05d}.json"
            if not path.is_file():  # a task that got no document of the sources
                continue
            task = json.loads(path.read_text())
            for k in totals:
                totals[k] += task[k]
            for kind, items in task["examples"].items():
                examples.setdefault(kind, []).extend(items)
        judged = totals["kept"] + totals["dropped"]
        entry.update(totals, keep_rate=totals["kept"] / judged if judged else None)
        entry["examples"] = {
            kind: sorted(items, key=lambda e: (-e["score"], e["id"]))[:EXAMPLES]
            if kind.endswith("high")
            else sorted(items, key=lambda e: (e["score"], e["id"]))[:EXAMPLES]
            for kind, items in examples.items()
        }
    return {"classifiers": section}


def source_texts(recipe: Recipe, inputs: list[InputFile], name: str) -> tuple[list[str], dict]:
    """Every document text of the source `name`, and the card's entry for it: its files'
    combined SHA-256 (over each file's path and content digest) and counts."""
    from lemur.data.filter.classifier_train import file_sha256

    index = next(i for i, s in enumerate(recipe.sources) if s.name == name)
    files = [f for f in inputs if f.source == index]
    reader = SourcesReader(inputs, recipe.sources, errors_dir="")
    texts = [doc.text for f in files for doc in reader.read(f)]
    digest = hashlib.sha256()
    for path in sorted({f.open_path for f in files}):
        digest.update(f"{path}\0{file_sha256(path)}\n".encode())
    paths = recipe.sources[index].paths
    entry = {"source": name, "paths": paths, "files": len({f.open_path for f in files})}
    return texts, {**entry, "sha256": digest.hexdigest(), "documents": len(texts)}


def training_recipe(positive: list[str], negative: list[str], text_key: str) -> Recipe:
    """A recipe of two JSONL sources, `positive` and `negative`, to read training texts."""
    from lemur.data.recipe_loader import recipe_from_dict

    def source(name: str, paths: list[str]) -> dict[str, Any]:
        return {"name": name, "domain": "text", "format": "jsonl", "paths": paths}

    raw = {
        "output": "unused",  # nothing is built
        "tokenizer": {"train": {}},
        "mix": {"ratio": {"text": 1}},
        "sources": [
            {**source("positive", positive), "text_key": text_key},
            {**source("negative", negative), "text_key": text_key},
        ],
    }
    return recipe_from_dict(raw, check_paths=False)


def train_classifier(
    recipe: Recipe, positive: list[str], negative: list[str], settings: TrainSettings, out: Path
) -> dict[str, Any]:
    """Train on the documents of the sources named `positive` and `negative`; write the
    model to `out` and its card beside it (`<out stem>.json`); return the card."""
    from lemur.data.filter.classifier_train import train

    names = [s.name for s in recipe.sources]
    for n in [*positive, *negative]:
        if n not in names:
            raise RecipeError(f"recipe: no source is named '{n}' (sources: {', '.join(names)})")
    inputs = list_inputs(recipe).files
    texts: dict[str, list[str]] = {"positive": [], "negative": []}
    data: dict[str, list[dict[str, Any]]] = {"positive": [], "negative": []}
    for side, sources in (("positive", positive), ("negative", negative)):
        for name in sources:
            found, entry = source_texts(recipe, inputs, name)
            texts[side] += found
            data[side].append(entry)
    card = train(texts["positive"], texts["negative"], settings, out, data)
    atomic_write_text(card_path(out), json.dumps(card, indent=1, sort_keys=True) + "\n")
    return card


def card_path(model: Path) -> Path:
    """Where a trained model's card lies: `model.bin` -> `model.json`."""
    return model.with_suffix(".json")

"""Training a fastText quality classifier (`lemur-data classifier train`), DCLM-style: a
bigram softmax model separating positive (`__label__hq`) from negative (`__label__cc`)
documents, measured on a held-out split, written with a JSON card beside it.

Training uses fastText's own bindings. Which wheel: `fasttext` 0.9.3 is an sdist only (it
needs a compiler); `fasttext-wheel` 0.9.2 trains but its `predict` fails on numpy 2
(`np.array(..., copy=False)`); `floret` has its own module name but writes a format
fastText cannot load. `fasttext-numpy2-wheel` 0.9.2 (the `classifier` extra) is fastText
0.9.2 built for numpy 2, the distribution datatrove's `FastTextClassifierFilter` asks for;
its models are byte-identical to fasttext-wheel's and load in `fasttext-predict`, which
the build scores with. Both install the module `fasttext`: whichever pip installed last
provides it (either predicts the same), so training checks that it can train.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.atomic_files import atomic_path, scratch_path
from lemur.cli_common import UserError
from lemur.data.filter.classifier import FastTextModel, normalise
from lemur.data.recipe.classifier import LABEL_PREFIX

CARD_FORMAT = "lemur-classifier-card/1"


@dataclass(frozen=True)
class TrainSettings:
    """fastText supervised settings; defaults after DCLM's bigram classifier (dim 100,
    5 epochs, lr 0.1, minCount 1, wordNgrams 2) and fastText's (bucket 2M, softmax)."""

    dim: int = 100
    epoch: int = 5
    lr: float = 0.1
    word_ngrams: int = 2
    min_count: int = 1
    bucket: int = 2_000_000
    threads: int = 1  # one thread: the same data and seed give the same model
    seed: int = 42
    valid_fraction: float = 0.1
    positive_label: str = "hq"
    negative_label: str = "cc"
    newline: str = " "
    lowercase: bool = False

    def __post_init__(self) -> None:
        """UserError naming the `lemur-data classifier train` flag of a setting fastText
        cannot train with (it failed with "no message"), or would train backwards with."""
        for key in ("dim", "epoch", "word_ngrams", "min_count", "threads"):
            if getattr(self, key) < 1:
                raise UserError(f"{_flag(key)} must be >= 1, got {getattr(self, key)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"--lr must be a finite number > 0, got {self.lr}")
        if self.bucket < (1 if self.word_ngrams > 1 else 0):
            raise UserError(
                f"--bucket must be >= 1 for word n-grams (--word-ngrams {self.word_ngrams}), "
                f"got {self.bucket}; or --word-ngrams 1"
            )
        if not 0 <= self.valid_fraction < 1:  # a negative fraction slices from the end
            every = " (1 holds out every document)" if self.valid_fraction == 1 else ""
            raise UserError(f"--valid-fraction must be in [0, 1), got {self.valid_fraction}{every}")
        for key in ("positive_label", "negative_label"):
            name = getattr(self, key).removeprefix(LABEL_PREFIX)
            if not name:
                raise UserError(f"{_flag(key)} is empty")
            if name.split() != [name]:  # fastText splits a line at whitespace
                raise UserError(f"{_flag(key)} {name!r}: a fastText label has no spaces")
        if len(set(self.labels())) == 1:
            raise UserError(
                f"--label and --negative-label are both {self.labels()[0]!r}: the two classes "
                "need two labels"
            )

    def labels(self) -> tuple[str, str]:
        """The positive and negative labels as fastText spells them (`__label__hq`)."""
        pos, neg = (
            x.removeprefix(LABEL_PREFIX) for x in (self.positive_label, self.negative_label)
        )
        return LABEL_PREFIX + pos, LABEL_PREFIX + neg


def _flag(key: str) -> str:
    """The `lemur-data classifier train` flag of a TrainSettings field."""
    return "--label" if key == "positive_label" else "--" + key.replace("_", "-")


@dataclass(frozen=True)
class Split:
    """Normalised texts of one class, cut into training and held-out parts."""

    train: list[str]
    valid: list[str]


def split(texts: Iterable[str], settings: TrainSettings, salt: str) -> Split:
    """Normalise, drop empty, shuffle (seeded) and hold out `valid_fraction` of `texts`."""
    lines = [normalise(t, settings.newline, settings.lowercase) for t in texts]
    lines = [t for t in lines if t]
    random.Random(f"{settings.seed}:{salt}").shuffle(lines)
    n_valid = round(len(lines) * settings.valid_fraction)
    return Split(train=lines[n_valid:], valid=lines[:n_valid])


# Each training runs in a fresh interpreter: fastText 0.9.2's bindings fail a second
# training in one process with "Encountered NaN" (measured here: the first always trained,
# the next ones mostly failed, whatever the data and learning rate).
_TRAIN = """
import json, sys
try:
    import fasttext
except ImportError:
    fasttext = None
if fasttext is None or not hasattr(fasttext, "train_supervised"):
    sys.exit(3)
data, out, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    fasttext.train_supervised(input=data, **kwargs).save_model(out)
except RuntimeError as e:
    print(e, file=sys.stderr)
    sys.exit(4)
"""


def _fasttext_arguments(settings: TrainSettings) -> dict[str, Any]:
    return {
        "dim": settings.dim,
        "epoch": settings.epoch,
        "lr": settings.lr,
        "wordNgrams": settings.word_ngrams,
        "minCount": settings.min_count,
        "bucket": settings.bucket,
        "thread": settings.threads,
        "seed": settings.seed,
        "loss": "softmax",
        "verbose": 0,
    }


def fit(positive: list[str], negative: list[str], settings: TrainSettings, out: Path) -> None:
    """Train on normalised texts and write the model to `out` (atomically)."""
    pos_label, neg_label = settings.labels()
    rows = [f"{pos_label} {t}" for t in positive] + [f"{neg_label} {t}" for t in negative]
    random.Random(settings.seed).shuffle(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The training text is scratch beside the model (a `temp_name`: a killed run's is
    # recognised as such), not in /tmp, where a SIGKILL would leave it for good.
    with atomic_path(out) as part, scratch_path(out.with_name(f"{out.name}.train")) as data:
        data.write_text("".join(r + "\n" for r in rows), encoding="utf-8", errors="surrogatepass")
        args = [str(data), str(part), json.dumps(_fasttext_arguments(settings))]
        done = subprocess.run(
            [sys.executable, "-c", _TRAIN, *args], capture_output=True, text=True, check=False
        )
        if done.returncode == 3:
            raise UserError(
                "training needs fastText's training bindings: pip install 'lemur[classifier]' "
                "(if fasttext-predict, which shares the module name, was installed over them: "
                "pip install --force-reinstall --no-deps fasttext-numpy2-wheel)"
            )
        if done.returncode != 0:  # e.g. "Encountered NaN": a learning rate too high
            why = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise UserError(f"fastText training failed: {why} (try a lower --lr)")


def auc(positive: list[float], negative: list[float]) -> float:
    """Area under the ROC curve: the chance a positive outscores a negative (ties half)."""
    if not positive or not negative:
        return float("nan")
    scores = np.concatenate([np.asarray(positive), np.asarray(negative)])
    order = scores.argsort(kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    # Tied scores share the mean of their ranks.
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    ranks = (sums / counts)[inverse]
    n_pos = len(positive)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * len(negative)))


def evaluate(
    model_path: Path, positive: list[str], negative: list[str], settings: TrainSettings
) -> dict[str, Any]:
    """Precision, recall and F1 of `P(positive) >= 0.5`, and AUC, on held-out texts."""
    model = FastTextModel(str(model_path), settings.labels()[0])
    pos = [model.score(t) for t in positive]
    neg = [model.score(t) for t in negative]
    tp = sum(s >= 0.5 for s in pos)
    fp = sum(s >= 0.5 for s in neg)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / len(pos) if pos else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "valid_positive": len(pos),
        "valid_negative": len(neg),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "auc": auc(pos, neg),
    }


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def train(
    positive: list[str],
    negative: list[str],
    settings: TrainSettings,
    out: Path,
    data: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Split, train, evaluate; write the model to `out`; return its card (`data`: the
    inputs' names, hashes and counts, for the card)."""
    pos, neg = split(positive, settings, "positive"), split(negative, settings, "negative")
    for name, part in (("positive", pos), ("negative", neg)):
        if part.valid and not part.train:  # a few documents: round(n * fraction) == n
            raise UserError(
                f"--valid-fraction {settings.valid_fraction} holds out all {len(part.valid)} "
                f"{name} documents: none left to train on; lower it or give more documents"
            )
        if len(part.train) == 0:
            raise UserError(f"no {name} documents with text to train on")
    fit(pos.train, neg.train, settings, out)
    metrics = evaluate(out, pos.valid, neg.valid, settings) if pos.valid and neg.valid else {}
    pos_label, neg_label = settings.labels()
    return {
        "format": CARD_FORMAT,
        "model": out.name,
        "model_sha256": file_sha256(out),
        "labels": {"positive": pos_label, "negative": neg_label},
        "data": data,
        "documents": {
            "train_positive": len(pos.train),
            "train_negative": len(neg.train),
            "valid_positive": len(pos.valid),
            "valid_negative": len(neg.valid),
        },
        "settings": asdict(settings),
        "metrics": metrics,
        "trainer": trainer_version(),
    }


def trainer_version() -> str:
    """The installed fastText training distribution and its version."""
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("fasttext-numpy2-wheel", "fasttext-wheel", "fasttext"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"

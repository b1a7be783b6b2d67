"""fastText quality classifiers (DCLM-style) as a filter: score, cache, cut.

A document's score is the probability fastText gives the classifier's label for its text,
normalised as the model was trained on (`normalise`). The score is written into
`metadata["quality"][<name>]` and kept in a per-task cache under the work directory, keyed by
the model's fingerprint and the normalised text, so a later build with another cut reads the
scores instead of computing them again. Documents under the cut are dropped with reason
`quality:<name>`. See docs/filters.md#quality-classifiers.

Model files are checked before fastText reads them (`check_model_file`): fastText's loader
hangs or allocates without bound on a truncated file, and says nothing about which file.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import io
import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from datatrove.data import Document, DocumentsPipeline

from lemur.atomic_files import atomic_write_bytes, atomic_write_text
from lemur.cli_common import UserError
from lemur.data.filter.base import LemurFilter
from lemur.data.recipe.classifier import ClassifierConfig
from lemur.data.samples.records import Dropped

FASTTEXT_MAGIC = 793712314  # fastText's FASTTEXT_FILEFORMAT_MAGIC_INT32
FASTTEXT_VERSION = 12  # the newest format fastText 0.9 writes
SUPERVISED = 3  # fastText's model_name::sup
# magic, version; 12 int32 arguments and a double (Args::save); the dictionary's sizes.
_HEADER = struct.Struct("<ii12id")
_DICT_HEADER = struct.Struct("<iiiqq")
FINGERPRINT_BYTES = 1 << 20
EXAMPLES = 3  # documents kept per task and kind (highest and lowest, kept and dropped)
SNIPPET_CHARS = 300


class ClassifierError(UserError):
    """A model file that is missing, is not a fastText classifier, or lacks the label."""


@dataclass(frozen=True)
class ModelHeader:
    """What a fastText model file says about itself before it is loaded."""

    dim: int
    word_ngrams: int
    nwords: int
    nlabels: int
    bucket: int
    quantized: bool


def _dictionary_end(path: str | os.PathLike, entries: int, prune: int, size: int) -> int:
    """The offset after the dictionary's entries (word, NUL, int64 count, int8 type) and its
    prune index: read through a memory map, so a damaged multi-GB file costs no memory."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos = _HEADER.size + _DICT_HEADER.size
        for _ in range(entries):
            end = m.find(b"\0", pos)
            if end < 0:
                raise ValueError("truncated inside its dictionary")
            pos = end + 1 + 9
    pos += 8 * prune
    if pos >= size:
        raise ValueError("truncated inside its dictionary")
    return pos


def _matrix_at(f: io.BufferedReader, offset: int) -> tuple[int, int, int]:
    """(flag byte, rows, columns) of the matrix block at `offset`."""
    f.seek(offset)
    raw = f.read(17)
    if len(raw) < 17:
        return -1, -1, -1
    return raw[0], *struct.unpack("<qq", raw[1:])


def read_model_header(path: str | os.PathLike) -> ModelHeader:
    """Check that `path` is a whole fastText classifier file; ValueError says what is wrong."""
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        raw = f.read(_HEADER.size + _DICT_HEADER.size)
        if len(raw) < _HEADER.size + _DICT_HEADER.size:
            raise ValueError(f"too short ({size} bytes) to be a fastText model")
        magic, version, *args, _t = _HEADER.unpack_from(raw)
        if magic != FASTTEXT_MAGIC:
            raise ValueError("not a fastText model (no fastText signature)")
        if version > FASTTEXT_VERSION:
            raise ValueError(f"fastText format {version} is newer than {FASTTEXT_VERSION}")
        dim, _ws, _epoch, _min_count, _neg, word_ngrams, _loss, model, bucket = args[:9]
        if model != SUPERVISED:
            raise ValueError("a fastText word-vector model, not a classifier")
        entries, nwords, nlabels, _ntokens, prune = _DICT_HEADER.unpack_from(raw, _HEADER.size)
        if nlabels < 1 or dim < 1 or entries != nwords + nlabels:
            raise ValueError("not a fastText classifier (no labels, or a bad dictionary)")
        header = ModelHeader(dim, word_ngrams, nwords, nlabels, bucket, False)
        # A plain model ends with [0][rows, dim][input] [0][labels, dim][output]: check both
        # blocks where the file's size puts them, without reading the dictionary.
        out_at = size - (17 + 4 * nlabels * dim)
        in_at = out_at - (17 + 4 * (nwords + bucket) * dim)
        if in_at > 92 and _matrix_at(f, in_at) == (0, nwords + bucket, dim):
            if _matrix_at(f, out_at) == (0, nlabels, dim):
                return header
        # Else it is quantized (.ftz) or damaged: find the dictionary's end to tell which.
        f.seek(_dictionary_end(path, entries, prune, size))
        if f.read(1) != b"\x01":
            raise ValueError(f"truncated or damaged ({size:,} bytes; its matrices do not fit)")
        return ModelHeader(dim, word_ngrams, nwords, nlabels, bucket, True)


def model_fingerprint(path: str | os.PathLike) -> str:
    """A short digest of a model file: its size, first and last MiB (a retrained model's
    output matrix, at the end, differs), without reading a multi-GB file whole."""
    p = Path(path).expanduser()
    size = p.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(p, "rb") as f:
        h.update(f.read(FINGERPRINT_BYTES))
        f.seek(max(0, size - FINGERPRINT_BYTES))
        h.update(f.read(FINGERPRINT_BYTES))
    return h.hexdigest()[:16]


class FastTextModel:
    """A loaded fastText classifier: `score(text)` is the probability of one label."""

    def __init__(self, path: str, label: str) -> None:
        import fasttext  # fasttext-predict (or the training bindings, which predict the same)

        self.path, self.label = path, label
        self.model = fasttext.load_model(path)
        # A line of only the end-of-line token gives every label (k=-1).
        self.labels = [lab for _, lab in self.model.f.predict("\n", -1, 0.0, "strict")]
        self.predict = self.model.f.predict

    def score(self, text: str) -> float:
        """P(label | text); `text` already normalised (one line)."""
        for prob, lab in self.predict(text + "\n", -1, 0.0, "strict"):
            if lab == self.label:
                return prob
        return 0.0  # fastText leaves out labels under its threshold (0.0: never here)


@functools.lru_cache(maxsize=4)
def _load(path: str, label: str, size: int, mtime_ns: int) -> FastTextModel:
    del size, mtime_ns  # part of the cache key only: a replaced file is loaded again
    return FastTextModel(path, label)


def open_model(path: str, label: str) -> FastTextModel:
    """The classifier at `path`, checked (ClassifierError naming the file) and cached per
    process; `label` as the model spells it (`__label__hq`)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ClassifierError(f"{path}: no such model file")
    try:
        read_model_header(p)
    except (ValueError, struct.error) as e:
        raise ClassifierError(f"{path}: {e}") from None
    st = p.stat()
    try:
        model = _load(str(p), label, st.st_size, st.st_mtime_ns)
    except (ValueError, MemoryError, RuntimeError) as e:
        raise ClassifierError(f"{path}: fastText cannot load it ({e})") from None
    if label not in model.labels:
        some = ", ".join(model.labels[:10]) + (", ..." if len(model.labels) > 10 else "")
        raise ClassifierError(f"{path}: has no label '{label}' (its labels: {some})")
    return model


def normalise(text: str, newline: str = " ", lowercase: bool = False) -> str:
    """The line fastText scores: the text stripped, each `\\n` replaced by `newline` (DCLM:
    " ", datatrove's default: ""), lower-cased if asked."""
    text = text.strip().replace("\n", newline)
    return text.lower() if lowercase else text


def text_key(text: str) -> int:
    """The cache key of a normalised text."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


class ScoreCache:
    """Scores by normalised-text key, read from and written back to one `.npz` file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.scores: dict[int, float] = {}
        if path is not None and path.is_file():
            with np.load(path) as z:
                self.scores = dict(zip(z["keys"].tolist(), z["scores"].tolist(), strict=True))
        self.loaded = len(self.scores)

    def save(self) -> None:
        """Write the scores (atomically), when there is a file and something new."""
        if self.path is None or len(self.scores) == self.loaded:
            return
        keys = np.fromiter(self.scores.keys(), dtype=np.uint64, count=len(self.scores))
        scores = np.fromiter(self.scores.values(), dtype=np.float64, count=len(self.scores))
        order = np.argsort(keys)
        buf = io.BytesIO()
        np.savez(buf, keys=keys[order], scores=scores[order])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, buf.getvalue())


class Scorer:
    """Scores normalised texts of one classifier, from a cache first."""

    def __init__(self, config: ClassifierConfig, cache: ScoreCache) -> None:
        self.config, self.cache = config, cache
        self.model: FastTextModel | None = None
        self.scored = self.cached = 0

    def __call__(self, text: str) -> float:
        """The score of a document's raw text."""
        c = self.config
        line = normalise(text, c.newline, c.lowercase)
        key = text_key(line)
        score = self.cache.scores.get(key)
        if score is not None:
            self.cached += 1
            return score
        if self.model is None:  # not loaded when every score is cached
            self.model = open_model(c.model, c.fasttext_label)
        score = self.model.score(line)
        self.cache.scores[key] = score
        self.scored += 1
        return score


@dataclass
class TaskSummary:
    """What a task's classifier did: counts and the extreme documents kept and dropped."""

    kept: int = 0
    dropped: int = 0
    examples: dict[str, list] = field(
        default_factory=lambda: {
            k: [] for k in ("kept_high", "kept_low", "dropped_high", "dropped_low")
        }
    )

    def add(self, doc: Document, score: float, keep: bool) -> None:
        """Count a judged document; keep it as an example if it is among the extremes."""
        kind = "kept" if keep else "dropped"
        setattr(self, kind, getattr(self, kind) + 1)
        item = (score, doc.id, doc.text[:SNIPPET_CHARS])
        for suffix, sign in (("high", 1), ("low", -1)):
            heap = self.examples[f"{kind}_{suffix}"]
            entry = (sign * score, item)
            if len(heap) < EXAMPLES:
                heapq.heappush(heap, entry)
            elif entry > heap[0]:
                heapq.heapreplace(heap, entry)

    def to_json(self, scorer: Scorer) -> dict[str, Any]:
        """The summary as written to `<rank>.json`."""
        return {
            "scored": scorer.scored,
            "cached": scorer.cached,
            "kept": self.kept,
            "dropped": self.dropped,
            "examples": {
                k: [{"score": s, "id": i, "text": t} for _, (s, i, t) in sorted(v, reverse=True)]
                for k, v in self.examples.items()
            },
        }


class ClassifierFilter(LemurFilter):
    """Scores the documents of some sources with a fastText classifier and keeps those at or
    above the cut: `min_score`, or per source the `keep_top` threshold found for it."""

    name = "🤖 quality classifier"

    def __init__(
        self,
        config: ClassifierConfig,
        sources: list[str],
        cuts: dict[str, float],
        cache_dir: str,
        summary_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.config, self.sources = config, frozenset(sources)
        self.cuts = dict(cuts)  # per source; empty with min_score or no rule
        self.cache_dir, self.summary_dir = cache_dir, summary_dir
        self._scorer: Scorer | None = None
        self._summary = TaskSummary()

    @property
    def rejects_slug(self) -> str:
        """The folder of this classifier's dropped documents under the recipe's `rejects`."""
        return f"classifier-{self.config.name}"

    def cut(self, source: str) -> float | None:
        """The lowest score kept for documents of `source` (None: keep all)."""
        if self.config.keep_top is not None:
            return self.cuts[source]
        return self.config.min_score

    def scorer(self) -> Scorer:
        """This task's scorer (a run() sets one up per task; alone, a cache-less one)."""
        if self._scorer is None:
            self._scorer = Scorer(self.config, ScoreCache(None))
        return self._scorer

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        """Score a document of our sources into `metadata.quality`; drop it under the cut."""
        source = doc.metadata.get("source")
        if source not in self.sources:
            return True
        score = self.scorer()(doc.text)
        quality = doc.metadata.get("quality")
        if not isinstance(quality, dict):
            quality = doc.metadata["quality"] = {}
        quality[self.config.name] = score
        cut = self.cut(source)
        keep = cut is None or score >= cut
        self._summary.add(doc, score, keep)
        if self.samples is not None:
            self.samples.score(self.config.name, doc, score, cut)
        if keep:
            return True
        return Dropped(f"quality:{self.config.name}", "quality score", score, "<", cut)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Filter a task's documents with its score cache; save the cache and a summary."""
        cache = ScoreCache(Path(self.cache_dir) / f"scores-{rank:05d}.npz")
        self._scorer, self._summary = Scorer(self.config, cache), TaskSummary()
        yield from super().run(data, rank, world_size)
        cache.save()
        if self.summary_dir is not None:
            summary = json.dumps(self._summary.to_json(self._scorer), sort_keys=True)
            atomic_write_text(Path(self.summary_dir) / f"{rank:05d}.json", summary)

"""Benchmark decontamination: drop documents that share a word n-gram with a benchmark.

Words are runs of letters, digits and `_` of the lowercased text (numbers are not
normalized); an n-gram is `ngram` consecutive words (12 by default, as in datatrove and
the GPT-3 paper's 13-gram overlap study). Benchmark n-grams with fewer than 4 distinct
informative words (two or more characters, not a numeral or a number word) are left out of
the index: `0 0 0 ...`, `0 1 2 ... 9 a b` or `'one': 1, 'two': 2, ...` say nothing about a
benchmark and occur in ordinary code (the last two matched the stdlib and libstdc++).

Each benchmark gets two sorted little-endian uint64 files under `<output>/.work/decontam/`:
- `<name>.index.hashes`: xxh64 of the n-gram's words joined by one space. This is
  datatrove's `NGramsDecontIndexer` layout and hash, so its `NGramsDecontFilter` reads the
  same index (given our word splitter and no number/punctuation/diacritics normalization);
- `<name>.fast.hashes`: our vectorized n-gram hash (`ngrams.text_ngrams`). A document is
  hashed with numpy in a few passes and looked up in a bit table then with `searchsorted`;
  only the hits are confirmed against the datatrove hash, so decisions are datatrove's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash
from datatrove.data import Document

from lemur.data import work as work_folders
from lemur.data.filter.base import LemurFilter
from lemur.data.filter.benchmarks import benchmark_texts
from lemur.data.filter.ngrams import Ngrams, text_ngrams
from lemur.data.recipe.filters import BenchmarkConfig, DecontaminateConfig
from lemur.data.samples.records import Dropped
from lemur.shards.format import atomic_write_bytes, open_array

INDEX_SUFFIX = ".index.hashes"
FAST_SUFFIX = ".fast.hashes"
MIN_DISTINCT_WORDS = 4
# Counting sequences (`0 1 2 ... 9 a b`, `'one': 1, 'two': 2, ...`) are shared by benchmarks
# and ordinary code alike: such words do not count toward an n-gram's distinct words.
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million billion first second third fourth fifth".split()
)
_DTYPE = np.dtype("<u8")


def informative(word: str) -> bool:
    """A word that can tell a benchmark apart: not one character, a numeral or a number word."""
    return len(word) > 1 and not word.isdigit() and word not in NUMBER_WORDS


def distinct_counts(words: list[str], n: int) -> np.ndarray:
    """Distinct informative words in each window of `n` words, vectorized.

    A word counts in the window starting at i when its previous occurrence is before i.
    """
    ids = np.unique(np.asarray(words, dtype=object), return_inverse=True)[1].astype(np.int64)
    useful = np.fromiter(map(informative, words), bool, len(words))
    order = np.argsort(ids, kind="stable")
    prev = np.full(len(ids), -1, np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    starts = np.arange(len(ids) - n + 1)
    counts = np.zeros(len(starts), np.int64)
    for k in range(n):
        counts += (prev[starts + k] < starts) & useful[starts + k]
    return counts


def exact_hashes(ngrams: Ngrams, positions: np.ndarray, n: int) -> np.ndarray:
    """datatrove's hash (xxh64 of the words joined by a space) of the n-grams at `positions`."""
    return np.fromiter(
        (xxhash.xxh64_intdigest(ngrams.text(i, n)) for i in positions.tolist()),
        np.uint64,
        len(positions),
    )


def text_keys(text: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(datatrove hashes, fast hashes) of a benchmark text's n-grams with enough distinct words."""
    ngrams = text_ngrams(text, n)
    if len(ngrams.hashes) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    words = ngrams.span(0, len(ngrams.data)).split()
    keep = np.flatnonzero(distinct_counts(words, n) >= MIN_DISTINCT_WORDS)
    return exact_hashes(ngrams, keep, n), ngrams.hashes[keep]


def build_index(bench: BenchmarkConfig, n: int, directory: Path) -> int:
    """Write a benchmark's two hash files (sorted, unique, deterministic); return n-grams."""
    exact, fast = [np.zeros(0, np.uint64)], [np.zeros(0, np.uint64)]
    for _, text in benchmark_texts(bench):
        e, f = text_keys(text, n)
        exact.append(e)
        fast.append(f)
    exact_all = np.unique(np.concatenate(exact)).astype(_DTYPE)
    atomic_write_bytes(directory / f"{bench.name}{INDEX_SUFFIX}", exact_all.tobytes())
    atomic_write_bytes(
        directory / f"{bench.name}{FAST_SUFFIX}",
        np.unique(np.concatenate(fast)).astype(_DTYPE).tobytes(),
    )
    return len(exact_all)


def build_indexes(config: DecontaminateConfig, directory: Path) -> dict[str, int]:
    """Index every benchmark of the recipe under `directory`; n-grams per benchmark."""
    return {b.name: build_index(b, config.ngram, directory) for b in config.benchmarks}


def load_hashes(path: Path) -> np.ndarray:
    """A hash file as a read-only memory map (an empty array for an empty file)."""
    return open_array(path, _DTYPE)


def contains(index: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Membership of `keys` in a sorted `index` (binary search; no copy of the index)."""
    if len(index) == 0 or len(keys) == 0:
        return np.zeros(len(keys), bool)
    pos = np.minimum(np.searchsorted(index, keys), len(index) - 1)
    return index[pos] == keys


class BenchmarkIndex:
    """One benchmark's hash files, with a bit table on the fast hashes' top bits.

    The table answers "surely not in the index" for almost every n-gram of a clean document
    with one gather, so binary search runs only on the few that pass.
    """

    def __init__(self, directory: Path, name: str) -> None:
        self.name = name
        self.fast = load_hashes(directory / f"{name}{FAST_SUFFIX}")
        self.exact = load_hashes(directory / f"{name}{INDEX_SUFFIX}")
        bits = int(np.clip(np.ceil(np.log2(16 * max(len(self.fast), 1))), 16, 24))
        self.shift = np.uint64(64 - bits)
        self.table = np.zeros(1 << bits, bool)
        self.table[np.asarray(self.fast) >> self.shift] = True

    def candidates(self, hashes: np.ndarray) -> np.ndarray:
        """Positions of the n-grams whose fast hash is in the index."""
        maybe = np.flatnonzero(self.table[hashes >> self.shift])
        return maybe[contains(self.fast, hashes[maybe])]


class DecontaminationFilter(LemurFilter):
    """Drops documents sharing n-grams with a benchmark (reason `contaminated:<benchmark>`).

    The dropped document's metadata names the benchmark and the first matched n-gram
    (`contaminated_task`, `contaminated_ngram`, as datatrove's filter writes them).
    """

    name = "🧪 decontaminate"

    def __init__(
        self,
        directory: str,
        names: list[str],
        ngram: int,
        min_matches: int,
        benchmarks: tuple[BenchmarkConfig, ...] = (),
    ) -> None:
        super().__init__()
        self.directory, self.names = directory, list(names)
        self.benchmarks = {b.name: b for b in benchmarks}  # to name a hit's task (samples)
        self.ngram, self.min_matches = ngram, min_matches
        self._indexes: list[BenchmarkIndex] | None = None

    def indexes(self) -> list[BenchmarkIndex]:
        """The benchmarks' indexes, mapped on first use in each task."""
        if self._indexes is None:
            self._indexes = [BenchmarkIndex(Path(self.directory), n) for n in self.names]
        return self._indexes

    def match(self, text: str) -> tuple[str, str] | None:
        """(benchmark, first matched n-gram) of the first benchmark matched, else None."""
        n = self.ngram
        ngrams = text_ngrams(text, n)
        if len(ngrams.hashes) == 0:
            return None
        for index in self.indexes():
            found = self._confirm(ngrams, index, index.candidates(ngrams.hashes))
            if found is not None:
                return index.name, found
        return None

    def _confirm(self, ngrams: Ngrams, index: BenchmarkIndex, candidates: np.ndarray) -> str | None:
        """The first matched n-gram once `min_matches` distinct ones are confirmed, else None.

        Candidates are true matches but for 64-bit collisions, so this stops after a few.
        """
        seen: set[int] = set()
        first = None
        for i in candidates.tolist():
            text = ngrams.text(i, self.ngram)
            key = np.uint64(xxhash.xxh64_intdigest(text))
            if contains(index.exact, np.array([key]))[0]:
                first = first or text
                seen.add(int(key))
                if len(seen) >= self.min_matches:
                    return first
        return None

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        """Keep a document unless it matches a benchmark."""
        found = self.match(doc.text)
        if found is None:
            return True
        doc.metadata["contaminated_task"], doc.metadata["contaminated_ngram"] = found
        bench, ngram = found
        if self.samples is not None:
            self.samples.hit(doc, bench, ngram, lambda: self.task_of(bench, ngram))
        return Dropped(f"contaminated:{bench}", f"{self.ngram}-gram", ngram, "in", bench)

    def task_of(self, name: str, ngram: str) -> str | None:
        """The id of the benchmark task holding a matched n-gram (None: not known). Asked
        only for the hits a sample keeps: it reads the benchmark again."""
        bench = self.benchmarks.get(name)
        if bench is None:
            return None
        key = np.uint64(xxhash.xxh64_intdigest(ngram))
        for task, text in benchmark_texts(bench):
            if key in text_keys(text, self.ngram)[0]:
                return task
        return None


def decontamination_filter(config: DecontaminateConfig, work: Path) -> DecontaminationFilter:
    """Build the recipe's benchmark indexes under `work/decontam` and a filter reading them."""
    directory = work_folders.decontam(work)
    build_indexes(config, directory)
    names = [b.name for b in config.benchmarks]
    return DecontaminationFilter(
        str(directory), names, config.ngram, config.min_matches, tuple(config.benchmarks)
    )

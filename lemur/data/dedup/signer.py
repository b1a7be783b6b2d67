"""Dedup signatures: a normalized content hash and a MinHash over word n-grams per document."""

from __future__ import annotations

import re
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import xxhash
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.atomic_files import atomic_open, scratch_path
from lemur.data.dedup.runs import GOLDEN64, write_runs
from lemur.data.dedup.sketch import bottom_k
from lemur.data.recipe.recipe import DedupConfig
from lemur.shards.format import open_array

_WORD = re.compile(r"\w+")
# Every ASCII character `\w` does not match, to a space (`words_of`'s fast path).
_NOT_WORD = str.maketrans({c: " " for c in map(chr, range(128)) if not (c.isalnum() or c == "_")})


_BLOCK = 4096  # shingles per block when computing MinHash (bounds memory per document)


def normalized_hash(text: str) -> int:
    """uint64 hash of a text with line endings, trailing spaces and outer blank lines normalized."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    norm = "\n".join(line.rstrip() for line in lines).strip("\n")
    return xxhash.xxh3_64_intdigest(norm)


def words_of(text: str) -> list[str]:
    """The `\\w+` words of a text, in order."""
    if text.isascii():
        # The same words at about half the regex's cost: in ASCII, `\w` is [A-Za-z0-9_], so
        # every other character becomes a space and `split` cuts there.
        return text.translate(_NOT_WORD).split()
    return _WORD.findall(text)


def shingles(text: str, n: int) -> np.ndarray:
    """Unique uint64 hashes of the word n-grams of a lowercased text (one n-gram if shorter)."""
    words = words_of(text.lower())
    if not words:
        return np.zeros(0, np.uint64)
    # Each word hashed where it stands (`map` keeps the loop in C): cheaper than hashing the
    # distinct words once and indexing, at the same values.
    h = np.fromiter(map(xxhash.xxh3_64_intdigest, words), np.uint64, len(words))
    return np.unique(combine_ngrams(h, min(n, len(h))))


def combine_ngrams(word_hash: np.ndarray, n: int) -> np.ndarray:
    """A uint64 hash per run of `n` consecutive word hashes (polynomial, overflow wraps).

    Vectorized (`n` numpy passes); shared by dedup shingles and benchmark decontamination.
    """
    if len(word_hash) < n:
        return np.zeros(0, np.uint64)
    m = len(word_hash) - n + 1
    out = word_hash[:m].copy()
    with np.errstate(over="ignore"):
        for j in range(1, n):  # in place: the same values as out = out * M + h[j:], no copies
            np.multiply(out, GOLDEN64, out=out)
            np.add(out, word_hash[j : m + j], out=out)
    return out


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-permutation (xor key, odd multiplier) for multiply-shift hashing."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, num_perm, dtype=np.uint64) * np.uint64(2)
    mults = rng.integers(0, 2**63, num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return keys, mults


def minhash(shingle_hashes: np.ndarray, keys: np.ndarray, mults: np.ndarray) -> np.ndarray:
    """MinHash signature (uint32 per permutation): min over shingles of ((x ^ k) * m) >> 32."""
    # `>> 32` is monotone, so the min of the shifted values is the shifted min: the shift
    # and the cast to uint32 run once per permutation, not once per shingle and permutation.
    low = np.full(len(keys), np.iinfo(np.uint64).max, np.uint64)
    with np.errstate(over="ignore"):
        for start in range(0, len(shingle_hashes), _BLOCK):
            h = np.bitwise_xor(shingle_hashes[start : start + _BLOCK, None], keys[None, :])
            np.multiply(h, mults[None, :], out=h)
            np.minimum(low, h.min(axis=0), out=low)
    return (low >> np.uint64(32)).astype(np.uint32)


class DedupSigner(PipelineStep):
    """Writes each document's content hash, MinHash signature and bucket keys for this task.

    Sits right before the tokenize step, so its rows line up one to one with the task's
    token records. Output per task, each file appearing atomically when the task's documents
    are exhausted: `{rank}.chash.bin` (uint64 per document), `{rank}.minhash.bin`
    (uint32 x `num_perm` per document), `{rank}.sketch.bin` + `.sketch.end` (each
    document's bottom-k sketch, uint32, and where it ends) and, per channel (exact hash,
    each band), a sorted run `runs/{rank}.{channel}.run` of (bucket key, local index).
    """

    name = "🫆 dedup signatures"
    type = "🫂 - DEDUP"

    def __init__(self, config: DedupConfig, out_dir: str, domains: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.config = config
        self.out_dir = out_dir
        # Domain ids mixed into the bucket keys (documents of two domains never match);
        # empty: every document is of domain 0.
        self.domains = {d: i for i, d in enumerate(domains)}

    def _domain(self, doc) -> int:
        return self.domains[doc.metadata["domain"]] if self.domains else 0

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Sign each document and pass it on; the task's files appear when it ends.

        Rows are appended to temporary files as documents stream by, so a task's memory
        does not grow with its number of documents until the runs are sorted at the end
        (one channel at a time, 28 bytes per document of the task).
        """
        keys, mults = permutations(self.config.num_perm, self.config.seed)
        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        names = ["chash.bin", "minhash.bin", "sketch.bin", "sketch.end"]
        with ExitStack() as stack:
            # The four files are renamed into place only after the runs are written from
            # them; the domains are scratch, removed however the task ends (after a SIGKILL,
            # by the resume's `remove_stale_temporaries`: its name is a `temp_name`).
            fh = [stack.enter_context(atomic_open(out / f"{rank:05d}.{n}")) for n in names]
            domains = stack.enter_context(scratch_path(out / f"{rank:05d}.domain"))
            dom = stack.enter_context(open(domains, "w+b"))
            end = 0
            for doc in data or []:
                with self.track_time():
                    fh[0].write(np.uint64(normalized_hash(doc.text)).tobytes())
                    dom.write(np.uint16(self._domain(doc)).tobytes())
                    if self.config.near:
                        sh = shingles(doc.text, self.config.ngram)
                        fh[1].write(minhash(sh, keys, mults).tobytes())
                        if self.config.sketch_size:
                            sketch = bottom_k(sh, self.config.sketch_size)
                            end += len(sketch)
                            fh[2].write(sketch.tobytes())
                            fh[3].write(np.uint64(end).tobytes())
                yield doc
            with self.track_time():
                for f in (*fh, dom):
                    f.flush()
                chash = open_array(fh[0].name, np.uint64)
                sig = open_array(fh[1].name, np.uint32, (self.config.num_perm,))
                write_runs(out, rank, chash, sig, open_array(dom.name, np.uint16), self.config)
                del chash, sig

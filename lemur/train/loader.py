"""The trainer's Grain loader over shard directories: the train stream (shuffled,
host-sharded, mixed windows with a resumable state) and the eval streams (every val window
of each domain once, padded so that all hosts step together).

See docs/loader.md for the semantics of shuffling, sharding, state and mixtures.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from lemur.shards.check import (
    ShardCompatibilityError,
    ShardDir,
    check_compatible,
)
from lemur.shards.format import FORMAT
from lemur.shards.windows import BATCH_KEYS, DEFAULT_RELEASE_BYTES, ShardSource

# Version of the iterator state layout; bump when `get_state()` changes shape.
STATE_VERSION = 1


class LoaderStateMismatch(ValueError):
    """A saved loader state that comes from another data pipeline."""


@dataclasses.dataclass(frozen=True)
class Reading:
    """How the train stream reads (never what): threads and worker processes reading ahead,
    and how many mapped bytes may stay resident (docs/loader.md)."""

    num_workers: int = 0  # > 0: read in that many processes (Grain's mp_prefetch)
    num_threads: int = 1  # threads of this process reading ahead
    prefetch: int = 8  # batches read ahead
    release_bytes: int = DEFAULT_RELEASE_BYTES  # drop the touched pages past this many


@dataclasses.dataclass(frozen=True)
class ExpectedTokenizer:
    """The tokenizer the shards must have been built with: every directory is checked with
    `check_compatible` against its vocab size and, given, its sha256."""

    vocab_size: int
    sha256: str | None = None


def derived_seed(*parts: int | str) -> int:
    """A 32-bit seed hashed from several parts."""
    # Grain seeds epoch e with seed + e, so user seeds s and s + 1 would share
    # permutations one epoch apart if we passed them through: hash them instead.
    data = json.dumps([str(p) for p in parts]).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:4], "little")


def process_index_and_count(
    process_index: int | None, process_count: int | None
) -> tuple[int, int]:
    if process_index is None or process_count is None:
        import jax  # only when asked to discover the processes: importing jax is slow

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    return process_index, process_count


def _mark_absl_flags_parsed() -> None:
    # Grain's process prefetch reads absl flags, which fails outside `absl.app.run`
    # (google/grain#1355, unfixed in 0.2.18).
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


Directory = str | os.PathLike | ShardDir  # a path, or a directory already opened


def _normalize_sources(
    dirs_and_weights: list[tuple[Directory, float]] | Directory,
) -> list[tuple[str | ShardDir, float]]:
    """(directory, weight) pairs, checked; an open `ShardDir` is kept, a path made a str."""
    if isinstance(dirs_and_weights, str | os.PathLike | ShardDir):
        dirs_and_weights = [(dirs_and_weights, 1.0)]
    pairs = [(d if isinstance(d, ShardDir) else str(d), float(w)) for d, w in dirs_and_weights]
    if not pairs:
        raise ValueError("no shard directories given")
    for d, w in pairs:
        if not w > 0:
            raise ValueError(f"{d}: mixture weight must be positive, got {w}")
    return pairs


@dataclasses.dataclass(frozen=True)
class PipelineIdentity:
    """What the train stream's fingerprint hashes: each source's contents, weight and window
    count, the seed and seq_len."""

    sources: tuple[ShardSource, ...]
    weights: tuple[float, ...]
    seq_len: int
    seed: int

    def fingerprint(self, content_ids: Sequence[str] | None = None) -> str:
        """The pipeline's identity in the iterator state; given, `content_ids` stand for the
        sources' own (the identity an older lemur gave the same data)."""
        ids = [s.content_id for s in self.sources] if content_ids is None else content_ids
        sources = [[c, w, len(s)] for c, w, s in zip(ids, self.weights, self.sources, strict=True)]
        data = {"format": FORMAT, "seq_len": self.seq_len, "seed": self.seed, "sources": sources}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class TrainIterator(grain.DatasetIterator):
    """Batches of the training stream; `get_state()` is the same on every process.

    The state is the number of records the whole job has consumed plus a fingerprint
    of the pipeline (the directories' contents, weights, seed, seq_len). It restores into a fresh
    iterator with any process count and per-host batch size (Grain's `ElasticIterator`
    slices the stream from that global position). A state from another pipeline is
    refused unless the iterator was made with `strict_state=False`.
    """

    def __init__(
        self, pipeline: grain.IterDataset, identity: PipelineIdentity, *, strict_state: bool
    ) -> None:
        super().__init__()  # linked to its pipeline once that is made (`_iterator`)
        # Made on first use, as before a state restores into it; a Grain iterator with worker
        # processes leaks shared memory when closed before its first batch.
        self._pipeline = pipeline
        self._inner: grain.DatasetIterator | None = None
        self.identity = identity
        self.fingerprint = identity.fingerprint()  # saved in the state
        self.strict_state = strict_state

    def _iterator(self) -> grain.DatasetIterator:
        """The pipeline's iterator, made on first use."""
        if self._inner is None:
            self._inner = iter(self._pipeline)
            super().__init__(self._inner)  # Grain's parent link: its context, its close()
        return self._inner

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._iterator())

    def get_state(self) -> dict[str, Any]:
        """JSON-able state: `{"version", "global_next_index", "fingerprint"}`."""
        state = self._iterator().get_state()
        return {
            "version": STATE_VERSION,
            "global_next_index": int(state["global_next_index"]),
            "fingerprint": self.fingerprint,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state saved by any process of a job with the same pipeline."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')} != {STATE_VERSION}")
        if self.strict_state and state.get("fingerprint") != self.fingerprint:
            raise LoaderStateMismatch(
                "loader state comes from another pipeline (directories, weights, seed or "
                "seq_len differ); pass strict_state=False to continue from its position anyway"
            )
        self._iterator().set_state({"global_next_index": int(state["global_next_index"])})


def _open_checked(
    pairs: list[tuple[str | ShardDir, float]], seq_len: int, expect: ExpectedTokenizer | None
) -> list[tuple[ShardDir, float]]:
    """Each directory opened once (its checks and its source share one manifest read)
    and, given `expect`, checked with `check_compatible`."""
    opened = []
    for d, w in pairs:
        d = ShardDir.of(d)
        if expect is not None:
            check_compatible(
                d, vocab_size=expect.vocab_size, tokenizer_sha256=expect.sha256, seq_len=seq_len
            )
        opened.append((d, w))
    return opened


def _open_sources(
    pairs: list[tuple[ShardDir, float]],
    seq_len: int,
    release_bytes: int,
    vocab_size: int | None,
) -> list[ShardSource]:
    """One `ShardSource` per directory; refuse sources too large to shuffle or a mixture
    of tokenizers."""
    sources = [
        ShardSource(d, seq_len, release_bytes=release_bytes, vocab_size=vocab_size)
        for d, _ in pairs
    ]
    for src in sources:
        if len(src) >= 2**32:  # Grain's index shuffle works on 32-bit indices
            raise ValueError(f"{src!r}: {len(src)} windows, more than a shuffle can permute")
    sha = {s.tokenizer.get("sha256") for s in sources}
    if len(sha) > 1:
        raise ShardCompatibilityError(
            "mixture of shard directories built with different tokenizers: "
            + ", ".join(f"{s.directory} ({str(s.tokenizer.get('sha256'))[:12]})" for s in sources)
        )
    return sources


def _shuffled_mix(sources: list[ShardSource], weights: list[float], seed: int) -> grain.MapDataset:
    """Each source shuffled anew each epoch and repeated, mixed by weight."""
    parts = [
        grain.MapDataset.source(src)
        # Shuffle before repeat: a new lazy global permutation every epoch.
        .shuffle(seed=derived_seed(seed, i, src.content_id))
        .repeat(None)
        for i, src in enumerate(sources)
    ]
    return parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, weights)


def make_train_iterator(
    dirs_and_weights: list[tuple[Directory, float]] | Directory,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
    expect: ExpectedTokenizer | None = None,
    strict_state: bool = True,
    reading: Reading = Reading(),
) -> TrainIterator:
    """An endless iterator of per-host batches from one directory or a weighted mixture.

    Each directory's train windows are shuffled with a seed derived from `seed`, anew
    each epoch, and repeated forever; several directories are interleaved in
    proportion to their weights (`grain.MapDataset.mix`). The global stream is cut
    into global batches of `batch_size * process_count` records; process `p` takes
    records `p, p + process_count, ...` of each. Batches are dicts of int32
    [batch_size, seq_len] arrays (`BATCH_KEYS`), read as `reading` says. Given `expect`,
    each directory is checked with `check_compatible` first (and every window for ids
    outside its vocabulary). A directory given as an open `ShardDir` is not read again.
    """
    pairs = _normalize_sources(dirs_and_weights)
    pid, pcount = process_index_and_count(process_index, process_count)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    opened = _open_checked(pairs, seq_len, expect)
    vocab_size = None if expect is None else expect.vocab_size
    sources = _open_sources(opened, seq_len, reading.release_bytes, vocab_size)
    weights = [w for _, w in pairs]
    mp_options = None
    if reading.num_workers > 0:
        _mark_absl_flags_parsed()
        mp_options = grain.MultiprocessingOptions(
            num_workers=reading.num_workers, per_worker_buffer_size=max(1, reading.prefetch)
        )
    read_options = grain.ReadOptions(
        num_threads=reading.num_threads, prefetch_buffer_size=reading.prefetch
    )

    pipeline = grain.experimental.ElasticIterator(
        _shuffled_mix(sources, weights, seed),
        global_batch_size=batch_size * pcount,
        shard_options=grain.sharding.ShardOptions(shard_index=pid, shard_count=pcount),
        read_options=read_options,
        multiprocessing_options=mp_options,
    )
    identity = PipelineIdentity(tuple(sources), tuple(weights), seq_len, seed)
    return TrainIterator(pipeline, identity, strict_state=strict_state)


# ---------------------------------------------------------------------------- eval


class _PaddedEvalSource(grain.sources.RandomAccessDataSource):
    """This host's windows of an eval source (`index * count + host`), then padding."""

    def __init__(self, source: ShardSource, host: int, count: int, length: int) -> None:
        self.source, self.host, self.count, self.length = source, host, count, length

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"_PaddedEvalSource({self.source!r}, host={self.host}/{self.count})"

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        window = index * self.count + self.host
        if window < len(self.source):
            return self.source[window]
        # Padding rows: segment 0 and no loss, so they change no metric.
        zeros = np.zeros(self.source.seq_len, np.int32)
        return dict.fromkeys(BATCH_KEYS, zeros)


class EvalStream:
    """One domain's val windows in order, as fixed-shape batches; iterable many times.

    Every process yields the same number of batches (padded with `loss_mask == 0`,
    `segment_ids == 0` rows), so SPMD eval steps stay in lockstep.
    """

    def __init__(
        self,
        source: ShardSource,
        batch_size: int,
        process_index: int,
        process_count: int,
        max_batches: int | None,
    ) -> None:
        self.source = source
        self.batch_size = batch_size
        per_host = -(-len(source) // process_count)
        n = -(-per_host // batch_size)
        self.num_batches = n if max_batches is None else min(n, max_batches)
        self._padded = _PaddedEvalSource(
            source, process_index, process_count, self.num_batches * batch_size
        )

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        ds = grain.MapDataset.source(self._padded).batch(self.batch_size)
        return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def make_eval_iterators(
    directory: str | os.PathLike | ShardDir,
    *,
    seq_len: int,
    batch_size: int,
    max_batches: int | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
    vocab_size: int | None = None,
) -> dict[str, EvalStream]:
    """One `EvalStream` per val domain of a shard directory, each read once in order.

    Process `p` of `n` (JAX's by default) reads windows `p, p + n, ...`, so together the
    hosts read every window once. `max_batches` keeps the first batches of each domain.
    Given `vocab_size`, every window is checked for ids outside the vocabulary.
    """
    pid, pcount = process_index_and_count(process_index, process_count)
    shard_dir = ShardDir.of(directory)
    return {
        d: EvalStream(
            ShardSource(shard_dir, seq_len, split="val", domain=d, vocab_size=vocab_size),
            batch_size,
            pid,
            pcount,
            max_batches,
        )
        for d in shard_dir.domains("val")
    }

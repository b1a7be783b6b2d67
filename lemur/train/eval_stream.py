"""Eval streams: every val window of each domain once, padded so that all hosts step together."""

from __future__ import annotations

import os
from collections.abc import Iterator

import grain
import numpy as np

from lemur.shards.check import ShardDir
from lemur.shards.windows import BATCH_KEYS, ShardSource
from lemur.train.train_stream import process_index_and_count


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

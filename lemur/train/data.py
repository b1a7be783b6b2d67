"""Grain loader over lemur shard directories: windows, shuffling, host sharding, mixtures.

A record is one training window of a shard's packed token stream: `seq_len + 1` tokens
starting at `k * seq_len` (stride `seq_len`), giving `inputs = w[:-1]` and
`targets = w[1:]`, with `segment_ids`, `positions` and `loss_mask` derived from the
shard's document index. Windows never cross a shard boundary; the tail of each shard
that does not fill a window is dropped and counted (`ShardSource.dropped_tokens`).
See docs/loader.md for the semantics of shuffling, sharding, state and mixtures.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import mmap
import operator
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grain
import numpy as np

from lemur.process_guard import guard_if_child
from lemur.shards.check import (
    ShardCompatibilityError,
    check_compatible,
    check_structure,
    shards_of,
    token_error,
)
from lemur.shards.format import FORMAT, ShardFormatError, read_manifest

# Keys of every record and batch, all int32 of shape [seq_len] ([batch, seq_len] batched).
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")
# Version of the iterator state layout; bump when `get_state()` changes shape.
STATE_VERSION = 1
# Bytes of mapped pages a source may make resident before it drops them (see `_release`).
DEFAULT_RELEASE_BYTES = 128 << 20
# One page fault maps more than the page: 64 KiB of fault-around, or a whole page-cache
# folio of up to 2 MiB on kernels with large folios (measured here: 1.1 MiB resident per
# random 8 KiB window read). Budget each read for the worst case.
_FAULT_BYTES = 2 << 20


class LoaderStateMismatch(ValueError):
    """A saved loader state that comes from another data pipeline."""


_LOOP_MAX_DOCS = 24  # below this many documents a window, slice assignment beats vectorizing


@functools.cache
def _constants(seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only `ones` and `arange` of length seq_len, shared by windows within one document."""
    ones, arange = np.ones(seq_len, np.int32), np.arange(seq_len, dtype=np.int32)
    ones.flags.writeable = arange.flags.writeable = False
    return ones, arange


def window_record(tokens: np.ndarray, ends: np.ndarray, start: int, seq_len: int
                  ) -> dict[str, np.ndarray]:
    """The record for the window `tokens[start : start + seq_len + 1]` of one shard.

    `ends` are the shard's exclusive document end offsets (int64). `segment_ids` number
    the documents of the window from 1; `positions` count from 0 at each document start
    and at the window start (a document continued from the previous window restarts
    at 0: the model cannot attend across windows, and RoPE only sees differences);
    `loss_mask` is 0 where the target is the first token of another document. Arrays
    may be shared and read-only (batching copies them).
    """
    L = seq_len
    ones, arange = _constants(L)
    w = tokens[start : start + L + 1].astype(np.int32)
    # Documents starting inside (start, start + L], relative to the window: 1..L.
    j0, j1 = ends.searchsorted((start, start + L), side="right")
    if j0 == j1:  # the whole window lies inside one document (long files, typical for code)
        segment_ids, positions, loss_mask = ones, arange, ones
    else:
        rel = ends[j0:j1] - start
        loss_mask = ones.copy()
        loss_mask[rel - 1] = 0  # input i predicts token i + 1, the next document's <s>
        inner = rel[: -1] if rel[-1] == L else rel  # a start at L only affects the mask
        if inner.size < _LOOP_MAX_DOCS:
            segment_ids, positions = np.empty(L, np.int32), np.empty(L, np.int32)
            a = 0
            for k, b in enumerate([*inner.tolist(), L], start=1):
                segment_ids[a:b] = k
                positions[a:b] = arange[: b - a]
                a = b
        else:
            seg = np.zeros(L, np.int32)
            seg[inner] = 1
            np.cumsum(seg, out=seg)
            doc_starts = np.concatenate(([0], inner)).astype(np.int32)
            positions = arange - doc_starts[seg]
            segment_ids = seg + 1
    return {
        "inputs": w[:-1],
        "targets": w[1:],
        "segment_ids": segment_ids,
        "positions": positions,
        "loss_mask": loss_mask,
    }


def _map_file(path: Path, dtype: np.dtype) -> tuple[mmap.mmap | None, np.ndarray]:
    """Memory-map a whole file read-only as a zero-copy array (and keep the mmap for madvise)."""
    if path.stat().st_size == 0:
        return None, np.zeros(0, dtype)  # mmap refuses empty files
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return mm, np.frombuffer(mm, dtype)


class ShardSource(grain.sources.RandomAccessDataSource):
    """Random access to the `seq_len + 1` token windows of one split of a shard directory.

    Memory maps open lazily on first access in each process and are never pickled, so
    a source travels to Grain worker processes as a few hundred bytes. Once reads may
    have made `release_bytes` of mapped pages resident (each window counts its bytes plus
    the kernel's fault-around), the touched mappings drop their pages (`MADV_DONTNEED`:
    the page cache keeps them, this process's RSS does not), so RSS stays flat over a
    pass (cf. nanoGPT#287).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        seq_len: int,
        *,
        split: str = "train",
        domain: str | None = None,
        release_bytes: int = DEFAULT_RELEASE_BYTES,
        vocab_size: int | None = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.directory = str(Path(directory).resolve())
        self.seq_len = int(seq_len)
        # Given, every window read is checked: an id >= vocab_size raises naming the shard.
        self.vocab_size = vocab_size
        self.split = split
        self.domain = domain
        self.release_bytes = int(release_bytes)
        manifest = read_manifest(self.directory)
        # Keep only what reading needs: the source is pickled to every worker process.
        self.tokenizer: dict[str, Any] = dict(manifest["tokenizer"])
        self.shards = shards_of(manifest, split, domain)
        what = f"{split} shards" + (f" of domain {domain!r}" if domain else "")
        manifest_path = Path(self.directory) / "manifest.json"
        if not self.shards:
            raise ShardFormatError(f"{manifest_path}: no {what}")
        check_structure(self.directory, self.shards, manifest)
        self.dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
        # Upper bound of the pages one window read maps: the window rounded out to whole
        # folios on both ends, plus one folio of the index.
        window_bytes = (self.seq_len + 1) * self.dtype.itemsize
        self._resident_per_record = window_bytes + 3 * _FAULT_BYTES
        windows = [max(0, (int(s["tokens"]) - 1) // self.seq_len) for s in self.shards]
        # First global window index of each shard, and the total at the end.
        self._offsets = [0]
        for n in windows:
            self._offsets.append(self._offsets[-1] + n)
        self.tokens = sum(int(s["tokens"]) for s in self.shards)
        # Identity of the data, not of its path: the shuffle seed and the state fingerprint
        # use it, so a job resumes the same order after the directory moves or is copied.
        self.content_id = hashlib.sha256(json.dumps(
            [[s["file"], s["tokens"], s["documents"], s.get("sha256")] for s in self.shards]
        ).encode()).hexdigest()[:16]
        # Tokens never used as an input: each shard's tail shorter than a window, plus the
        # last window's final target (a shard of T tokens yields (T - 1) // seq_len windows).
        self.dropped_tokens = self.tokens - self._offsets[-1] * self.seq_len
        if self._offsets[-1] == 0:
            raise ShardFormatError(
                f"{manifest_path}: no {what} holds a window of seq_len + 1 = "
                f"{self.seq_len + 1} tokens"
            )
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._open: dict[int, tuple[np.ndarray, np.ndarray, list[mmap.mmap]]] = {}
        self._touched: set[int] = set()
        self._since_release = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Drop the mappings: pickling an array over a mapping would copy the whole shard.
        state = self.__dict__.copy()
        for key in ("_open", "_touched", "_since_release", "_lock"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled in a Grain worker: tie the worker to the trainer's life (a SIGKILLed
        # trainer must not leave loader processes behind).
        guard_if_child()
        self.__dict__.update(state)
        self._init_process_state()

    def __len__(self) -> int:
        return self._offsets[-1]

    def __repr__(self) -> str:
        # Stable across processes and runs (Grain compares reprs on restore).
        domain = f", domain={self.domain!r}" if self.domain else ""
        return (
            f"ShardSource({self.directory!r}, seq_len={self.seq_len}, split={self.split!r}"
            f"{domain}, windows={len(self)})"
        )

    def _shard(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if (entry := self._open.get(i)) is None:
            with self._lock:  # two reader threads must not both map the same shard
                if (entry := self._open.get(i)) is None:
                    shard, base = self.shards[i], Path(self.directory)
                    tmm, tokens = _map_file(base / shard["file"], self.dtype)
                    # int64 view of the uint64 offsets, so searchsorted never promotes
                    # (uint64 vs int keys would compare as float64 on a converted copy).
                    imm, ends = _map_file(base / shard["index"], np.dtype("<i8"))
                    entry = (tokens, ends, [m for m in (tmm, imm) if m is not None])
                    self._open[i] = entry
        return entry[0], entry[1]

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number in `shards`, first token offset) of window `index`."""
        index = operator.index(index)
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range for {self!r}")
        i = bisect.bisect_right(self._offsets, index) - 1
        return i, (index - self._offsets[i]) * self.seq_len

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """The record of window `index` (see `window_record`)."""
        i, start = self.locate(index)
        tokens, ends = self._shard(i)
        record = window_record(tokens, ends, start, self.seq_len)
        if self.vocab_size is not None:
            self._check_ids(i, start, record)
        self._touched.add(i)
        self._since_release += self._resident_per_record
        if self._since_release >= self.release_bytes:
            self._release()
        return record

    def _check_ids(self, i: int, start: int, record: dict[str, np.ndarray]) -> None:
        """Raise naming the shard if the window holds an id outside the vocabulary."""
        inputs, last = record["inputs"], int(record["targets"][-1])
        # int32 records: a uint32 id >= 2**31 reads as negative.
        if int(inputs.max()) < self.vocab_size and 0 <= last < self.vocab_size and (
                int(inputs.min()) >= 0):
            return
        window = np.concatenate((inputs, [last])).astype(np.int64) % (1 << 32)
        j = int(np.argmax(window >= self.vocab_size))
        path = Path(self.directory) / self.shards[i]["file"]
        raise ShardFormatError(token_error(path, start + j, int(window[j]), self.vocab_size))

    def _release(self) -> None:
        """Drop the resident pages of every mapping touched since the last release."""
        # Swap first, so reader threads keep adding to a fresh set while we madvise.
        touched, self._touched, self._since_release = self._touched, set(), 0
        for i in tuple(touched):  # a thread that read the old set may still add to it
            for m in self._open.get(i, ((), (), ()))[2]:
                # Safe while other threads read: a read-only file mapping refaults from
                # the page cache; only this process's resident set shrinks.
                m.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Forget the mappings (they unmap once no array refers to them)."""
        self._init_process_state()


def _derived_seed(*parts: int | str) -> int:
    """A 32-bit seed hashed from several parts."""
    # Grain seeds epoch e with seed + e, so user seeds s and s + 1 would share
    # permutations one epoch apart if we passed them through: hash them instead.
    data = json.dumps([str(p) for p in parts]).encode()
    return int.from_bytes(hashlib.sha256(data).digest()[:4], "little")


def _process_index_and_count(process_index: int | None, process_count: int | None
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


def _normalize_sources(dirs_and_weights: list[tuple[str, float]] | str
                       ) -> list[tuple[str, float]]:
    if isinstance(dirs_and_weights, str | os.PathLike):
        return [(str(dirs_and_weights), 1.0)]
    pairs = [(str(d), float(w)) for d, w in dirs_and_weights]
    if not pairs:
        raise ValueError("no shard directories given")
    for d, w in pairs:
        if not w > 0:
            raise ValueError(f"{d}: mixture weight must be positive, got {w}")
    return pairs


class TrainIterator(grain.DatasetIterator):
    """Batches of the training stream; `get_state()` is the same on every process.

    The state is the number of records the whole job has consumed plus a fingerprint
    of the pipeline (the directories' contents, weights, seed, seq_len). It restores into a fresh
    iterator with any process count and per-host batch size (Grain's `ElasticIterator`
    slices the stream from that global position). A state from another pipeline is
    refused unless the iterator was made with `strict_state=False`.
    """

    def __init__(self, inner: grain.DatasetIterator, fingerprint: str, strict_state: bool,
                 sources: list[ShardSource]) -> None:
        super().__init__(inner)
        self._inner = inner
        self.fingerprint = fingerprint
        self.strict_state = strict_state
        self.sources = sources

    def __next__(self) -> dict[str, np.ndarray]:
        return next(self._inner)

    def get_state(self) -> dict[str, Any]:
        """JSON-able state: `{"version", "global_next_index", "fingerprint"}`."""
        state = self._inner.get_state()
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
        self._inner.set_state({"global_next_index": int(state["global_next_index"])})


def make_train_iterator(
    dirs_and_weights: list[tuple[str, float]] | str,
    *,
    seq_len: int,
    batch_size: int,
    seed: int,
    process_index: int | None = None,
    process_count: int | None = None,
    num_workers: int = 0,
    num_threads: int = 1,
    prefetch: int = 8,
    vocab_size: int | None = None,
    tokenizer_sha256: str | None = None,
    strict_state: bool = True,
    release_bytes: int = DEFAULT_RELEASE_BYTES,
) -> TrainIterator:
    """An endless iterator of per-host batches from one directory or a weighted mixture.

    Each directory's train windows are shuffled with a seed derived from `seed`, anew
    each epoch, and repeated forever; several directories are interleaved in
    proportion to their weights (`grain.MapDataset.mix`). The global stream is cut
    into global batches of `batch_size * process_count` records; process `p` takes
    records `p, p + process_count, ...` of each. Batches are dicts of int32
    [batch_size, seq_len] arrays (`BATCH_KEYS`). `num_workers > 0` reads in that many
    processes; `num_threads`/`prefetch` read ahead in threads of this process. Given
    `vocab_size`, each directory is checked with `check_compatible` first.
    """
    pairs = _normalize_sources(dirs_and_weights)
    pid, pcount = _process_index_and_count(process_index, process_count)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if vocab_size is not None:
        for d, _ in pairs:
            check_compatible(d, vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256,
                             seq_len=seq_len)
    sources = [ShardSource(d, seq_len, release_bytes=release_bytes, vocab_size=vocab_size)
               for d, _ in pairs]
    for src in sources:
        if len(src) >= 2**32:  # Grain's index shuffle works on 32-bit indices
            raise ValueError(f"{src!r}: {len(src)} windows, more than a shuffle can permute")
    sha = {s.tokenizer.get("sha256") for s in sources}
    if len(sha) > 1:
        raise ShardCompatibilityError(
            "mixture of shard directories built with different tokenizers: "
            + ", ".join(f"{s.directory} ({str(s.tokenizer.get('sha256'))[:12]})"
                        for s in sources)
        )
    parts = [
        grain.MapDataset.source(src)
        # Shuffle before repeat: a new lazy global permutation every epoch.
        .shuffle(seed=_derived_seed(seed, i, src.content_id))
        .repeat(None)
        for i, src in enumerate(sources)
    ]
    ds = parts[0] if len(parts) == 1 else grain.MapDataset.mix(parts, [w for _, w in pairs])
    mp_options = None
    if num_workers > 0:
        _mark_absl_flags_parsed()
        mp_options = grain.MultiprocessingOptions(num_workers=num_workers,
                                                  per_worker_buffer_size=max(1, prefetch))
    elastic = grain.experimental.ElasticIterator(
        ds,
        global_batch_size=batch_size * pcount,
        shard_options=grain.sharding.ShardOptions(shard_index=pid, shard_count=pcount),
        read_options=grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=prefetch),
        multiprocessing_options=mp_options,
    )
    fingerprint = hashlib.sha256(
        json.dumps(
            {"format": FORMAT, "seq_len": seq_len, "seed": seed,
             "sources": [[s.content_id, w, len(s)]
                         for s, (_, w) in zip(sources, pairs, strict=True)]},
            sort_keys=True,
        ).encode()
    ).hexdigest()[:16]
    return TrainIterator(iter(elastic), fingerprint, strict_state, sources)


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

    def __init__(self, source: ShardSource, batch_size: int, process_index: int,
                 process_count: int, max_batches: int | None) -> None:
        self.source = source
        self.batch_size = batch_size
        per_host = -(-len(source) // process_count)
        n = -(-per_host // batch_size)
        self.num_batches = n if max_batches is None else min(n, max_batches)
        self._padded = _PaddedEvalSource(source, process_index, process_count,
                                         self.num_batches * batch_size)

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        ds = grain.MapDataset.source(self._padded).batch(self.batch_size)
        return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)))


def make_eval_iterators(
    directory: str | os.PathLike,
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
    pid, pcount = _process_index_and_count(process_index, process_count)
    manifest = read_manifest(directory)
    domains = sorted({s["domain"] for s in shards_of(manifest, "val", None)})
    return {
        d: EvalStream(ShardSource(directory, seq_len, split="val", domain=d,
                                  vocab_size=vocab_size), batch_size, pid, pcount, max_batches)
        for d in domains
    }

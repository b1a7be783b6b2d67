"""Windows over one shard directory: `window_record` and the random-access `ShardSource`.

Shared by the trainer's loader (lemur.train.loader) and `lemur-eval bpb` (lemur.eval.bpb),
so it lives with the shard format, below both.

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
import re
import threading
from pathlib import Path
from typing import Any

import grain
import numpy as np

from lemur.process_guard import guard_if_child
from lemur.shards.check import ShardDir, token_error
from lemur.shards.format import MASK_DTYPE, ShardFormatError

# Keys of every record and batch, all int32 of shape [seq_len] ([batch, seq_len] batched).
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "loss_mask")


class NoWindowError(ShardFormatError):
    """A split (or a domain of it) none of whose shards holds one `seq_len + 1` window;
    `longest`: the most tokens one of its shards holds, for the caller's remedy."""

    def __init__(self, message: str, longest: int) -> None:
        super().__init__(message)
        self.longest = longest


# Bytes of mapped pages a source may make resident before it drops them (see `_release`).
DEFAULT_RELEASE_BYTES = 128 << 20


# One page fault maps more than the page: 64 KiB of fault-around, or a whole page-cache
# folio of up to 2 MiB on kernels with large folios (measured here: 1.1 MiB resident per
# random 8 KiB window read). Budget each read for the worst case.
_FAULT_BYTES = 2 << 20


# One opened shard: tokens, document ends, loss mask (None without), the mappings under them.
_Mapped = tuple[np.ndarray, np.ndarray, np.ndarray | None, list[mmap.mmap]]


_LOOP_MAX_DOCS = 24  # below this many documents a window, slice assignment beats vectorizing


@functools.cache
def _constants(seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only `ones` and `arange` of length seq_len, shared by windows within one document."""
    ones, arange = np.ones(seq_len, np.int32), np.arange(seq_len, dtype=np.int32)
    ones.flags.writeable = arange.flags.writeable = False
    return ones, arange


def window_record(
    tokens: np.ndarray,
    ends: np.ndarray,
    start: int,
    seq_len: int,
    mask: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The record for the window `tokens[start : start + seq_len + 1]` of one shard.

    `ends` are the shard's exclusive document end offsets (int64). `segment_ids` number
    the documents of the window from 1; `positions` count from 0 at each document start
    and at the window start (a document continued from the previous window restarts
    at 0: the model cannot attend across windows, and RoPE only sees differences);
    `loss_mask` is 0 where the target is the first token of another document, and,
    given the shard's loss `mask` (a chat build's, one 0/1 per token), 0 where the
    target's mask is 0. Arrays may be shared and read-only (batching copies them).
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
        # Input i predicts token i + 1, the next document's first token: its <s>, or
        # without BOS (Qwen2.5) its first text token, which nothing of its document precedes.
        loss_mask[rel - 1] = 0
        inner = rel[:-1] if rel[-1] == L else rel  # a start at L only affects the mask
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
    if mask is not None:
        # Input i predicts token start + i + 1: its loss counts where that target's does.
        loss_mask = loss_mask * mask[start + 1 : start + L + 1]
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


# The folder of one build (`build-<id>/`, the id hashing the inputs' paths and stat): a
# rebuild of the same shards gets another, so it is no part of the data's identity.
_BUILD_FOLDER = re.compile(r"^build-[0-9a-f]+/")


def _content_id(shards: list[dict[str, Any]]) -> str:
    """Identity of the data, not of its path: the shuffle seed and the state fingerprint
    use it, so a job resumes the same order after the directory moves, is copied, or is
    rebuilt into the same shards."""
    # A loss mask is part of the data; listed only when present, so the ids of directories
    # without masks (and so their shuffles) are what they were.
    # `identity`: the lemur shard name another trainer's file stands for (lemur.export.foreign).
    listing = [
        [
            _BUILD_FOLDER.sub("", s.get("identity", s["file"])),
            s["tokens"],
            s["documents"],
            s.get("sha256"),
        ]
        + ([s.get("mask_sha256")] if "mask" in s else [])
        for s in shards
    ]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


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
        directory: str | os.PathLike | ShardDir,
        seq_len: int,
        *,
        split: str = "train",
        domain: str | None = None,
        release_bytes: int = DEFAULT_RELEASE_BYTES,
        vocab_size: int | None = None,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        shard_dir = ShardDir.of(directory)  # an open ShardDir: no manifest read here
        self.directory = str(shard_dir.path.resolve())
        self.seq_len = int(seq_len)
        # Given, every window read is checked: an id >= vocab_size raises naming the shard.
        self.vocab_size = vocab_size
        self.split = split
        self.domain = domain
        self.release_bytes = int(release_bytes)
        # Keep only what reading needs: the source is pickled to every worker process.
        self.tokenizer: dict[str, Any] = dict(shard_dir.tokenizer)
        self.shards = shard_dir.shards(split, domain)
        what = f"{split} shards" + (f" of domain {domain!r}" if domain else "")
        manifest_path = Path(self.directory) / "manifest.json"
        if not self.shards:
            raise ShardFormatError(f"{manifest_path}: no {what}")
        shard_dir.check_structure(self.shards)
        self.index_reader = shard_dir.index_reader
        self.dtype = np.dtype(shard_dir.manifest["dtype"]).newbyteorder("<")
        # Upper bound of the pages one window read maps: the window rounded out to whole
        # folios on both ends, plus one folio of the index.
        window_bytes = (self.seq_len + 1) * self.dtype.itemsize
        self._resident_per_record = window_bytes + 3 * _FAULT_BYTES
        if any("mask" in s for s in self.shards):  # and the window of the loss mask
            self._resident_per_record += self.seq_len + 1 + 2 * _FAULT_BYTES
        windows = [max(0, (int(s["tokens"]) - 1) // self.seq_len) for s in self.shards]
        # First global window index of each shard, and the total at the end.
        self._offsets = [0]
        for n in windows:
            self._offsets.append(self._offsets[-1] + n)
        self.tokens = sum(int(s["tokens"]) for s in self.shards)
        self.content_id = _content_id(self.shards)
        # Tokens never used as an input: each shard's tail shorter than a window, plus the
        # last window's final target (a shard of T tokens yields (T - 1) // seq_len windows).
        self.dropped_tokens = self.tokens - self._offsets[-1] * self.seq_len
        if self._offsets[-1] == 0:
            longest = max(int(s["tokens"]) for s in self.shards)
            raise NoWindowError(
                f"{manifest_path}: no {what} holds a window of seq_len + 1 = "
                f"{self.seq_len + 1} tokens (the longest holds {longest:,})",
                longest,
            )
        self._init_process_state()

    def _init_process_state(self) -> None:
        self._open: dict[int, _Mapped] = {}
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

    def _shard(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        if (entry := self._open.get(i)) is None:
            with self._lock:  # two reader threads must not both map the same shard
                if (entry := self._open.get(i)) is None:
                    shard, base = self.shards[i], Path(self.directory)
                    tmm, tokens = _map_file(base / shard["file"], self.dtype)
                    # int64 view of the uint64 offsets, so searchsorted never promotes
                    # (uint64 vs int keys would compare as float64 on a converted copy).
                    imm, ends = (
                        _map_file(base / shard["index"], np.dtype("<i8"))
                        if self.index_reader is None
                        else (None, self.index_reader(base / shard["index"]))
                    )
                    # Mapped like the tokens (not format.open_mask's memmap): its pages are
                    # released with theirs.
                    mmm, mask = (
                        _map_file(base / shard["mask"], MASK_DTYPE)
                        if "mask" in shard
                        else (None, None)
                    )
                    maps = [m for m in (tmm, imm, mmm) if m is not None]
                    entry = (tokens, ends, mask, maps)
                    self._open[i] = entry
        return entry[0], entry[1], entry[2]

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
        tokens, ends, mask = self._shard(i)
        record = window_record(tokens, ends, start, self.seq_len, mask)
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
        if (
            int(inputs.max()) < self.vocab_size
            and 0 <= last < self.vocab_size
            and (int(inputs.min()) >= 0)
        ):
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
            for m in self._open.get(i, ((), (), None, ()))[3]:
                # Safe while other threads read: a read-only file mapping refaults from
                # the page cache; only this process's resident set shrinks.
                m.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Forget the mappings (they unmap once no array refers to them)."""
        self._init_process_state()

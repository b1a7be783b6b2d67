"""Random reads of rows of flat files with `pread`, for the dedup tasks' scattered lookups.

Not a memory map: on a fault the kernel maps up to 16 cached pages around the one read
(fault-around, which `MADV_RANDOM` does not turn off), and where the page cache holds large
folios (measured on Linux 6.18, ext4) a whole folio of up to a few MiB, so reading a few
thousand random signatures through a map made ~250 MiB resident at once on a 1M-document
corpus, and the merge rounds over 64 sorted runs of 16M documents mapped most of them (169
MiB of file pages for 6 MiB read). `pread` brings in only what it returns, and sorted,
coalesced reads keep it to one call per run of consecutive rows.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import numpy as np


def raise_open_files_limit(needed: int) -> None:
    """Raise this process's soft limit of open files towards `needed` (up to the hard limit).

    A bucket task keeps a descriptor per tokenize task and file kind: 1,024 tasks need
    thousands, while many systems start processes with a soft limit of 1,024.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        top = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, top), hard))


class RowFile:
    """The rows of a flat array file (after `offset` header bytes), read on demand."""

    def __init__(self, path: str | Path, dtype, offset: int = 0) -> None:
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.offset = offset
        self.fd = os.open(self.path, os.O_RDONLY)
        self.rows = (os.fstat(self.fd).st_size - offset) // self.dtype.itemsize

    @classmethod
    def npy(cls, path: str | Path) -> RowFile:
        """The rows of a `.npy` file (np.save format, one-dimensional)."""
        with open(path, "rb") as f:
            fmt = np.lib.format
            major, _ = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            _, _, dtype = read(f)
            return cls(path, dtype, f.tell())

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: np.ndarray | slice) -> np.ndarray:
        """Rows at `index` (any order, repeats allowed) or in a slice, as a new array."""
        if isinstance(index, slice):
            start, stop, step = index.indices(self.rows)
            if step != 1:
                raise ValueError(f"{self.path}: only contiguous slices are read")
            return self.read_ranges(np.array([start]), np.array([max(0, stop - start)]))
        index = np.asarray(index, np.int64)
        uniq, inverse = np.unique(index, return_inverse=True)
        return self.read_ranges(uniq, np.ones(len(uniq), np.int64))[inverse]

    def read_ranges(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The rows of every range [start, start + length), concatenated in the given order."""
        size = self.dtype.itemsize
        out = bytearray(int(lengths.sum()) * size)
        pos = 0
        for s, n in self._coalesce(np.asarray(starts, np.int64), np.asarray(lengths, np.int64)):
            data = os.pread(self.fd, n * size, self.offset + s * size)
            out[pos : pos + len(data)] = data
            pos += n * size
        return np.frombuffer(out, self.dtype)

    @staticmethod
    def _coalesce(starts: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
        """Adjacent ranges joined, so consecutive rows cost one read."""
        keep = lengths > 0
        starts, lengths = starts[keep], lengths[keep]
        if not len(starts):
            return []
        joined = np.concatenate(([False], starts[1:] == starts[:-1] + lengths[:-1]))
        head = np.flatnonzero(~joined)
        total = np.add.reduceat(lengths, head)
        return list(zip(starts[head].tolist(), total.tolist(), strict=True))

    def __getstate__(self) -> dict:
        return {"path": self.path, "dtype": self.dtype, "offset": self.offset}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["dtype"], state["offset"])

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)
        if fd is not None:
            os.close(fd)

"""Sorted runs: per tokenize task and per channel (a MinHash band, or the exact content hash),
the task's (bucket key, local document index) pairs sorted by key, as flat files.

The bucket tasks merge the runs of all tasks (merge.py); equal keys are candidate pairs.
Keys mix in the document's domain, so documents of different domains never share a bucket.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.dedup.rows import RowFile
from lemur.data.recipe.recipe import DedupConfig
from lemur.shards.format import release_pages

# 2^64 / golden ratio: the odd multiplier of every multiplicative hash mix in the build.
GOLDEN64 = np.uint64(0x9E3779B97F4A7C15)
RUN = np.dtype([("key", "<u8"), ("local", "<u4")])  # one entry of a sorted run (12 bytes)
EXACT = -1  # the channel of exact (content hash) duplicates; bands are 0..bands-1
RUNS_DIR = "runs"
_CHUNK = 65536  # documents per block when computing keys from the signature file


def channel_name(channel: int) -> str:
    """File-name part of a channel: `exact` or `b007`."""
    return "exact" if channel == EXACT else f"b{channel:03d}"


def channels(config: DedupConfig) -> list[int]:
    """The channels a config dedups over: exact first, then the bands."""
    return ([EXACT] if config.exact else []) + (list(range(config.bands)) if config.near else [])


def run_path(tok_dir: Path, rank: int, channel: int) -> Path:
    """Where tokenize task `rank` writes its sorted run of `channel`."""
    return Path(tok_dir) / RUNS_DIR / f"{rank:05d}.{channel_name(channel)}.run"


def open_run(tok_dir: Path, rank: int, channel: int) -> RowFile:
    """One sorted run, read by `pread` in slices (not mapped: see rows.py)."""
    return RowFile(run_path(tok_dir, rank, channel), RUN)


def band_keys(block: np.ndarray, dom: np.ndarray) -> np.ndarray:
    """Bucket key of one band: a hash of its `rows` MinHash values (n x rows) and the domain."""
    with np.errstate(over="ignore"):
        h = dom.astype(np.uint64) * GOLDEN64 + np.uint64(1)
        for c in range(block.shape[1]):
            h = (h ^ block[:, c].astype(np.uint64)) * GOLDEN64 + np.uint64(c + 1)
    return h


def exact_keys(chash: np.ndarray, dom: np.ndarray) -> np.ndarray:
    """Bucket key of the exact channel: the content hash with the domain mixed in."""
    with np.errstate(over="ignore"):
        return chash ^ (dom.astype(np.uint64) * GOLDEN64 + np.uint64(0x632BE59BD9B4E019))


def channel_keys(
    channel: int, chash: np.ndarray, sig: np.ndarray, dom: np.ndarray, rows: int
) -> np.ndarray:
    """Keys of every document of a task in one channel, computed block by block."""
    n = len(chash)
    keys = np.empty(n, np.uint64)
    for s in range(0, n, _CHUNK):
        e = min(n, s + _CHUNK)
        if channel == EXACT:
            keys[s:e] = exact_keys(np.asarray(chash[s:e]), np.asarray(dom[s:e]))
        else:
            block = np.asarray(sig[s:e, channel * rows : (channel + 1) * rows])
            keys[s:e] = band_keys(block, np.asarray(dom[s:e]))
        release_pages(sig)
    return keys


def write_runs(
    tok_dir: Path,
    rank: int,
    chash: np.ndarray,
    sig: np.ndarray,
    dom: np.ndarray,
    config: DedupConfig,
) -> None:
    """Write every channel's sorted run of one task (each file appears atomically).

    Holds one channel's keys at a time: 28 bytes per document of this task (keys, sort
    order, run entries), never the whole corpus.
    """
    out = Path(tok_dir) / RUNS_DIR
    out.mkdir(parents=True, exist_ok=True)
    for channel in channels(config):
        keys = channel_keys(channel, chash, sig, dom, config.rows)
        order = np.argsort(keys, kind="stable")  # equal keys stay in local order
        run = np.empty(len(keys), RUN)
        run["key"] = keys[order]
        run["local"] = order
        with atomic_open(run_path(tok_dir, rank, channel)) as fh:
            fh.write(run.data)

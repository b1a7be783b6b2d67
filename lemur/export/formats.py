"""The contract between `lemur-data export`'s driver and each format's module.

The driver walks a finished shard folder (its manifest), hands every shard to the format as a
`ShardPart` (train shards in their global shuffled order, then each val domain apart) and
collects what it wrote under a temporary folder it renames when complete. A format module
defines one `Exporter` and is named in `FORMAT_MODULES`; formats are imported only when asked
for, so that one format's optional reader library never weighs on another.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

# Format name -> the module that defines its `EXPORTER`.
FORMAT_MODULES = {
    "megatron": "lemur.export.megatron",
    "nanotron": "lemur.export.nanotron",
    "olmo": "lemur.export.olmo",
    "litdata": "lemur.export.litdata",
    "mds": "lemur.export.mds",
    "parquet": "lemur.export.parquet",
}


class ExportError(ValueError):
    """A corpus a format cannot hold, or an output folder that cannot be written (one line)."""


@dataclass(frozen=True)
class ShardPart:
    """One lemur shard to write: where its arrays are and where its output goes."""

    split: str  # "train" or "val"
    domain: str | None  # the val domain ("code", "text"); None for train
    number: int  # the shard's position in its split (or val domain), from 0
    tokens: Path  # the shard's `.bin`
    index: Path  # its `.idx` (uint64 exclusive document ends)
    mask: Path | None  # its `.mask` (uint8 per token) in a chat build, else None
    token_dtype: np.dtype  # the `.bin`'s dtype (uint16 or uint32)
    stem: str  # output path relative to OUT, without extension: "train/00000", "val/code/00000"


@dataclass(frozen=True)
class ExportInfo:
    """What a launch fragment and a format's checks need to know of the whole corpus."""

    source: Path  # the lemur shard folder
    out: Path  # the final output folder (not the temporary one)
    manifest_sha256: str
    token_dtype: np.dtype
    vocab_size: int
    eos_id: int | None
    bos_id: int | None
    has_masks: bool  # a chat build (loss masks)
    seq_len: int | None  # the sequence length the corpus was packed for, if recorded
    tokenizer_dir: Path  # OUT/tokenizer: an HF tokenizer folder every trainer loads
    train_stems: tuple[str, ...]
    val_stems: dict[str, tuple[str, ...]]  # val domain -> stems


class Exporter(Protocol):
    """One output format: checks, per-shard writing, a final step, the launch fragment."""

    name: str
    carries_masks: bool  # whether a chat build's loss masks can travel in this format

    def check(self, info: ExportInfo) -> None:
        """Raise ExportError (one line) when the corpus cannot be held by this format."""

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Write one shard under `out` (the temporary folder); return the files written."""

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """Write what spans shards (an index.json, ...) once every part is written."""

    def launch_fragment(self, info: ExportInfo) -> str:
        """Markdown for OUT/TRAINING.md: exactly what to paste into that trainer's config."""


def exporter(name: str) -> Exporter:
    """The `Exporter` of a format name (ExportError naming the known ones otherwise)."""
    if name not in FORMAT_MODULES:
        known = ", ".join(FORMAT_MODULES)
        raise ExportError(f"unknown export format {name!r}: known formats are {known}")
    return importlib.import_module(FORMAT_MODULES[name]).EXPORTER

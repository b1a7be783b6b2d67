"""MosaicML streaming MDS for LLM Foundry: one sample per document, shards capped in size.

The bytes are MDSWriter's (streaming/base/format/mds/{writer,encodings}.py): a shard is
`uint32 N`, `uint32[N+1]` absolute sample offsets, the writer's config as sorted-key JSON,
then the samples; a sample is one `uint32` size per variable-size column, then each
column's bytes, columns in sorted name order. The token column is named `tokens`, the name
LLM Foundry's pretraining loader reads (`StreamingTextDataset` in llmfoundry/data/
text_data.py takes `sample['tokens']`, an ndarray of any integer type; a sample without
`text` or `tokens` is refused), as `ndarray:uint16|uint32`; a chat build adds `loss_mask`,
`ndarray:uint8`. Both have a static dtype and a dynamic shape, stored as one
byte `(ndim << 2) | shape dtype code`, the length in the smallest unsigned int that holds
it, then the values. Shards are closed by MDSWriter's `size_limit` rule, so a lemur shard's
MDS shards are byte for byte what MDSWriter writes for its documents.

Each lemur shard gets a subfolder (`train/00000/shard.00000.mds`, ...) and one `index.json`
(version 2, no compression, no hashes) per dataset folder lists every shard by its path
relative to it, as streaming's `merge_index` lists the shards of several writers.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lemur.atomic_files import atomic_open, atomic_write_text
from lemur.export.files import document_ends, document_lengths
from lemur.export.formats import ExportError, ExportInfo, ShardPart
from lemur.export.rechunk import (
    UINT32_LIMIT,
    by_folder,
    capped_groups,
    dataset_folder,
    part_arrays,
)
from lemur.shards.format import release_pages

# streaming's NDArray encoding: shape dtype -> its code in the (ndim << 2) | code byte.
SHAPE_CODES = {1: 0, 2: 1, 4: 2, 8: 3}
SHAPE_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}


def shape_bytes(lengths: np.ndarray) -> np.ndarray:
    """Bytes of the smallest unsigned int holding each length, as NDArray stores a shape."""
    lengths = np.asarray(lengths, np.int64)
    return np.select([lengths < 1 << 8, lengths < 1 << 16, lengths < 1 << 32], [1, 2, 4], 8)


@dataclass(frozen=True)
class MdsExporter:
    """Writes MDS shards of at most `size_limit` bytes (MDSWriter's default, 64 MiB)."""

    size_limit: int = 1 << 26
    name: ClassVar[str] = "mds"
    carries_masks: ClassVar[bool] = True

    def check(self, info: ExportInfo) -> None:
        """Refuse a token dtype MDS's NDArray encoding cannot name, and a bad size limit."""
        if np.dtype(info.token_dtype).name not in ("uint16", "uint32"):
            raise ExportError(f"{info.source}: token dtype {info.token_dtype} is not uint16/32")
        if not 0 < self.size_limit < UINT32_LIMIT:
            raise ExportError(f"MDS size_limit {self.size_limit} is not in (0, 2**32)")

    def shard_config(self, info: ExportInfo) -> dict[str, Any]:
        """MDSWriter's `get_config()`: stored in every shard and in each index entry."""
        columns = {"tokens": f"ndarray:{np.dtype(info.token_dtype).name}"}
        if info.has_masks:
            columns["loss_mask"] = "ndarray:uint8"
        names = sorted(columns)  # MDSWriter's order: loss_mask (if any) before tokens
        encodings = [columns[n] for n in names]
        return {
            "version": 2,
            "format": "mds",
            "compression": None,
            "hashes": [],
            "size_limit": self.size_limit,
            "column_names": names,
            "column_encodings": encodings,
            "column_sizes": [None] * len(names),
        }

    def sample_sizes(self, lengths: np.ndarray, info: ExportInfo) -> np.ndarray:
        """Encoded bytes of each document's sample (size heads and columns)."""
        column = 4 + 1 + shape_bytes(lengths)  # its uint32 size, the shape byte, the shape
        sizes = column + lengths * np.dtype(info.token_dtype).itemsize
        if info.has_masks:
            sizes = sizes + column + lengths
        return sizes

    def groups(self, part: ShardPart, info: ExportInfo) -> tuple[list[tuple[int, int]], int]:
        """The documents `[a, b)` of each MDS shard of a part, and the config's byte length."""
        lengths = document_lengths(document_ends(part))
        config = len(json.dumps(self.shard_config(info), sort_keys=True).encode())
        # MDSWriter: extra_bytes_per_shard = 4 + 4 + config, and 4 per sample (its offset)
        groups = capped_groups(self.sample_sizes(lengths, info) + 4, 8 + config, self.size_limit)
        return groups, config

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Write one lemur shard as MDS shards under `out/<folder>/<NNNNN>/`; their paths."""
        tokens, ends, mask = part_arrays(part)
        config = json.dumps(self.shard_config(info), sort_keys=True).encode()
        lengths = document_lengths(ends)
        starts = ends - lengths
        sizes = self.sample_sizes(lengths, info)
        written = []
        for j, (a, b) in enumerate(self.groups(part, info)[0]):
            head = 4 * (b - a + 2) + len(config)
            offsets = np.zeros(b - a + 1, np.int64)
            np.cumsum(sizes[a:b], out=offsets[1:])
            if head + int(offsets[-1]) >= UINT32_LIMIT:
                raise ExportError(f"{part.tokens}: document {a} is too long for an MDS shard")
            buf = bytearray(head + int(offsets[-1]))
            buf[: head - len(config)] = np.append(b - a, offsets + head).astype("<u4").tobytes()
            buf[head - len(config) : head] = config
            fill_samples(buf, head, tokens, mask, starts[a:b], lengths[a:b])
            path = out / self.shard_path(part, j)
            # the folder is renamed whole by the driver once complete: no fsync per shard
            with atomic_open(path, durable=False) as fh:
                fh.write(buf)
            release_pages(tokens)
            written.append(path)
        return written

    def shard_path(self, part: ShardPart, j: int) -> str:
        """A part's j-th MDS shard, relative to OUT."""
        return f"{part.stem}/shard.{j:05d}.mds"

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """One `index.json` (version 2) per dataset folder, every shard in order."""
        written = []
        for folder, members in by_folder(parts).items():
            shards = [e for part in members for e in self.index_entries(part, info, out)]
            path = out / folder / "index.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"shards": shards, "version": 2}, sort_keys=True))
            written.append(path)
        return written

    def index_entries(self, part: ShardPart, info: ExportInfo, out: Path) -> list[dict]:
        """index.json's entries of a part's shards, checked against the files written."""
        groups, config = self.groups(part, info)
        sizes = self.sample_sizes(document_lengths(document_ends(part)), info)
        entries = []
        for j, (a, b) in enumerate(groups):
            size = 4 * (b - a + 2) + config + int(sizes[a:b].sum())
            path = out / self.shard_path(part, j)
            if not path.is_file() or path.stat().st_size != size:
                raise ExportError(f"{path}: missing or not {size} bytes (an unfinished export)")
            basename = path.relative_to(out / dataset_folder(part)).as_posix()
            raw = {"basename": basename, "bytes": size, "hashes": {}}
            entry = {"samples": b - a, "raw_data": raw, "zip_data": None}
            entries.append({**entry, **self.shard_config(info)})
        return entries

    def launch_fragment(self, info: ExportInfo) -> str:
        """How LLM Foundry (and plain streaming) read the export."""
        seq = info.seq_len or 2048
        vals = sorted(info.val_stems)
        val = f"val/{vals[0]}" if vals else "train"
        mask = (
            " and `loss_mask` (uint8, 1 where the loss is taken: LLM Foundry's `text` loader"
            " reads `tokens` only and trains on every token; a collator of your own applies"
            " the mask)"
            if info.has_masks
            else ""
        )
        return f"""## LLM Foundry / MosaicML streaming (MDS)

`train/` and each `val/<domain>/` are MDS datasets (`index.json` version 2), one sample
per document: `tokens` ({np.dtype(info.token_dtype).name}){mask}, EOS id {info.eos_id}.
LLM Foundry cuts a sample at `max_seq_len`: a longer document loses its tail, so set
`max_seq_len` at least to the longest document you want whole (this corpus was packed
for {seq}).

```yaml
train_loader:
  name: text
  dataset:
    local: {info.out}/train
    split: null
    max_seq_len: {seq}
    shuffle: true
eval_loader:
  name: text
  dataset: {{local: {info.out}/{val}, split: null, max_seq_len: {seq}, shuffle: false}}
tokenizer: {{name: {info.tokenizer_dir}}}
```

```python
from streaming import StreamingDataset

train = StreamingDataset(local="{info.out}/train", shuffle=True, batch_size=8)
```
"""


def fill_samples(
    buf: bytearray,
    pos: int,
    tokens: np.ndarray,
    mask: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """Encode the documents `starts`/`lengths` into `buf` from `pos`, as MDSWriter does:
    the size heads, then `loss_mask` (chat builds), then `tokens`."""
    view, itemsize = memoryview(buf), tokens.dtype.itemsize
    src = memoryview(tokens).cast("B")
    msrc = memoryview(mask).cast("B") if mask is not None else None
    widths = shape_bytes(lengths).tolist()
    for start, n, w in zip(starts.tolist(), lengths.tolist(), widths, strict=True):
        shape = struct.pack(f"<B{SHAPE_FORMATS[w]}", (1 << 2) | SHAPE_CODES[w], n)
        size = len(shape) + n * itemsize
        if msrc is not None:
            view[pos : pos + 8] = struct.pack("<II", len(shape) + n, size)
            pos += 8
            view[pos : pos + len(shape)] = shape
            pos += len(shape)
            view[pos : pos + n] = msrc[start : start + n]
            pos += n
        else:
            view[pos : pos + 4] = struct.pack("<I", size)
            pos += 4
        view[pos : pos + len(shape)] = shape
        pos += len(shape)
        view[pos : pos + n * itemsize] = src[start * itemsize : (start + n) * itemsize]
        pos += n * itemsize


EXPORTER = MdsExporter()

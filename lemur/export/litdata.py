"""litdata chunks for litgpt: `chunk-R-I.bin` files and an `index.json` per dataset folder.

A chunk (litdata's `BinaryWriter._create_chunk`) is `uint32 N`, `uint32[N+1]` absolute byte
offsets of its items, then the items' bytes; with `TokensLoader` every item is one
document's tokens with no header (`no_header_numpy:K`), so a chunk's body is a slice of our
`.bin` copied as it is. `TokensLoader(block_size=B)` reads each chunk as `dim // B` blocks
of B tokens across document boundaries (the tail of a chunk shorter than B is never read),
as litgpt's own prepared data is read. Chunks hold whole documents and are capped in bytes
like `BinaryWriter(chunk_bytes=...)`; chunk `chunk-R-I.bin` is the I-th of the folder's R-th
lemur shard. The index is written here, not by `BinaryWriter.merge`, which stamps
`updated_at` (a rerun must give the same bytes). No loss masks: TokensLoader reads tokens only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lemur.atomic_files import atomic_open, atomic_write_text
from lemur.export.files import document_ends, document_lengths
from lemur.export.formats import FORMAT_MODULES, ExportError, ExportInfo, ShardPart, exporter
from lemur.export.rechunk import (
    UINT32_LIMIT,
    by_folder,
    capped_groups,
    dataset_folder,
    part_arrays,
)
from lemur.shards.format import release_pages

# litdata's `_NUMPY_DTYPES_MAPPING` (litdata/constants.py): the K of "no_header_numpy:K".
NUMPY_DTYPE_CODES = {"uint16": 5, "uint32": 6}
# The pytree spec litdata writes for an item that is one array (`treespec_dumps` of a leaf).
LEAF_SPEC = '[1, {"type": null, "context": null, "children_spec": []}]'
HEADER_DTYPE = np.dtype("<u4")


def chunk_name(part: ShardPart, i: int) -> str:
    """The file name of a part's i-th chunk (litdata's `chunk-{rank}-{index}.bin`)."""
    return f"chunk-{part.number}-{i}.bin"


@dataclass(frozen=True)
class LitdataExporter:
    """Writes litdata `TokensLoader` chunks of at most `chunk_bytes` bytes (whole documents)."""

    chunk_bytes: int = 1 << 26  # 64 MiB, litdata's usual size for streamed chunks
    name: ClassVar[str] = "litdata"
    carries_masks: ClassVar[bool] = False

    def check(self, info: ExportInfo) -> None:
        """Refuse a chat build (TokensLoader has no masks) and an unknown token dtype."""
        if info.has_masks:
            carrying = [n for n in FORMAT_MODULES if n != self.name and exporter(n).carries_masks]
            raise ExportError(
                f"{info.source}: a chat build's loss masks cannot travel in litdata "
                f"(TokensLoader reads tokens only); export to {', '.join(carrying)}"
            )
        if np.dtype(info.token_dtype).name not in NUMPY_DTYPE_CODES:
            raise ExportError(f"{info.source}: token dtype {info.token_dtype} is not uint16/32")

    def groups(self, part: ShardPart, itemsize: int) -> list[tuple[int, int]]:
        """The documents `[a, b)` of each chunk of a part (a pure function of its `.idx`)."""
        lengths = document_lengths(document_ends(part))
        # each document costs its bytes and one uint32 offset; a chunk adds N and one offset
        groups = capped_groups(lengths * itemsize + 4, 8, self.chunk_bytes)
        for a, b in groups:
            if 8 + 4 * (b - a) + int(lengths[a:b].sum()) * itemsize >= UINT32_LIMIT:
                raise ExportError(f"{part.tokens}: document {a} is too long for a litdata chunk")
        return groups

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Write one shard as chunks under `out/<folder>/`; the chunk files."""
        tokens, ends, _ = part_arrays(part)
        itemsize = tokens.dtype.itemsize
        folder, written = out / dataset_folder(part), []
        starts = np.concatenate([[0], ends])
        for i, (a, b) in enumerate(self.groups(part, itemsize)):
            header = 4 * (b - a + 2)
            offsets = header + (starts[a : b + 1] - starts[a]) * itemsize
            path = folder / chunk_name(part, i)
            # the folder is renamed whole by the driver once complete: no fsync per chunk
            with atomic_open(path, durable=False) as fh:
                fh.write(np.concatenate([[b - a], offsets]).astype(HEADER_DTYPE).tobytes())
                fh.write(memoryview(tokens[starts[a] : starts[b]]))
            release_pages(tokens)
            written.append(path)
        return written

    def chunk_entries(self, part: ShardPart, out: Path) -> list[dict[str, Any]]:
        """index.json's `chunks` entries of a part, checked against the files written."""
        itemsize = np.dtype(part.token_dtype).itemsize
        lengths = document_lengths(document_ends(part))
        entries = []
        for i, (a, b) in enumerate(self.groups(part, itemsize)):
            dim = int(lengths[a:b].sum())
            size = 4 * (b - a + 2) + dim * itemsize
            path = out / dataset_folder(part) / chunk_name(part, i)
            if not path.is_file() or path.stat().st_size != size:
                raise ExportError(f"{path}: missing or not {size} bytes (an unfinished export)")
            entries.append(
                {"chunk_bytes": size, "chunk_size": b - a, "dim": dim, "filename": path.name}
            )
        return entries

    def config(self, info: ExportInfo) -> dict[str, Any]:
        """index.json's `config`: what litdata 0.2's `BinaryWriter` writes for TokensLoader."""
        code = NUMPY_DTYPE_CODES[np.dtype(info.token_dtype).name]
        return {
            "chunk_bytes": self.chunk_bytes,
            "chunk_size": None,
            "compression": None,
            "compression_batch_size": None,
            "compression_level": None,
            "data_format": [f"no_header_numpy:{code}"],
            "data_spec": LEAF_SPEC,
            "encryption": None,
            "ipc_compression": None,
            "item_loader": "TokensLoader",
            "types": "json",
        }

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """One `index.json` per dataset folder (train, each val domain), chunks in order."""
        written = []
        for folder, members in by_folder(parts).items():
            chunks = [e for part in members for e in self.chunk_entries(part, out)]
            index = {"chunks": chunks, "config": self.config(info)}
            path = out / folder / "index.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(index, sort_keys=True))
            written.append(path)
        return written

    def launch_fragment(self, info: ExportInfo) -> str:
        """How litgpt (and plain litdata) read the export."""
        block = (info.seq_len or 2048) + 1
        vals = sorted(info.val_stems)
        val = f"val/{vals[0]}" if vals else "train"
        return f"""## litgpt / litdata

`train/` and each `val/<domain>/` are litdata datasets of `TokensLoader` chunks (one
`index.json` each). litgpt reads blocks of `max_seq_length + 1` tokens across document
boundaries; documents end with EOS id {info.eos_id}.

```bash
litgpt pretrain MODEL --tokenizer_dir {info.tokenizer_dir} \\
  --data LitData --data.data_path {info.out} --data.split_names '[train, {val}]' \\
  --train.max_seq_length {block - 1}
```

```python
from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

train = StreamingDataset("{info.out}/train", item_loader=TokensLoader(block_size={block}),
                         shuffle=True, drop_last=True)
loader = StreamingDataLoader(train, batch_size=8, num_workers=4)
```

Each val domain is its own dataset: {", ".join(f"`val/{d}`" for d in vals) or "none"}.
"""


EXPORTER = LitdataExporter()

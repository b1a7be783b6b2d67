"""Parquet for HF `datasets` (and MaxText's Grain parquet path): one row per document.

`input_ids` is a list of int32 (what a tokenizer's `datasets.map` gives, and what torch and
`datasets.with_format("torch")` take without a uint16/uint32 detour); a chat build adds
`loss_mask`, a list of uint8; a build with `output.provenance` adds its documents.parquet's
columns (`id`, `source`, `file`, `line`, ...). Each lemur shard becomes `NNNNN.parquet` in
its dataset folder; row groups hold whole documents up to `row_group_tokens` tokens, built
from memory maps one at a time, so memory stays flat. Nothing in the file depends on the time or the
machine (pyarrow writes no timestamps), so a rerun gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from lemur.atomic_files import atomic_path
from lemur.export.files import document_lengths, documents_file
from lemur.export.formats import ExportError, ExportInfo, ShardPart
from lemur.export.rechunk import capped_groups, part_arrays
from lemur.shards.format import release_pages

IDS_DTYPE = np.dtype("<i4")


@dataclass(frozen=True)
class ParquetExporter:
    """Writes one parquet file per shard, row groups of at most `row_group_tokens` tokens."""

    row_group_tokens: int = 1 << 22  # 16 MiB of int32 ids per row group
    compression: str = "zstd"
    name: ClassVar[str] = "parquet"
    carries_masks: ClassVar[bool] = True

    def check(self, info: ExportInfo) -> None:
        """Refuse a vocabulary whose ids do not fit int32."""
        if info.vocab_size > np.iinfo(IDS_DTYPE).max + 1:
            raise ExportError(
                f"{info.source}: vocab_size {info.vocab_size} has ids past int32, "
                "the type of parquet's input_ids"
            )

    def schema(self, info: ExportInfo):  # -> pa.Schema (pyarrow imported only when used)
        """The columns: `input_ids` list<int32>, and `loss_mask` list<uint8> for chat."""
        import pyarrow as pa

        fields = [pa.field("input_ids", pa.list_(pa.int32()), nullable=False)]
        if info.has_masks:
            fields.append(pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False))
        return pa.schema(fields)

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Write one shard as `out/<stem>.parquet`; its path."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        tokens, ends, mask = part_arrays(part)
        lengths = document_lengths(ends)
        schema, path = self.schema(info), out / f"{part.stem}.parquet"
        # `output.provenance`: each row also carries its document's provenance columns.
        docs = documents_file(part)
        rows = pq.read_table(docs) if docs is not None else None
        if rows is not None:
            if rows.num_rows != len(lengths):
                raise ExportError(f"{docs}: {rows.num_rows} rows for {len(lengths)} documents")
            schema = pa.schema([*schema, *rows.schema])
        # the folder is renamed whole by the driver once complete: no fsync here
        with atomic_path(path, durable=False) as tmp:
            with pq.ParquetWriter(tmp, schema, compression=self.compression) as writer:
                start = 0
                for a, b in capped_groups(lengths, 0, self.row_group_tokens):
                    stop = start + int(lengths[a:b].sum())
                    offsets = np.zeros(b - a + 1, np.int32)
                    np.cumsum(lengths[a:b], out=offsets[1:])
                    ids = pa.array(np.asarray(tokens[start:stop], IDS_DTYPE))
                    columns = [pa.ListArray.from_arrays(pa.array(offsets), ids)]
                    if mask is not None:
                        values = pa.array(np.asarray(mask[start:stop]))
                        columns.append(pa.ListArray.from_arrays(pa.array(offsets), values))
                    if rows is not None:
                        columns += rows.slice(a, b - a).combine_chunks().columns
                    table = pa.Table.from_arrays(columns, schema=schema)
                    writer.write_table(table, row_group_size=b - a)
                    release_pages(tokens)
                    start = stop
        return [path]

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """Nothing spans shards: each parquet file carries its own schema."""
        return []

    def launch_fragment(self, info: ExportInfo) -> str:
        """How HF `datasets` (and so the HF Trainer or MaxText's Grain) read the export."""
        vals = sorted(info.val_stems)
        files = {"train": f"{info.out}/train/*.parquet"}
        files.update({f"val_{d}": f"{info.out}/val/{d}/*.parquet" for d in vals})
        listed = ",\n".join(f'        "{k}": "{v}"' for k, v in files.items())
        mask = ", `loss_mask` (uint8, 1 where the loss is taken)" if info.has_masks else ""
        return f"""## HF datasets (parquet)

One row per document: `input_ids` (int32){mask}; documents end with EOS id {info.eos_id}.
The files of a folder sort in the corpus's order (train keeps its global shuffle).

```python
from datasets import load_dataset
from transformers import AutoTokenizer

corpus = load_dataset(
    "parquet",
    data_files={{
{listed},
    }},
)
tokenizer = AutoTokenizer.from_pretrained("{info.tokenizer_dir}")
```
"""


EXPORTER = ParquetExporter()

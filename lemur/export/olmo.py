"""OLMo-core / dolma numpy memmaps: `NNNNN.npy`, `NNNNN.label_mask.npy`, `NNNNN.csv.gz`.

The layout is OLMo-core's (`olmo_core/data/numpy_dataset.py`): a token file is a
headerless array (`np.memmap`, despite the `.npy` name) of the config's `dtype`, read in
fixed-length instances across document boundaries, the EOS already between documents; a
label mask is a headerless bool array of the same length (`label_mask_paths`). Beside each
array, dolma's metadata (`memmap_writer.py`): a gzipped CSV with one `start,end,id,src` row
per document (end exclusive). The arrays are a lemur shard's `.bin` and `.mask` byte for
byte, so they are linked; the CSV is written with gzip's mtime 0, so reruns give the same
bytes.
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_write_bytes
from lemur.export.files import document_ends, documents_file, link_or_copy
from lemur.export.formats import ExportError, ExportInfo, ShardPart


def metadata_csv(part: ShardPart, ends: np.ndarray) -> bytes:
    """The gzipped `start,end,id,src` rows of one shard's documents (deterministic bytes):
    `id` is `STEM:N` (the shard's stem, the document's number in it), `src` the lemur shard;
    with the shard's provenance rows (`output.provenance`), the document's own id and its
    source file or URL (its source's name where it has none: a repository document)."""
    starts = np.concatenate(([0], ends[:-1])) if len(ends) else ends
    ids = [f"{part.stem}:{n}" for n in range(len(ends))]
    srcs = [part.tokens.name] * len(ends)
    docs = documents_file(part)
    if docs is not None:
        import pyarrow.parquet as pq

        rows = pq.read_table(docs, columns=["id", "file", "source"]).to_pylist()
        if len(rows) != len(ends):
            raise ExportError(f"{docs}: {len(rows)} rows for the shard's {len(ends)} documents")
        ids = [r["id"] for r in rows]
        srcs = [r["file"] or r["source"] for r in rows]
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")  # ids and paths may hold commas: quoted
    out.writerows(zip(starts.tolist(), ends.tolist(), ids, srcs, strict=True))
    return gzip.compress(text.getvalue().encode(), compresslevel=6, mtime=0)


def python_list(key: str, items: list[str]) -> list[str]:
    """`key=[...],` as lines of Python, one item a line (a paste-able keyword argument)."""
    return [f"    {key}=[", *(f"        {item!r}," for item in items), "    ],"]


class OlmoExporter:
    """Token memmaps (linked), label masks (linked, chat builds), per-document CSVs."""

    name = "olmo"
    carries_masks = True

    def check(self, info: ExportInfo) -> None:
        """uint16 and uint32 are both OLMo-core dtypes: nothing to refuse."""

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Link the tokens (and mask); write the document CSV."""
        files = [link_or_copy(part.tokens, out / f"{part.stem}.npy")]
        if part.mask is not None:
            files.append(link_or_copy(part.mask, out / f"{part.stem}.label_mask.npy"))
        csv = out / f"{part.stem}.csv.gz"
        atomic_write_bytes(csv, metadata_csv(part, document_ends(part)))
        return [*files, csv]

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """Nothing spans files."""
        return []

    def launch_fragment(self, info: ExportInfo) -> str:
        """OLMo-core 3's `NumpyFSLDatasetConfig`, and MaxText's note."""
        dtype = np.dtype(info.token_dtype).name
        paths = [str(info.out / f"{s}.npy") for s in info.train_stems]
        lines = [
            "## OLMo-core (and MaxText's olmo_grain)",
            "",
            "```python",
            "from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig",
            "",
            "dataset = NumpyFSLDatasetConfig(",
            *python_list("paths", paths),
        ]
        if info.has_masks:
            masks = [str(info.out / f"{s}.label_mask.npy") for s in info.train_stems]
            lines += python_list("label_mask_paths", masks)
        pad = info.eos_id  # lemur packs without padding: EOS stands in for OLMo's pad id
        lines += [
            f"    sequence_length={info.seq_len or 2048},",
            f"    dtype=NumpyDatasetDType.{dtype},",
            "    tokenizer=TokenizerConfig(",
            f"        vocab_size={info.vocab_size}, eos_token_id={info.eos_id}, "
            f"pad_token_id={pad}, bos_token_id={info.bos_id},",
            f"        identifier={str(info.tokenizer_dir)!r},",
            "    ),",
            ")",
            "```",
            "",
            f"Arrays are headerless `{dtype}` memmaps; documents already end with EOS id "
            f"{info.eos_id}. Each `NNNNN.csv.gz` lists `start,end,id,src` per document (end "
            "exclusive).",
        ]
        for domain, stems in info.val_stems.items():
            vals = [str(info.out / f"{s}.npy") for s in stems]
            lines.append(f"Validation domain `{domain}`: `paths={vals!r}`.")
        lines.append(
            "\nMaxText reads the same arrays with `dataset_type=olmo_grain` after its own "
            f"tool has indexed them; its token dtype defaults to uint32, so name `{dtype}` there."
        )
        return "\n".join(lines) + "\n"


EXPORTER = OlmoExporter()

"""Megatron-Core's `IndexedDataset` (`PREFIX.bin` + `PREFIX.idx`), written and read.

The layout is megatron-core's (`megatron/core/datasets/indexed_dataset.py`, `_IndexWriter`):
`PREFIX.bin` is the token ids with no header, `PREFIX.idx` is, little-endian, the magic
`MMIDIDX\\x00\\x00`, `<Q` version 1, `<B` dtype code (8 uint16, 4 int32: there is no uint32
code), `<Q` sequence count S, `<Q` document count D + 1, then `int32[S]` sequence lengths,
`int64[S]` byte offsets into the `.bin`, `int64[D + 1]` document indices (the first
sequence of each document, then S). One lemur document is one sequence: its `</s>` is
already in the tokens, as Megatron wants (it adds no EOD when it trains). A uint32 build
becomes int32, the same bytes once every id is below 2^31 (checked). Megatron has no loss
masks, so a chat build is refused.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_write_bytes
from lemur.export.files import (
    check_ids_below,
    document_ends,
    document_lengths,
    documents_file,
    link_or_copy,
)
from lemur.export.formats import ExportError, ExportInfo, ShardPart
from lemur.shards.format import ShardFormatError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, documents + 1
# The dtype codes of megatron-core's DType that a lemur corpus maps to.
DTYPE_CODES = {np.dtype("uint16"): 8, np.dtype("int32"): 4}
CODE_DTYPES = {
    1: np.dtype("uint8"),
    2: np.dtype("int8"),
    3: np.dtype("int16"),
    4: np.dtype("int32"),
    5: np.dtype("int64"),
    6: np.dtype("float64"),
    7: np.dtype("float32"),
    8: np.dtype("uint16"),
}
MASK_FORMATS = "nanotron, olmo, mds or parquet"


def megatron_dtype(token_dtype: np.dtype) -> np.dtype:
    """The `.bin` dtype Megatron is told for a lemur dtype (uint32 -> int32, same bytes)."""
    return np.dtype("uint16") if np.dtype(token_dtype).itemsize == 2 else np.dtype("int32")


def index_bytes(ends: np.ndarray, dtype: np.dtype) -> bytes:
    """The `.idx` of one shard, one sequence per document (`ends`: exclusive, int64)."""
    lengths = document_lengths(ends)
    if lengths.size and int(lengths.max()) >= 2**31:
        raise ExportError(f"a document of {int(lengths.max()):,} tokens: Megatron's are int32")
    starts = ends - lengths
    n = len(ends)
    header = HEADER.pack(MAGIC, VERSION, DTYPE_CODES[np.dtype(dtype)], n, n + 1)
    return b"".join(
        (
            header,
            lengths.astype("<i4").tobytes(),
            (starts * np.dtype(dtype).itemsize).astype("<i8").tobytes(),
            np.arange(n + 1, dtype="<i8").tobytes(),
        )
    )


class MegatronExporter:
    """`PREFIX.bin` (the shard, linked) + `PREFIX.idx` per shard."""

    name = "megatron"
    carries_masks = False

    def check(self, info: ExportInfo) -> None:
        """Refuse a chat build (no masks in Megatron) and a vocabulary past int32."""
        if info.has_masks:
            raise ExportError(
                f"{info.source}: a chat build (loss masks); Megatron's IndexedDataset carries "
                f"no masks: export it as {MASK_FORMATS}, which carry them"
            )
        if info.vocab_size > 2**31:
            raise ExportError(
                f"{info.source}: vocab_size {info.vocab_size:,} does not fit Megatron's int32 "
                "token ids (its dtypes have no uint32)"
            )

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Link the `.bin` (after checking a uint32 shard's ids fit int32), write the `.idx`."""
        dtype = megatron_dtype(part.token_dtype)
        if np.dtype(part.token_dtype).itemsize == 4:
            check_ids_below(part, 2**31, "Megatron's int32 (its dtypes have no uint32)")
        bin_path = link_or_copy(part.tokens, out / f"{part.stem}.bin")
        idx_path = out / f"{part.stem}.idx"
        try:
            atomic_write_bytes(idx_path, index_bytes(document_ends(part), dtype))
        except ExportError as e:
            raise ExportError(f"{part.index}: {e}") from None
        docs = documents_file(part)
        if docs is None:
            return [bin_path, idx_path]
        # One document is one sequence: the shard's provenance rows are by sequence index.
        return [bin_path, idx_path, link_or_copy(docs, out / f"{part.stem}.meta.parquet")]

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """Nothing spans shards: each prefix stands alone."""
        return []

    def launch_fragment(self, info: ExportInfo) -> str:
        """Megatron-LM / NeMo arguments: the data paths, the tokenizer and its EOD."""
        train = " ".join(str(info.out / s) for s in info.train_stems)
        lines = [
            "## Megatron-LM / Megatron-Core (NeMo and Megatron-Bridge read the same files)",
            "",
            "```",
        ]
        if train:
            lines.append(f"--train-data-path {train}")
        val = [str(info.out / s) for stems in info.val_stems.values() for s in stems]
        if val:
            lines.append(f"--valid-data-path {' '.join(val)}")
        lines += [
            "--tokenizer-type HuggingFaceTokenizer",
            f"--tokenizer-model {info.tokenizer_dir}",
        ]
        if info.seq_len:
            lines.append(f"--seq-length {info.seq_len}")
        lines += ["```", ""]
        dtype = megatron_dtype(info.token_dtype).name
        lines.append(
            f"Token files are `{dtype}` (dtype code {DTYPE_CODES[np.dtype(dtype)]} in each "
            f"`.idx`). Every document already ends with EOD id {info.eos_id} (the tokenizer's "
            "EOS, Megatron's `eod`): Megatron adds none. Each prefix is one lemur shard, "
            "train shards in the corpus's shuffled order; Megatron shuffles documents again "
            "with its own seed. No weights before the prefixes: each counts by its size."
        )
        for domain, stems in info.val_stems.items():
            paths = " ".join(str(info.out / s) for s in stems)
            lines.append(f"\nValidation domain `{domain}` alone: `--valid-data-path {paths}`")
        return "\n".join(lines) + "\n"


EXPORTER = MegatronExporter()


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class MegatronIndex:
    """One parsed `.idx`: its token dtype and arrays (views of a memory map)."""

    path: Path
    dtype: np.dtype
    lengths: np.ndarray  # int32 per sequence
    pointers: np.ndarray  # int64 byte offset of each sequence in the .bin
    documents: np.ndarray  # int64, the first sequence of each document, then the count


def read_index(path: str | Path) -> MegatronIndex:
    """Parse a Megatron `.idx` (ShardFormatError, one line naming it, when it is not one)."""
    path = Path(path)
    if not path.is_file():
        raise ShardFormatError(f"{path}: no such Megatron index (.idx)")
    raw = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0)
    if raw.size < HEADER.size:
        raise ShardFormatError(f"{path}: {raw.size} bytes, too short for a Megatron index")
    magic, version, code, sequences, documents = HEADER.unpack(bytes(raw[: HEADER.size]))
    if magic != MAGIC:
        raise ShardFormatError(f"{path}: not a Megatron index (magic {magic!r}, not {MAGIC!r})")
    if version != VERSION:
        raise ShardFormatError(f"{path}: Megatron index version {version}, not {VERSION}")
    if code not in CODE_DTYPES or CODE_DTYPES[code].kind not in "iu":
        raise ShardFormatError(f"{path}: dtype code {code} is not an integer token dtype")
    need = HEADER.size + 12 * sequences + 8 * documents
    if raw.size < need or documents < 1:
        raise ShardFormatError(
            f"{path}: {raw.size} bytes, {sequences} sequences and {documents} document "
            f"indices need {need} (truncated?)"
        )
    at = HEADER.size
    lengths = raw[at : at + 4 * sequences].view("<i4")
    at += 4 * sequences
    pointers = raw[at : at + 8 * sequences].view("<i8")
    docs = raw[at + 8 * sequences : at + 8 * sequences + 8 * documents].view("<i8")
    return MegatronIndex(path, CODE_DTYPES[code], lengths, pointers, docs)


def token_ends(index: MegatronIndex) -> np.ndarray:
    """Exclusive document ends in tokens (int64), for a `.bin` whose sequences follow each
    other with no gap (as every writer of Megatron's makes them); ShardFormatError else."""
    itemsize = index.dtype.itemsize
    lengths = index.lengths.astype(np.int64)
    expected = np.concatenate(([0], np.cumsum(lengths)[:-1])) * itemsize
    if not np.array_equal(index.pointers, expected[: len(index.pointers)]):
        raise ShardFormatError(
            f"{index.path}: sequences do not follow each other in the .bin (pointers with gaps)"
        )
    docs = index.documents
    if docs[0] != 0 or docs[-1] != len(lengths) or np.any(np.diff(docs) <= 0):
        raise ShardFormatError(
            f"{index.path}: document indices do not run from 0 to the sequence count, rising"
        )
    seq_ends = np.cumsum(lengths)
    return seq_ends[docs[1:] - 1] if len(docs) > 1 else np.zeros(0, np.int64)

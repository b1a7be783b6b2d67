"""datatrove / nanotron tokenized files (`NAME.ds` and its `.index`, `.loss`, `.metadata`).

The layout is datatrove's `TokenizedFile` (`datatrove/pipeline/tokens/tokenizer.py`), read
by its `DatatroveFolderDataset` (`datatrove/utils/dataset.py`) that nanotron's Nanoset
uses: `NAME.ds` the token ids (2 bytes a token up to 65,536 ids, else 4), `NAME.ds.index`
the uint64 exclusive document ends with no leading 0, `NAME.ds.loss` one byte (0/1) per
token, `NAME.ds.metadata` three lines (`tokenizer|token size`, the token count, the same
readable). The first three are byte for byte a lemur shard's `.bin`, `.idx` and `.mask`,
so all three are linked; only the metadata is written. Files are numbered `00000.ds`,
so that the folder dataset's lexical listing keeps the corpus's order. A build with
`output.provenance` also gets `NAME.ds.meta.parquet` (the shard's documents.parquet,
linked: row `i` is document `i` of the `.ds.index`), which the folder dataset's `*.ds`
listing leaves alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lemur.atomic_files import atomic_write_text
from lemur.export.files import documents_file, link_or_copy
from lemur.export.formats import ExportInfo, ShardPart
from lemur.shards.format import INDEX_DTYPE, MASK_DTYPE, ShardFormatError


def readable_count(n: int) -> str:
    """A token count as datatrove's third metadata line shows it (`1.23 MT`)."""
    for scale, prefix in ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}T"
    return f"{n} T"


class NanotronExporter:
    """`NNNNN.ds` + `.ds.index` (+ `.ds.loss` in a chat build, `.ds.meta.parquet` with
    provenance), linked; `.ds.metadata`."""

    name = "nanotron"
    carries_masks = True

    def check(self, info: ExportInfo) -> None:
        """Every lemur dtype is one of datatrove's token sizes: nothing to refuse."""

    def write_part(self, part: ShardPart, info: ExportInfo, out: Path) -> list[Path]:
        """Link the shard's three arrays under datatrove's names; write the metadata."""
        base = out / f"{part.stem}.ds"
        files = [
            link_or_copy(part.tokens, base),
            link_or_copy(part.index, Path(f"{base}.index")),
        ]
        if part.mask is not None:
            files.append(link_or_copy(part.mask, Path(f"{base}.loss")))
        docs = documents_file(part)
        if docs is not None:  # `output.provenance`: one row per document, in the index's order
            files.append(link_or_copy(docs, Path(f"{base}.meta.parquet")))
        size = np.dtype(part.token_dtype).itemsize
        tokens = part.tokens.stat().st_size // size
        meta = Path(f"{base}.metadata")
        lines = [f"{info.tokenizer_dir}|{size}", str(tokens), readable_count(tokens)]
        atomic_write_text(meta, "\n".join(lines))  # datatrove writes no final newline
        return [*files, meta]

    def finish(self, parts: list[ShardPart], info: ExportInfo, out: Path) -> list[Path]:
        """Nothing spans files: the folder is the dataset."""
        return []

    def launch_fragment(self, info: ExportInfo) -> str:
        """nanotron's `dataset_folder` and tokenizer, and datatrove's reader."""
        size = np.dtype(info.token_dtype).itemsize
        # A val-only export: the folder datasets read are the val domains'.
        train = info.out / ("train" if info.train_stems else f"val/{next(iter(info.val_stems))}")
        lines = [
            "## nanotron (Nanoset) / datatrove",
            "",
            "```yaml",
            "data_stages:",
            "- name: stable",
            "  start_training_step: 1",
            "  data:",
            "    dataset:",
            f"      dataset_folder: [{train}]",
            "tokenizer:",
            f"  tokenizer_name_or_path: {info.tokenizer_dir}",
            "```",
            "",
            "Or datatrove's reader directly:",
            "",
            "```python",
            "from datatrove.utils.dataset import DatatroveFolderDataset",
            f"train = DatatroveFolderDataset({str(train)!r}, seq_len={info.seq_len or 2048}, "
            f"token_size={size}, return_positions=True)",
            "```",
            "",
            f"Token size {size} bytes; every document ends with EOS id {info.eos_id}. Files are "
            "numbered in the corpus's shuffled order (the folder reader lists them lexically).",
        ]
        if info.val_stems:
            for domain in info.val_stems:
                lines.append(f"Validation domain `{domain}`: `{info.out / 'val' / domain}`.")
        if info.has_masks:
            lines.append(
                "Chat build: each `NNNNN.ds.loss` holds the loss mask (one byte per token, 1 "
                "where the token is a target that counts), datatrove's `save_loss_metadata` "
                "file; a trainer that reads it masks the prompt tokens."
            )
        return "\n".join(lines) + "\n"


EXPORTER = NanotronExporter()


# ---------------------------------------------------------------------------- reading


def ds_files(folder: str | Path) -> list[Path]:
    """The `.ds` files under a folder, in datatrove's lexical order (ShardFormatError if
    none)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardFormatError(f"{folder}: no such folder of datatrove .ds files")
    files = sorted(folder.rglob("*.ds"), key=lambda p: p.relative_to(folder).as_posix())
    if not files:
        raise ShardFormatError(f"{folder}: no .ds files (datatrove tokenized files) in it")
    return files


def ds_parts(path: Path, token_size: int) -> tuple[int, int, Path | None]:
    """(tokens, documents, loss file or None) of one `.ds`, checked as a lemur shard is
    (ShardFormatError naming the file)."""
    index = Path(f"{path}.index")
    if not index.is_file():
        raise ShardFormatError(f"{index}: missing (the document ends of {path.name})")
    size = path.stat().st_size
    if size % token_size:
        raise ShardFormatError(f"{path}: {size} bytes, not whole {token_size}-byte tokens")
    tokens, isize = size // token_size, index.stat().st_size
    if isize % INDEX_DTYPE.itemsize:
        raise ShardFormatError(f"{index}: {isize} bytes, not whole uint64 document ends")
    documents = isize // INDEX_DTYPE.itemsize
    if documents:
        with open(index, "rb") as f:
            f.seek(-INDEX_DTYPE.itemsize, 2)
            last = int(np.frombuffer(f.read(INDEX_DTYPE.itemsize), INDEX_DTYPE)[0])
        if last != tokens:
            raise ShardFormatError(f"{index}: last document ends at {last}, {path} holds {tokens}")
    loss = Path(f"{path}.loss")
    if loss.is_file() and loss.stat().st_size != tokens * MASK_DTYPE.itemsize:
        raise ShardFormatError(f"{loss}: {loss.stat().st_size} bytes for {tokens} tokens")
    return tokens, documents, loss if loss.is_file() else None

"""The tokenize step: documents to `BOS tokens EOS` runs on disk, with per-document records
(and, for chat builds, a loss mask aligned with the tokens)."""

from __future__ import annotations

import hashlib
import io
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.atomic_files import atomic_open
from lemur.data.encode.chat import MASK_KEY, TOKENS_KEY
from lemur.data.filter.tagging import mix_language
from lemur.data.labels import DOCUMENTS, TOKENS
from lemur.data.runs.format import DOC_RECORD
from lemur.data.runs.provenance import Rows, document_row, write_task
from lemur.shards.format import atomic_write_bytes, token_dtype
from lemur.tokenizer import Tokenizer, open_tokenizer
from lemur.tokenizer.word_cache import WordCache


class TokenizeWriter(PipelineStep):
    """Tokenizes documents in batches and writes this task's token run to `out_dir`.

    Output per task: `{rank}.bin` (flat tokens, `BOS doc EOS` per document: `<s> doc </s>`
    for Llama-2, `doc <|endoftext|>` for Qwen2.5), `{rank}.docs.npy` (one DOC_RECORD per
    document) and `{rank}.json` (language table, dtype, framing). `framing` is the
    (BOS id or None, EOS id) the build settled from the recipe; None: the tokenizer's own.
    With `masks` (a chat build), documents arrive encoded by ChatEncoder and the task also
    writes `{rank}.mask`: one uint8 loss-mask value per token of `{rank}.bin` (0 at BOS and
    EOS). With `template` (a chat build rendered by a tokenizer.json's own chat template),
    documents are written as encoded, nothing added: the template frames them, and the
    table's `framing` is "template". With `provenance` (`output.provenance`), the task also
    writes `{rank}.prov.parquet`, one row per record of where the document came from (a side
    record: the token bytes are the same). Files appear atomically when the task finishes; a
    killed task leaves nothing behind that the pack stage could mistake for output.
    """

    name = "🔢 lemur tokenize"
    type = "🔢 - TOKENIZER"

    def __init__(
        self,
        tokenizer_path: str,
        out_dir: str,
        batch_docs: int = 256,
        masks: bool = False,
        framing: tuple[int | None, int] | None = None,
        engine: str = "auto",
        template: bool = False,
        provenance: str | None = None,
    ) -> None:
        super().__init__()
        self.tokenizer_path = tokenizer_path
        self.out_dir = out_dir
        self.batch_docs = batch_docs
        self.masks = masks
        self.framing = framing
        self.engine = engine
        self.template = template
        # With `output.provenance`: the metadata key naming a row's repository (`repos.key`);
        # the task then writes its documents' provenance rows (lemur/data/runs/provenance.py).
        self.provenance = provenance

    def _encode(
        self, tok: Tokenizer, batch: list[Document], dtype: np.dtype, words: WordCache | None
    ) -> tuple[list[int], bytes, bytes]:
        """(lengths, token bytes, mask bytes) of a batch, each document framed BOS ... EOS."""
        bos, eos = self.framing or (tok.bos_id, tok.eos_id)
        head = () if bos is None or self.template else (bos,)
        if not self.masks and words is not None:
            # The same ids as `encode_arrays`, a distinct word encoded once (word_cache.py).
            first, last = np.array(head, dtype).tobytes(), np.array([eos], dtype).tobytes()
            encoded = words.encode([d.text for d in batch])
            size = dtype.itemsize
            lengths = [len(t) // size + len(head) + 1 for t in encoded]
            return lengths, b"".join([x for t in encoded for x in (first, t, last)]), b""
        if not self.masks:
            encoded = tok.encode_arrays([d.text for d in batch])
            lengths = [len(t) + len(head) + 1 for t in encoded]
            first, last = np.array(head, np.uint32), np.array([eos], np.uint32)
            framed = [x for t in encoded for x in (first, t, last)]
            tokens = np.concatenate(framed) if framed else first[:0]
            return lengths, tokens.astype(dtype, copy=False).tobytes(), b""
        ids = [d.metadata.pop(TOKENS_KEY) for d in batch]
        masks = [d.metadata.pop(MASK_KEY) for d in batch]
        tail = () if self.template else (eos,)
        lengths = [len(t) + len(head) + len(tail) for t in ids]
        first, last = np.array(head, dtype), np.array(tail, dtype)
        zero = np.zeros(1, np.uint8)
        tokens = np.concatenate(
            [x for t in ids for x in (first, t.astype(dtype), last)] or [first[:0]]
        )
        mask = np.concatenate(
            [x for m in masks for x in (zero[: len(head)], m, zero[: len(tail)])] or [zero[:0]]
        )
        return lengths, tokens.tobytes(), mask.tobytes()

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Consume documents; write the task's tokens, records and language table."""
        tok = open_tokenizer(self.tokenizer_path, engine=self.engine)
        dtype = token_dtype(tok.vocab_size)
        words = None if self.masks else WordCache.for_tokenizer(tok, dtype)
        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        languages: dict[str, int] = {}
        records: list[tuple[int, int, int, int, int]] = []
        ids: list[str] = []
        rows = Rows()  # provenance rows, with `output.provenance` only
        end = 0
        # The token file is renamed last (its block is the outer one): its presence marks
        # the task's output complete; the records and the mask appear before it.
        with (
            atomic_open(out / f"{rank:05d}.bin") as fh,
            atomic_open(out / f"{rank:05d}.mask") if self.masks else nullcontext() as fm,
        ):
            for batch in batched(data or [], self.batch_docs):
                with self.track_time("batch"):
                    lengths, tokens, mask = self._encode(tok, batch, dtype, words)
                    fh.write(tokens)
                    if fm is not None:
                        fm.write(mask)
                for doc, n in zip(batch, lengths, strict=True):
                    end += n
                    records.append(self.record(doc, n, end, languages))
                    ids.append(doc.id)
                    if self.provenance is not None:
                        rows.add(document_row(doc, self.provenance))
                    self.stat_update(DOCUMENTS)
                    self.stat_update(TOKENS, value=n)
            framing = (
                "template" if self.template else list(self.framing or (tok.bos_id, tok.eos_id))
            )
            table = {"languages": list(languages), "framing": framing}
            if self.provenance is not None:  # before the token file, as the records are
                write_task(out, rank, rows.table())
            self.finish(out, rank, records, ids, table, dtype)
        yield from ()  # a generator step that forwards nothing

    @staticmethod
    def record(doc: Document, n: int, end: int, languages: dict[str, int]) -> tuple:
        """The DOC_RECORD row of one document (its language added to the task's table)."""
        # The mix budgets language families (T-SQL counts as SQL).
        language = mix_language(str(doc.metadata.get("language")))
        lang = languages.setdefault(language, len(languages))
        id_hash = int.from_bytes(hashlib.blake2b(doc.id.encode(), digest_size=8).digest(), "little")
        return (doc.metadata["source_index"], lang, n, id_hash, end)

    @staticmethod
    def finish(out: Path, rank: int, records: list, ids: list[str], table: dict, dtype) -> None:
        """Write the task's records, ids and table (languages, framing; each atomically)."""
        rec = np.array(records, dtype=DOC_RECORD)
        buf = io.BytesIO()
        np.save(buf, rec)
        atomic_write_bytes(out / f"{rank:05d}.docs.npy", buf.getvalue())
        # Document ids, one per line (ids never contain newlines: we build them from names).
        atomic_write_bytes(
            out / f"{rank:05d}.ids.txt", "".join(i.replace("\n", " ") + "\n" for i in ids).encode()
        )
        atomic_write_bytes(
            out / f"{rank:05d}.json",
            json.dumps({**table, "dtype": dtype.name}).encode(),
        )

"""The tokenize step: documents to `<s> tokens </s>` runs on disk, with per-document records."""

from __future__ import annotations

import hashlib
import io
import json
import os
from itertools import chain
from pathlib import Path

import numpy as np
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from lemur.data.counts import DOCUMENTS, TOKENS
from lemur.data.filter.tagging import mix_language
from lemur.data.tokenize.tokenizer import load_tokenizer
from lemur.shards.format import atomic_write_bytes, token_dtype

# The task-local record of every tokenized document; the pack stage reads these.
DOC_RECORD = np.dtype(
    [("source", "<u2"), ("language", "<u2"), ("tokens", "<u4"), ("id_hash", "<u8"), ("end", "<u8")]
)


class TokenizeWriter(PipelineStep):
    """Tokenizes documents in batches and writes this task's token run to `out_dir`.

    Output per task: `{rank}.bin` (flat tokens, `<s> doc </s>` per document),
    `{rank}.docs.npy` (one DOC_RECORD per document) and `{rank}.json` (language table).
    Files appear atomically when the task finishes; a killed task leaves nothing behind
    that the pack stage could mistake for output.
    """

    name = "🔢 lemur tokenize"
    type = "🔢 - TOKENIZER"

    def __init__(self, tokenizer_path: str, out_dir: str, batch_docs: int = 256) -> None:
        super().__init__()
        self.tokenizer_path = tokenizer_path
        self.out_dir = out_dir
        self.batch_docs = batch_docs

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1):
        """Consume documents; write the task's tokens, records and language table."""
        sp = load_tokenizer(self.tokenizer_path)
        dtype = token_dtype(sp.vocab_size())
        out = Path(self.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp_bin = out / f".{rank:05d}.bin.tmp-{os.getpid()}"
        languages: dict[str, int] = {}
        records: list[tuple[int, int, int, int, int]] = []
        ids: list[str] = []
        end = 0
        with open(tmp_bin, "wb") as fh:
            for batch in batched(data or [], self.batch_docs):
                with self.track_time("batch"):
                    # One thread per task: parallelism comes from the executor's tasks.
                    encoded = sp.encode(
                        [d.text for d in batch], add_bos=True, add_eos=True, num_threads=1
                    )
                    lengths = [len(t) for t in encoded]
                    flat = np.fromiter(chain.from_iterable(encoded), dtype, count=sum(lengths))
                    fh.write(flat.tobytes())
                for doc, n in zip(batch, lengths, strict=True):
                    end += n
                    # The mix budgets language families (T-SQL counts as SQL).
                    language = mix_language(str(doc.metadata.get("language")))
                    lang = languages.setdefault(language, len(languages))
                    id_hash = int.from_bytes(
                        hashlib.blake2b(doc.id.encode(), digest_size=8).digest(), "little"
                    )
                    records.append((doc.metadata["source_index"], lang, n, id_hash, end))
                    ids.append(doc.id)
                    self.stat_update(DOCUMENTS)
                    self.stat_update(TOKENS, value=n)
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
            json.dumps({"languages": list(languages), "dtype": dtype.name}).encode(),
        )
        # The token file is renamed last: its presence marks the task's output complete.
        os.replace(tmp_bin, out / f"{rank:05d}.bin")
        return
        yield  # a generator step that forwards nothing

"""The tokenize stage's per-document records (domain, language, length, hashes) of every task."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lemur.data.tokenize.step import DOC_RECORD


@dataclass
class Records:
    """Every tokenized document as columns (one row per document)."""

    task: np.ndarray
    local: np.ndarray
    start: np.ndarray
    end: np.ndarray
    source: np.ndarray
    language: np.ndarray
    tokens: np.ndarray
    id_hash: np.ndarray
    languages: list[str]


def load_records(tok_dir: Path, n_tasks: int) -> Records:
    """Concatenate the per-task document records, mapping languages to one global table."""
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("task", "local", "start", "end", "source", "language", "tokens", "id_hash")
    }
    languages: dict[str, int] = {}
    for rank in range(n_tasks):
        rec = np.load(tok_dir / f"{rank:05d}.docs.npy")
        assert rec.dtype == DOC_RECORD
        table = json.loads((tok_dir / f"{rank:05d}.json").read_text())["languages"]
        remap = np.array([languages.setdefault(x, len(languages)) for x in table] or [0], np.uint16)
        end = rec["end"].astype(np.int64)
        cols["task"].append(np.full(len(rec), rank, np.int32))
        cols["local"].append(np.arange(len(rec), dtype=np.int64))
        cols["start"].append(end - rec["tokens"].astype(np.int64))
        cols["end"].append(end)
        cols["source"].append(rec["source"].astype(np.int32))
        cols["language"].append(remap[rec["language"]] if len(rec) else np.zeros(0, np.uint16))
        cols["tokens"].append(rec["tokens"].astype(np.int64))
        cols["id_hash"].append(rec["id_hash"])
    arrays = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    return Records(**arrays, languages=list(languages))

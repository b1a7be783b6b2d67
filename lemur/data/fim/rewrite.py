"""The FIM stage: a tokenize run's code documents rewritten as FIM documents, task by task.

It runs after tokenizing and dedup, not inside the tokenize step: reading, filtering, dedup
signing and tokenizing are one pipeline whose work is keyed by everything it depends on,
and FIM settings are not among them, so a new `fim.rate` keeps that work and re-runs only
this stage and packing (its folder, `fim-<key>/` beside the run, is keyed by the FIM
settings, the markers, the tokenizer and the dedup folder). Each chosen document
(`fim_chosen`: by its id, before anything is read) is decoded back to its text, as
Megatron's `fim_dataset.py` does (the build's tokenizers give back what they encode:
`round_trip_problem`), cut, and encoded part by part (lemur/tokenizer/fim.py) between its
own BOS and EOS: whole, before packing, so no tail is lost. Where the model's pieces never
span a word start (SentencePiece BPE: every Llama-2-style model; byte-level BPE: Llama-3,
Qwen2.5) only the words at the cuts are encoded again, the rest taken from the document's
own ids (lemur/tokenizer/fim_splice.py): the same ids at a fraction of the cost; `spliced`
counts those documents. The other documents, and those
dedup removes, are copied as they are. Each task writes the four files of a tokenize task
(tokens, records, ids, table; the tokens last), its provenance rows with `fim` set where the
run has them (`output.provenance`), and `{rank}.fim.json`, its counts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.fim.cut import fim_chosen, fim_split
from lemur.data.recipe.fim import FimConfig
from lemur.data.run.task import TaskStep
from lemur.data.runs import provenance
from lemur.data.runs.format import removals
from lemur.shards.format import atomic_write_bytes, atomic_write_json, open_array
from lemur.tokenizer import open_tokenizer
from lemur.tokenizer.fim import CodeMarkers, encode_parts, fim_layout, fim_parts
from lemur.tokenizer.fim_splice import WordSplicer

FIM_VERSION = 2  # part of the stage's work key: a new layout is a new folder
COUNT_KEYS = ("documents", "fim", "psm", "spm", "spliced", "tokens_before", "tokens_after")


@dataclass(frozen=True)
class FimJob:
    """What every FIM task is configured with."""

    tokenizer: str  # the prepared tokenizer's file
    engine: str  # its encoding engine (a tokenizer.json's: the build's choice)
    settings: FimConfig
    seed: int  # the recipe's seed (used when `settings.seed` is None)
    markers: CodeMarkers
    sources: tuple[int, ...]  # indices of the sources whose documents may become FIM

    def key(self, tokenizer_key: str, dedup_dir: Path | None) -> str:
        """The stage's work key: everything its output depends on besides the run."""
        what = {
            "v": FIM_VERSION,
            "fim": self.settings.work_settings(self.seed),
            "markers": self.markers,
            "sources": self.sources,
            "tokenizer": tokenizer_key,
            "dedup": None if dedup_dir is None else dedup_dir.name,
        }
        blob = json.dumps(what, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _rewrite(
    coder: _Coder, job: FimJob, run: np.ndarray, doc: slice, key: str, counts: dict[str, int]
) -> np.ndarray | None:
    """The FIM tokens of the framed document `run[doc]`, or None when it stays as it is."""
    text = coder.tok.decode(run[doc])
    cut = fim_split(text, job.settings, key, job.seed)
    if cut is None:
        return None
    a = len(cut.prefix)
    layout = fim_layout(a, a + len(cut.middle), len(text), job.markers, spm=cut.spm)
    ids = None if coder.splicer is None else coder.splicer.ids(layout, text, run[doc])
    counts["spliced"] += ids is not None
    if ids is None:
        ids = encode_parts(
            coder.tok, fim_parts(cut.prefix, cut.middle, cut.suffix, job.markers, spm=cut.spm)
        )
    counts["fim"] += 1
    counts["spm" if cut.spm else "psm"] += 1
    return np.asarray(ids, run.dtype)


@dataclass(frozen=True)
class _Coder:
    """The tokenizer of a FIM task, and its splicer where the model has one."""

    tok: Any
    splicer: WordSplicer | None


def fim_task(rank: int, src: Path, dedup_dir: Path | None, out: Path, job: FimJob) -> None:
    """Rewrite tokenize task `rank`'s run from `src` into `out` (skipped when done)."""
    if (out / f"{rank:05d}.bin").is_file():
        return
    table = json.loads((src / f"{rank:05d}.json").read_text())
    run = open_array(src / f"{rank:05d}.bin", np.dtype(table["dtype"]))
    rec = np.load(src / f"{rank:05d}.docs.npy")
    ids = (src / f"{rank:05d}.ids.txt").read_text().splitlines()
    head = 0 if table["framing"][0] is None else 1  # BOS (none for Qwen2.5), then EOS
    ends = rec["end"].astype(np.int64)
    starts = np.concatenate([[0], ends[:-1]]).astype(np.int64)
    gone = set(removals(dedup_dir, rank)["local"].tolist())
    eligible = np.isin(rec["source"], job.sources)
    counts = dict.fromkeys(COUNT_KEYS, 0)
    counts["documents"] = int(eligible.sum()) - len([i for i in gone if eligible[i]])
    lengths = rec["tokens"].astype(np.int64)
    tok = open_tokenizer(job.tokenizer, engine=job.engine)
    coder = _Coder(tok, WordSplicer.for_tokenizer(tok))
    done = 0  # the run's tokens written so far
    rewritten = np.zeros(len(rec), bool)  # provenance's `fim` column
    with atomic_open(out / f"{rank:05d}.bin") as fh:
        for i in np.flatnonzero(eligible).tolist():
            if i in gone or not fim_chosen(job.settings, ids[i], job.seed):
                continue
            s, e = int(starts[i]), int(ends[i])
            new = _rewrite(coder, job, run, slice(s + head, e - 1), ids[i], counts)
            if new is None:
                continue
            fh.write(run[done : s + head].tobytes())
            fh.write(new.tobytes())
            done = e - 1
            rewritten[i] = True
            counts["tokens_before"] += e - s
            lengths[i] = len(new) + head + 1
            counts["tokens_after"] += int(lengths[i])
        fh.write(run[done:].tobytes())
        if provenance.task_file(src, rank).is_file():  # a run with `output.provenance`
            rows = provenance.read_task(src, rank, len(rec))
            provenance.write_task(out, rank, provenance.with_fim(rows, rewritten))
        _finish(src, out, rank, rec, lengths, counts)


def _finish(
    src: Path, out: Path, rank: int, rec: np.ndarray, lengths: np.ndarray, counts: dict
) -> None:
    """Write the task's records (new lengths and ends), ids, table and counts."""
    import io

    rec = rec.copy()
    rec["tokens"] = lengths
    rec["end"] = np.cumsum(lengths)
    buf = io.BytesIO()
    np.save(buf, rec)
    atomic_write_bytes(out / f"{rank:05d}.docs.npy", buf.getvalue())
    for name in (f"{rank:05d}.ids.txt", f"{rank:05d}.json"):
        atomic_write_bytes(out / name, (src / name).read_bytes())
    atomic_write_json(out / f"{rank:05d}.fim.json", counts)


def fim_counts(out: Path, n_tasks: int) -> dict[str, int]:
    """The FIM stage's counts summed over its tasks."""
    total = dict.fromkeys(COUNT_KEYS, 0)
    for rank in range(n_tasks):
        for k, v in json.loads((out / f"{rank:05d}.fim.json").read_text()).items():
            total[k] += int(v)
    return total


class FimRewrite(TaskStep):
    """FIM task `rank`: tokenize task `rank`'s run with its chosen documents made FIM."""

    name = "🧩 fill-in-the-middle"
    type = "🔢 - TOKENIZER"

    def __init__(
        self, src: str | os.PathLike, dedup_dir: str | os.PathLike | None, out: str, job: FimJob
    ) -> None:
        super().__init__()
        self.src = Path(src)
        self.dedup_dir = None if dedup_dir is None else Path(dedup_dir)
        self.out = Path(out)
        self.job = job

    def task(self, rank: int) -> None:
        """Write FIM task `rank`'s files."""
        fim_task(rank, self.src, self.dedup_dir, self.out, self.job)

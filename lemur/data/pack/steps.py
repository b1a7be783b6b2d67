"""The pack stage's tasks as datatrove pipeline steps, run on the build's executor (local,
Ray, Slurm) like the tokenize and dedup tasks, with completion markers:

- `PackPrep` (one per tokenize task): the mix histogram and val summary (select.py), and
  the task's part of `duplicates.jsonl` when the recipe asks for it;
- `PackScatter` (one per tokenize task) and `PackGather` (one per output shard): shuffle.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lemur.data.pack.select import Groups, task_histogram
from lemur.data.pack.settings import PackSettings
from lemur.data.pack.shuffle import ShardWriter, gather_task, scatter_task
from lemur.data.run.task import TaskStep
from lemur.data.runs.format import TaskRecords, removals, task_records
from lemur.shards.format import atomic_write_bytes, atomic_write_json, open_array, write_shard


@dataclass(frozen=True)
class Duplicates:
    """What a prep task needs to write its removed documents (`duplicates.jsonl` rows)."""

    tokenizer: str  # the model that decodes their tokens
    sources: tuple[str, ...]  # the recipe's source names, by index


def prep_task(
    rank: int,
    tok_dir: Path,
    dedup_dir: Path | None,
    out_dir: Path,
    groups: Groups,
    duplicates: Duplicates | None = None,
) -> None:
    """Write tokenize task `rank`'s histogram (`{rank}.hist`) and summary (`{rank}.json`, last).

    With `duplicates`, also its removed documents, decoded (`{rank}.dups.jsonl`).
    """
    if (out_dir / f"{rank:05d}.json").is_file():
        return
    rec = task_records(tok_dir, rank, dedup_dir)
    keys, hist, val = task_histogram(rec, groups)
    if duplicates is not None:
        rows = duplicate_rows(rec, tok_dir, dedup_dir, duplicates)
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        atomic_write_bytes(out_dir / f"{rank:05d}.dups.jsonl", payload.encode())
    atomic_write_bytes(out_dir / f"{rank:05d}.hist", hist.tobytes())
    atomic_write_json(
        out_dir / f"{rank:05d}.json",
        {
            "documents": len(rec),
            "tokens": int(rec.tokens.sum()),
            "keys": [list(k) for k in keys],
            "val": val,
        },
    )


def duplicate_rows(
    rec: TaskRecords, tok_dir: Path, dedup_dir: Path | None, duplicates: Duplicates
) -> list[dict]:
    """The removed documents of one task with the id kept in their place, decoded."""
    import numpy as np

    from lemur.tokenizer import open_tokenizer

    rows = removals(dedup_dir, rec.rank)
    if not len(rows):
        return []
    tok = open_tokenizer(duplicates.tokenizer)
    table = json.loads((tok_dir / f"{rec.rank:05d}.json").read_text())
    run = open_array(tok_dir / f"{rec.rank:05d}.bin", np.dtype(table["dtype"]))
    # A document is framed BOS ... EOS, or ... EOS when the model has no BOS (Qwen2.5); a
    # chat template's document is as the template rendered it (its control ids decoded).
    framing = table.get("framing", [1, 2])
    head = 0 if framing == "template" or framing[0] is None else 1
    tail = 0 if framing == "template" else 1
    ids: dict[int, list[str]] = {}  # kept documents' tasks, read one file each

    def ids_of(task: int) -> list[str]:
        if task not in ids:
            ids[task] = (tok_dir / f"{task:05d}.ids.txt").read_text().splitlines()
        return ids[task]

    out = []
    for row in np.sort(rows, order="local").tolist():
        local, exact, keep_task, keep_local = (int(x) for x in row)
        toks = run[rec.start[local] + head : rec.end[local] - tail]
        out.append(
            {
                "id": ids_of(rec.rank)[local],
                "source": duplicates.sources[rec.source[local]],
                "kind": "exact" if exact else "near",
                "kept_id": ids_of(keep_task)[keep_local],
                "text": tok.decode(toks.tolist()),
            }
        )
    return out


class _PackTask(TaskStep):
    """A pack stage's task (datatrove shows its type in logs)."""

    type = "📦 - PACK"


class PackPrep(_PackTask):
    """Prep task `rank`: histogram and val summary of tokenize task `rank`."""

    name = "📊 pack histograms"

    def __init__(
        self,
        tok_dir: str | Path,
        dedup_dir: str | Path | None,
        out_dir: str | Path,
        groups: Groups,
        duplicates: Duplicates | None = None,
    ) -> None:
        super().__init__()
        self.tok_dir = Path(tok_dir)
        self.dedup_dir = None if dedup_dir is None else Path(dedup_dir)
        self.out_dir = Path(out_dir)
        self.groups = groups
        self.duplicates = duplicates

    def task(self, rank: int) -> None:
        """Write prep task `rank`'s outputs."""
        prep_task(rank, self.tok_dir, self.dedup_dir, self.out_dir, self.groups, self.duplicates)


class PackScatter(_PackTask):
    """Scatter task `rank`: tokenize task `rank`'s selected copies into bucket order."""

    name = "🔀 shuffle scatter"

    def __init__(
        self,
        tok_dir: str | Path,
        dedup_dir: str | Path | None,
        work: str | Path,
        settings: PackSettings,
    ) -> None:
        super().__init__()
        self.tok_dir = Path(tok_dir)
        self.dedup_dir = None if dedup_dir is None else Path(dedup_dir)
        self.work = Path(work)
        self.settings = settings

    def task(self, rank: int) -> None:
        """Write scatter task `rank`'s files."""
        scatter_task(rank, self.tok_dir, self.dedup_dir, self.work, self.settings)


class PackGather(_PackTask):
    """Gather task `rank`: output shard `rank` from every scatter task's bucket."""

    name = "🧱 shuffle gather"

    def __init__(
        self,
        work: str | Path,
        n_tasks: int,
        out: str | Path,
        shards: list[tuple[str, str, str]],
        settings: PackSettings,
        writer: ShardWriter = write_shard,
    ) -> None:
        super().__init__()
        self.work = Path(work)
        self.n_tasks = n_tasks
        self.out = Path(out)
        self.shards = shards  # (path without extension, split, domain) of each gather task
        self.settings = settings
        self.writer = writer  # the final writer (shuffle.ShardWriter): lemur's shards or another

    def task(self, rank: int) -> None:
        """Write shard `rank` with the step's writer."""
        shard = self.shards[rank]
        gather_task(rank, self.work, self.n_tasks, self.out, shard, self.settings, self.writer)

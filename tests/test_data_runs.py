"""The run between stages (lemur/data/runs/format.py) and the pack stage's final writer, a
seam: a task's records read back as written, and a writer other than lemur's shards gets
the very documents `write_shard` would have written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_atomic_files import one_tokenize_task

from lemur.data.pack.settings import PackSettings
from lemur.data.pack.shuffle import gather_task, scatter_task
from lemur.data.runs.format import task_records
from lemur.shards.format import write_shard


def _one_task(tok_dir: Path, n: int = 30) -> PackSettings:
    """A token run of one task of `n` code documents; pack settings that take all, one shard."""
    return one_tokenize_task(tok_dir, n, train_shards=1)


def test_task_records_read_back_the_run_as_written(tmp_path):
    """`task_records` gives each document's span in the task's tokens, no removals."""
    _one_task(tmp_path / "tok")
    rec = task_records(tmp_path / "tok", 0)
    written = np.load(tmp_path / "tok" / "00000.docs.npy")
    assert (rec.end == written["end"]).all() and (rec.start == rec.end - rec.tokens).all()
    assert rec.languages == ["Python"] and not rec.removed.any()


def test_the_final_writer_is_a_seam(tmp_path):
    """A writer handed to the gather task receives the shuffled shard's tokens and ends;
    writing them with `write_shard` gives the default gather's bytes."""
    settings = _one_task(tmp_path / "tok")
    scatter_task(0, tmp_path / "tok", None, tmp_path / "work", settings)
    shard = ("train/00000", "train", "mixed")
    gather_task(0, tmp_path / "work", 1, tmp_path / "lemur", shard, settings)
    got = []

    def export(root, rel, tokens, ends, dtype, split, domain, mask=None):
        got.append((rel, split, domain, np.array(tokens), np.array(ends)))
        return write_shard(root, rel, tokens, ends, dtype, split, domain, mask)

    work2 = tmp_path / "work2"
    scatter_task(0, tmp_path / "tok", None, work2, settings)
    gather_task(0, work2, 1, tmp_path / "other", shard, settings, export)
    assert len(got) == 1 and got[0][:3] == shard
    assert int(got[0][4][-1]) == len(got[0][3]) > 0
    for ext in ("bin", "idx"):
        mine = (tmp_path / "lemur" / f"train/00000.{ext}").read_bytes()
        assert (tmp_path / "other" / f"train/00000.{ext}").read_bytes() == mine

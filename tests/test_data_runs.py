"""The run between stages (lemur/data/runs/format.py) and the pack stage's final writer, a
seam: a task's records read back as written, and a writer other than lemur's shards gets
the very documents `write_shard` would have written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lemur.data.pack.select import N_BINS, Groups
from lemur.data.pack.settings import PackSettings
from lemur.data.pack.shuffle import gather_task, scatter_task
from lemur.data.runs.format import DOC_RECORD, task_records
from lemur.shards.format import write_shard


def _one_task(tok_dir: Path, n: int = 30) -> PackSettings:
    """A token run of one task of `n` code documents; pack settings that take all, one shard."""
    rng = np.random.default_rng(0)
    tok_dir.mkdir(parents=True)
    rec = np.zeros(n, DOC_RECORD)
    rec["tokens"] = rng.integers(3, 50, n)
    rec["id_hash"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    rec["end"] = np.cumsum(rec["tokens"])
    np.save(tok_dir / "00000.docs.npy", rec)
    (tok_dir / "00000.json").write_text(json.dumps({"languages": ["Python"]}))
    rng.integers(3, 800, int(rec["end"][-1]), dtype=np.uint16).tofile(tok_dir / "00000.bin")
    none = np.packbits(np.zeros(N_BINS, bool)).tobytes()  # one whole pass, no partial one
    groups = Groups(seed=1, val_fraction=0.0, domains=("code",), groups=("code",))
    return PackSettings(groups, {"code": 0}, (("code", "Python", 1, none),), 1, {}, "<u2", False)


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

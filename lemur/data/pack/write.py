"""Pack tokenized documents into shards: histograms, plan, scatter, gather, manifest sections.

Every stage but the plan is a set of tasks on the build's executor (steps.py), each holding
one tokenize task's records or one shard; the plan holds one histogram per mix unit; the
manifest sections are sums of the scatter tasks' per-(source, language) summaries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lemur.atomic_files import atomic_open
from lemur.data.dedup.stage import CLUSTER
from lemur.data.pack.plan import PackError, PackPlan, make_plan
from lemur.data.pack.records import removals
from lemur.data.pack.select import Groups
from lemur.data.pack.shuffle import (
    DONE,
    GROUP_FIELDS,
    ShuffleError,
    _name,
    check_scatter,
)
from lemur.data.pack.steps import PackGather, PackPrep, PackScatter
from lemur.data.recipe import Recipe
from lemur.data.run.task import run_here
from lemur.shards.format import ShardInfo, token_dtype

__all__ = ["PackError", "PackPlan", "Packer"]
StageRunner = Callable[[list, Path, int, str], None]  # (pipeline, folder, tasks, name)


class Packer:
    """Selects, orders and writes documents into the shard directory, as executor tasks."""

    def __init__(
        self,
        recipe: Recipe,
        tok_dir: Path,
        out_dir: Path,
        n_tasks: int,
        vocab_size: int,
        prefix: str = "",
        tokenizer: Path | None = None,
        dedup_dir: Path | None = None,
        run_stage: StageRunner = run_here,
    ):
        self.recipe = recipe
        self.tok_dir = tok_dir
        self.out_dir = out_dir
        # Shards go under `out_dir/prefix/` (the build's own directory, see build.py).
        self.prefix = prefix
        self.tokenizer = tokenizer or out_dir / "tokenizer.model"
        self.n_tasks = n_tasks
        self.dedup_dir = dedup_dir  # the finished dedup tasks' folder (see dedup/stage.py)
        self.dtype = token_dtype(vocab_size)
        self.masks = recipe.is_chat()  # chat builds carry a loss mask per token
        self.groups = Groups.of(recipe)
        self.run_stage = run_stage
        key = json.dumps([prefix, str(tok_dir), str(dedup_dir), self.dtype.str, n_tasks])
        # Named `shuffle-*` so that commit() removes it once the manifest is written.
        name = f"shuffle-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        self.work = recipe.work_root() / name

    def _duplicates(self) -> tuple[str, list[str]] | None:
        cfg = self.recipe.dedup
        if not (cfg.write_duplicates and self.dedup_dir is not None):
            return None
        return str(self.tokenizer), [s.name for s in self.recipe.sources]

    def plan(self) -> PackPlan:
        """Histogram tasks, then the plan (no shards written): what `--plan-only` shows."""
        cfg = self.recipe.dedup
        if (cfg.exact or cfg.near) and self.dedup_dir is None:
            raise ValueError("Packer: dedup is on but no dedup stage folder was given")
        hist = self.work / "hist"
        step = PackPrep(str(self.tok_dir), self._dd(), str(hist), self.groups, self._duplicates())
        self.run_stage([step], self.work / "prep", self.n_tasks, "pack: histograms")
        return make_plan(self.recipe, hist, self.n_tasks, self.dtype.itemsize)

    def _dd(self) -> str | None:
        return str(self.dedup_dir) if self.dedup_dir is not None else None

    def _cfg(self, plan: PackPlan) -> dict[str, Any]:
        return {
            "groups": self.groups,
            "val_cut": plan.val_cut,
            "units": plan.units,
            "train_shards": plan.train_shards,
            "val_shards": plan.val_shards,
            "dtype": self.dtype.str,
            "masks": self.masks,
        }

    def pack(self, plan: PackPlan, report=None) -> dict[str, Any]:
        """Scatter and gather tasks, then the manifest's shards, mix, stats and dedup parts."""
        cfg, work = self._cfg(plan), self.work
        scatter = PackScatter(str(self.tok_dir), self._dd(), str(work), cfg)
        self.run_stage([scatter], work / "scatter", self.n_tasks, "shuffle: scatter")
        bad = check_scatter(work, self.n_tasks, self.dtype, self.masks)
        if bad:
            for t, _ in bad:  # a plain rerun redoes these scatter tasks (deterministically)
                (work / "scatter" / "logs" / "completions" / f"{t:05d}").unlink(missing_ok=True)
                (work / _name(t, "json")).unlink(missing_ok=True)
            raise ShuffleError(
                f"{bad[0][1]}; the shuffle's work files were changed by another process or a "
                f"damaged disk: rerun the build to redo {len(bad)} scatter task(s)"
            )
        join = (lambda rel: f"{self.prefix}/{rel}") if self.prefix else (lambda rel: rel)
        shards = [(join(rel), split, d) for rel, split, d in plan.buckets()]
        gather = PackGather(str(work), self.n_tasks, str(self.out_dir), shards, cfg)
        self.run_stage([gather], work / "gather", len(shards), "shuffle: write")
        infos = []
        for b in range(len(shards)):
            entry = json.loads((work / DONE / f"{b:05d}.json").read_text())
            if not entry.get("empty"):
                infos.append(ShardInfo(**entry))
        totals, dedup = self._summaries()
        if self._duplicates() is not None:
            self._write_duplicates()
        return {
            "shards": [s.to_json() for s in infos],
            "mix": self._mix_section(totals, plan),
            "stats": self._stats(totals),
            "dedup": self._dedup_section(dedup),
        }

    def _summaries(self) -> tuple[dict[tuple[int, str], np.ndarray], dict[str, np.ndarray]]:
        """Scatter summaries summed: per (source, language) the GROUP_FIELDS, and removals."""
        n_src = len(self.recipe.sources)
        totals: dict[tuple[int, str], np.ndarray] = {}
        dedup = {"exact": np.zeros(n_src, np.int64), "near": np.zeros(n_src, np.int64)}
        for t in range(self.n_tasks):
            s = json.loads((self.work / _name(t, "json")).read_text())
            for k, v in s["groups"].items():
                src, lang = k.split("\t", 1)
                key = (int(src), lang)
                totals[key] = totals.get(key, np.zeros(len(GROUP_FIELDS), np.int64)) + v
            for kind in ("exact", "near"):
                for src, n in s[f"removed_{kind}"].items():
                    dedup[kind][int(src)] += n
        return totals, dedup

    def _write_duplicates(self) -> None:
        parts = [self.work / "hist" / f"{t:05d}.dups.jsonl" for t in range(self.n_tasks)]
        path = self.out_dir / self.prefix / "duplicates.jsonl"
        with atomic_open(path) as fh:
            fh.writelines(p.read_bytes() for p in parts)

    def _dedup_section(self, dedup: dict[str, np.ndarray]) -> dict[str, Any]:
        if self.dedup_dir is None:
            return {"exact": 0, "near": 0, "by_source": {}, "cluster_sizes": {}}
        by_source = {
            s.name: {"exact": int(dedup["exact"][i]), "near": int(dedup["near"][i])}
            for i, s in enumerate(self.recipe.sources)
        }
        summary = json.loads((self.dedup_dir / CLUSTER / "out" / "summary.json").read_text())
        written = self._duplicates() is not None
        return {
            "exact": int(dedup["exact"].sum()),
            "near": int(dedup["near"].sum()),
            "by_source": by_source,
            "cluster_sizes": self._cluster_sizes(),
            "candidate_pairs": summary["candidate_pairs"],
            "verified_pairs": summary["verified_pairs"],
            **({"file": f"{self.prefix}/duplicates.jsonl"} if written else {}),
        }

    def _cluster_sizes(self) -> dict[str, int]:
        """Histogram of duplicate cluster sizes: one kept document plus its removed copies."""
        kept = [np.zeros(0, np.uint64)]
        for t in range(self.n_tasks):
            rows = removals(self.dedup_dir, t)
            kept.append(rows["keep_task"].astype(np.uint64) << np.uint64(32) | rows["keep_local"])
        _, members = np.unique(np.concatenate(kept), return_counts=True)
        sizes, freq = np.unique(members + 1, return_counts=True)
        return {str(int(s)): int(f) for s, f in zip(sizes, freq, strict=True)}

    def _by(self, totals, field: str, pick: Callable[[int, str], bool]) -> int:
        i = GROUP_FIELDS.index(field)
        return int(sum(v[i] for (s, lang), v in totals.items() if pick(s, lang)))

    def _mix_section(self, totals, plan: PackPlan) -> dict[str, Any]:
        recipe, g = self.recipe, self.groups
        domains = recipe.domains()
        tokens = {
            d: self._by(totals, "selected_tokens", lambda s, _, d=d: g.domains[s] == d)
            for d in domains
        }
        available = {
            d: self._by(totals, "pool_tokens", lambda s, _, d=d: g.domains[s] == d) for d in domains
        }
        sources = {}
        for i, s in enumerate(recipe.sources):
            mine = lambda src, _, i=i: src == i  # noqa: E731
            avail, sel = (
                self._by(totals, "pool_tokens", mine),
                self._by(totals, "selected_tokens", mine),
            )
            sources[s.name] = {
                "domain": s.domain,
                "available_tokens": avail,
                "tokens": sel,
                "documents": self._by(totals, "selected_docs", mine),
                "copies": self._by(totals, "copies", mine),
                "rate": round(sel / avail, 6) if avail else 0.0,
            }
        languages: dict[str, dict[str, Any]] = {}
        for (d, lang), unit in sorted(plan.mix.units.items()):
            got = self._by(
                totals,
                "selected_tokens",
                lambda s, la, d=d, lang=lang: g.groups[s] == d and la == lang,
            )
            languages.setdefault(d, {})[lang] = {**unit.to_json(), "tokens": got}
        total = sum(tokens.values()) or 1
        pool = self._by(totals, "pool_docs", lambda *_: True)
        return {
            "target": self._target(available),
            "tokens": tokens,
            "available": available,
            "achieved": {d: round(t / total, 6) for d, t in tokens.items()},
            "total_tokens": plan.mix.total,
            "languages": languages,
            "sources": sources,
            "notes": plan.mix.notes,
            "unselected_documents": pool - self._by(totals, "selected_docs", lambda *_: True),
        }

    def _target(self, available: dict[str, int]) -> dict[str, float]:
        """The mix's target by domain: the ratio, or for chat the weights (else what is there)."""
        recipe = self.recipe
        if not recipe.is_chat():
            return dict(recipe.mix.ratio)
        if not recipe.mix.weights:
            return {d: float(a) for d, a in available.items()}
        target: dict[str, float] = {}
        for s in recipe.sources:
            target[s.domain] = target.get(s.domain, 0.0) + recipe.mix.weights.get(s.name, 0.0)
        return target

    def _stats(self, totals) -> dict[str, Any]:
        out: dict[str, Any] = {"groups": []}
        fields = {"train": ("copies", "selected_tokens"), "val": ("val_docs", "val_tokens")}
        for split, (docs, toks) in fields.items():
            for (s, lang), v in sorted(totals.items()):
                n = int(v[GROUP_FIELDS.index(docs)])
                if n:
                    src = self.recipe.sources[s]
                    out["groups"].append(
                        {
                            "split": split,
                            "domain": src.domain,
                            "source": src.name,
                            "language": lang,
                            "documents": n,
                            "tokens": int(v[GROUP_FIELDS.index(toks)]),
                        }
                    )
        return out

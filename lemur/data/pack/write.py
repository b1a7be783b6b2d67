"""Pack tokenized documents into shards: dedup, val split, mix plan, external shuffle, write.

Reads the tokenize stage's per-task runs (`{rank}.bin` + `{rank}.docs.npy`, and in chat
builds `{rank}.mask`); only small per-document records (~50 bytes each) are held in memory;
tokens (and masks) move through bucket files on disk (see shuffle.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.dedup.cluster import DedupResult, cluster_sizes, write_duplicates
from lemur.data.dedup.signer import GOLDEN64
from lemur.data.dedup.stage import dedup_result
from lemur.data.pack.mix import (
    MixInfeasible,
    MixPlan,
    plan_all,
    plan_mix,
    seeded_hash,
    select_repeats,
)
from lemur.data.pack.records import load_records
from lemur.data.pack.shuffle import external_shuffle
from lemur.data.recipe import Recipe
from lemur.shards.format import MASK_DTYPE, ShardInfo, ShardWriter, open_array, token_dtype


def _join(prefix: str, rel: str) -> str:
    return f"{prefix}/{rel}" if prefix else rel


@dataclass(frozen=True)
class PackPlan:
    """What `Packer.plan` decided: the mix plan and, per document, its domain and fate."""

    mix: MixPlan
    domains: np.ndarray  # domain name of each document's source
    dups: DedupResult | None  # None when dedup is off
    val: np.ndarray  # bool: held out for validation
    pool: np.ndarray  # bool: kept and not val, what the mix selects from
    groups: np.ndarray  # the mix's "domain" of each document (its source in weighted chat)


class Packer:
    """Selects, orders and writes documents into the shard directory."""

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
        self.rec = load_records(tok_dir, n_tasks)
        self.domain_of_source = np.array([s.domain for s in recipe.sources], dtype=object)
        self._runs: dict[int, np.ndarray] = {}
        # Chat builds: every task wrote a loss mask aligned with its token run.
        self.masks = recipe.is_chat()
        self._masks: dict[int, np.ndarray] = {}

    def _run(self, task: int) -> np.ndarray:
        if task not in self._runs:
            path = self.tok_dir / f"{task:05d}.bin"
            self._runs[task] = (
                np.memmap(path, dtype=self.dtype, mode="r")
                if path.stat().st_size
                else np.zeros(0, self.dtype)
            )
        return self._runs[task]

    def _mask(self, task: int) -> np.ndarray:
        """The loss mask of a task's run (chat builds), as long as its tokens."""
        if task not in self._masks:
            self._masks[task] = open_array(self.tok_dir / f"{task:05d}.mask", MASK_DTYPE)
            if len(self._masks[task]) != len(self._run(task)):
                raise PackError(
                    f"{self.tok_dir / f'{task:05d}.mask'}: {len(self._masks[task])} mask values "
                    f"for {len(self._run(task))} tokens; delete {self.tok_dir} and rerun"
                )
        return self._masks[task]

    def _write(self, rows: np.ndarray, prefix: str, split: str, domain: str) -> list[ShardInfo]:
        writer = ShardWriter(
            self.out_dir, prefix, split, domain, self.dtype, self.recipe.shard_tokens
        )
        r = self.rec
        for i in rows.tolist():
            t, lo, hi = int(r.task[i]), r.start[i], r.end[i]
            writer.add(self._run(t)[lo:hi], self._mask(t)[lo:hi] if self.masks else None)
        return writer.close()

    def dedup(self) -> DedupResult | None:
        """Exact and near duplicates across all sources of each domain (None when off).

        The decisions come from the dedup tasks the build ran on its executor.
        """
        cfg = self.recipe.dedup
        if not (cfg.exact or cfg.near) or len(self.rec.task) == 0:
            return None
        if self.dedup_dir is None:
            raise ValueError("Packer: dedup is on but no dedup stage folder was given")
        result = dedup_result(self.tok_dir, self.n_tasks, self.dedup_dir)
        if cfg.write_duplicates:
            self._write_duplicates(result)
        return result

    def _ids(self) -> list[list[str]]:
        return [
            (self.tok_dir / f"{t:05d}.ids.txt").read_text().splitlines()
            for t in range(self.n_tasks)
        ]

    def _write_duplicates(self, result: DedupResult) -> None:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(self.tokenizer))
        ids, r = self._ids(), self.rec
        rows = []
        for i in np.flatnonzero(result.removed).tolist():
            keep = int(result.cluster[i])
            toks = self._run(int(r.task[i]))[r.start[i] + 1 : r.end[i] - 1]
            rows.append(
                {
                    "id": ids[r.task[i]][r.local[i]],
                    "source": self.recipe.sources[r.source[i]].name,
                    "kind": "exact" if result.removed_exact[i] else "near",
                    "kept_id": ids[r.task[keep]][r.local[keep]],
                    "text": sp.decode(toks.tolist()),
                }
            )
        write_duplicates(self.out_dir / self.prefix / "duplicates.jsonl", rows)

    def split_val(self, domains: np.ndarray, eligible: np.ndarray) -> np.ndarray:
        """Boolean mask of validation documents: a seeded-hash sample of each domain."""
        val = np.zeros(len(domains), bool)
        if self.recipe.val_fraction <= 0:
            return val
        h = seeded_hash(self.rec.id_hash, self.recipe.seed, "val")
        for d in self.recipe.domains():
            idx = np.flatnonzero((domains == d) & eligible)
            if len(idx) < 2:
                continue
            k = min(len(idx) - 1, max(1, int(np.ceil(self.recipe.val_fraction * len(idx)))))
            val[idx[np.argsort(h[idx], kind="stable")[:k]]] = True
        return val

    def plan(self) -> PackPlan:
        """Dedup, val split and the mix plan (no shards written): what `--plan-only` shows.

        `pack` takes this plan rather than recomputing it (dedup is the costly part).
        """
        r, recipe = self.rec, self.recipe
        domains = self.domain_of_source[r.source] if len(r.source) else np.zeros(0, object)
        dups = self.dedup()
        kept = ~dups.removed if dups is not None else np.ones(len(domains), bool)
        val = self.split_val(domains, kept)
        pool = kept & ~val
        # Weighted chat builds plan tokens per source; every other build per domain.
        weighted = recipe.is_chat() and bool(recipe.mix.weights)
        names = [s.name for s in recipe.sources] if weighted else recipe.domains()
        groups = np.array(names, dtype=object)[r.source] if weighted else domains
        available: dict[tuple[str, str], int] = {}
        for d in names:
            in_d = pool & (groups == d)
            for lang_id in np.unique(r.language[in_d]).tolist():
                m = in_d & (r.language == lang_id)
                available[(d, r.languages[lang_id])] = int(r.tokens[m].sum())
        mix = recipe.mix
        try:
            if not recipe.is_chat():
                plan = plan_mix(available, mix.ratio, mix.total_tokens, mix.shares, mix.max_repeats)
            elif weighted:
                plan = plan_mix(available, mix.weights, mix.total_tokens, None, mix.max_repeats)
            else:  # no code:text ratio for chat: every kept conversation once
                plan = plan_all(available)
        except MixInfeasible as e:
            raise PackError(str(e)) from None
        return PackPlan(plan, domains, dups, val, pool, groups)

    def pack(self, pack_plan: PackPlan, report=None) -> dict[str, Any]:
        """Write train and val shards of `pack_plan`; return manifest parts and stats."""
        r, recipe = self.rec, self.recipe
        plan, domains, val, pool = pack_plan.mix, pack_plan.domains, pack_plan.val, pack_plan.pool
        groups = pack_plan.groups
        # copies of each document: 0 (not selected), 1, or more when the plan repeats it
        copies = np.zeros(len(domains), np.int64)
        mix_hash = seeded_hash(r.id_hash, recipe.seed, "mix")
        for (d, lang), unit in plan.units.items():
            idx = np.flatnonzero(pool & (groups == d) & (r.language == r.languages.index(lang)))
            copies[idx] = select_repeats(r.tokens[idx], mix_hash[idx], unit.budget)
        entry = np.repeat(np.arange(len(copies)), copies)
        first = np.repeat(np.cumsum(copies) - copies, copies)
        copy_no = np.arange(len(entry)) - first
        with np.errstate(over="ignore"):
            salted = r.id_hash[entry] ^ (copy_no.astype(np.uint64) * GOLDEN64)
        keys = seeded_hash(salted, recipe.seed, "shuffle")
        shards = external_shuffle(
            r.task[entry],
            r.start[entry],
            r.end[entry],
            keys,
            self._run,
            self.out_dir / ".work",
            self.out_dir,
            self.dtype,
            recipe.shard_tokens,
            report,
            prefix=self.prefix,
            open_mask=self._mask if self.masks else None,
        )
        val_hash = seeded_hash(r.id_hash, recipe.seed, "val-order")
        for d in recipe.domains():
            rows = np.flatnonzero(val & (domains == d))
            rows = rows[np.argsort(val_hash[rows], kind="stable")]
            shards += self._write(rows, _join(self.prefix, f"val/{d}"), "val", d)
        return {
            "shards": [s.to_json() for s in shards],
            "mix": self._mix_section(domains, pool, copies, plan, groups),
            "stats": self._stats(val, copies),
            "dedup": self._dedup_section(pack_plan.dups),
        }

    def _dedup_section(self, dups: DedupResult | None) -> dict[str, Any]:
        if dups is None:
            return {"exact": 0, "near": 0, "by_source": {}, "cluster_sizes": {}}
        by_source = {}
        for i, s in enumerate(self.recipe.sources):
            m = self.rec.source == i
            by_source[s.name] = {
                "exact": int((dups.removed_exact & m).sum()),
                "near": int((dups.removed_near & m).sum()),
            }
        return {
            "exact": int(dups.removed_exact.sum()),
            "near": int(dups.removed_near.sum()),
            "by_source": by_source,
            "cluster_sizes": cluster_sizes(dups.cluster, dups.removed),
            "candidate_pairs": dups.candidate_pairs,
            "verified_pairs": dups.verified_pairs,
        }

    def _mix_section(self, domains, pool, copies, plan: MixPlan, groups) -> dict[str, Any]:
        r, recipe = self.rec, self.recipe
        tok = r.tokens * copies
        tokens = {d: int(tok[domains == d].sum()) for d in recipe.domains()}
        available = {d: int(r.tokens[pool & (domains == d)].sum()) for d in recipe.domains()}
        sources = {}
        for i, s in enumerate(recipe.sources):
            m = (r.source == i) & pool
            avail = int(r.tokens[m].sum())
            sel = int(tok[m].sum())
            sources[s.name] = {
                "domain": s.domain,
                "available_tokens": avail,
                "tokens": sel,
                "documents": int((m & (copies > 0)).sum()),
                "copies": int(copies[m].sum()),
                "rate": round(sel / avail, 6) if avail else 0.0,
            }
        languages: dict[str, dict[str, Any]] = {}
        for (d, lang), unit in sorted(plan.units.items()):
            m = (groups == d) & (r.language == r.languages.index(lang))
            languages.setdefault(d, {})[lang] = {
                **unit.to_json(),
                "tokens": int(tok[m].sum()),
            }
        total = sum(tokens.values()) or 1
        return {
            "target": self._target(available),
            "tokens": tokens,
            "available": available,
            "achieved": {d: round(t / total, 6) for d, t in tokens.items()},
            "total_tokens": plan.total,
            "languages": languages,
            "sources": sources,
            "notes": plan.notes,
            "unselected_documents": int((pool & (copies == 0)).sum()),
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

    def _stats(self, val, copies) -> dict[str, Any]:
        r = self.rec
        out: dict[str, Any] = {"groups": []}
        for split, weight in (("train", copies), ("val", val.astype(np.int64))):
            for i, s in enumerate(self.recipe.sources):
                m = (weight > 0) & (r.source == i)
                for lang_id in np.unique(r.language[m]).tolist():
                    mm = m & (r.language == lang_id)
                    out["groups"].append(
                        {
                            "split": split,
                            "domain": s.domain,
                            "source": s.name,
                            "language": r.languages[lang_id],
                            "documents": int(weight[mm].sum()),
                            "tokens": int((r.tokens * weight)[mm].sum()),
                        }
                    )
        return out


class PackError(ValueError):
    """The tokenized corpus cannot be packed as the recipe asks (e.g. an empty domain)."""

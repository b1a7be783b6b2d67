"""The manifest's `mix`, `stats` and `counts.dedup` sections of a packed build.

They are sums of the scatter tasks' per-(source, language) summaries (`ScatterTotals`), set
beside the plan and the recipe; the dedup section adds the cluster task's counts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from lemur.data.corpus import Corpus
from lemur.data.pack.plan import PackPlan
from lemur.data.pack.select import Groups
from lemur.data.pack.shuffle import GROUP_FIELDS, ScatterTotals
from lemur.data.recipe.recipe import Recipe
from lemur.data.runs.format import removals, removals_dir

__all__ = ["ManifestSections"]


class ManifestSections:
    """Builds a packed build's manifest sections from what its pack tasks summed.

    `dedup_dir`: the finished dedup tasks' folder (None without dedup), over `n_tasks`
    tokenize tasks; `duplicates`: the `duplicates.jsonl` written, relative to the output.
    """

    def __init__(
        self,
        recipe: Recipe,
        corpus: Corpus,
        plan: PackPlan,
        totals: ScatterTotals,
        dedup_dir: Path | None,
        n_tasks: int,
        duplicates: str | None = None,
    ) -> None:
        self.recipe = recipe
        self.corpus = corpus
        self.plan = plan
        self.totals = totals
        self.dedup_dir = dedup_dir
        self.n_tasks = n_tasks
        self.duplicates = duplicates

    def mix(self) -> dict[str, Any]:
        """The manifest's `mix`: target, tokens by domain, languages, sources, notes."""
        recipe, g, total = self.recipe, Groups.of(self.recipe, self.corpus), self.totals.total
        domains = recipe.domains()
        tokens = {d: total("selected_tokens", lambda s, _, d=d: g.domains[s] == d) for d in domains}
        available = {d: total("pool_tokens", lambda s, _, d=d: g.domains[s] == d) for d in domains}
        sources = {}
        for i, s in enumerate(recipe.sources):
            mine = lambda src, _, i=i: src == i  # noqa: E731
            avail, sel = total("pool_tokens", mine), total("selected_tokens", mine)
            sources[s.name] = {
                "domain": s.domain,
                "available_tokens": avail,
                "tokens": sel,
                "documents": total("selected_docs", mine),
                "copies": total("copies", mine),
                "rate": round(sel / avail, 6) if avail else 0.0,
            }
        languages: dict[str, dict[str, Any]] = {}
        for (d, lang), unit in sorted(self.plan.mix.units.items()):
            got = total(
                "selected_tokens", lambda s, la, d=d, lang=lang: g.groups[s] == d and la == lang
            )
            languages.setdefault(d, {})[lang] = {**unit.to_json(), "tokens": got}
        all_tokens = sum(tokens.values()) or 1
        return {
            "target": self.corpus.mix_target(available),
            "tokens": tokens,
            "available": available,
            "achieved": {d: round(t / all_tokens, 6) for d, t in tokens.items()},
            "total_tokens": self.plan.mix.total,
            "languages": languages,
            "sources": sources,
            "notes": self.plan.mix.notes,
            "unselected_documents": total("pool_docs") - total("selected_docs"),
        }

    def stats(self) -> dict[str, Any]:
        """`stats.json`: documents and tokens per split, domain, source and language."""
        out: dict[str, Any] = {"groups": []}
        fields = {"train": ("copies", "selected_tokens"), "val": ("val_docs", "val_tokens")}
        for split, (docs, toks) in fields.items():
            for (s, lang), v in sorted(self.totals.groups.items()):
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

    def dedup(self) -> dict[str, Any]:
        """`counts.dedup`: documents removed (exact, near, by source), cluster sizes, pairs."""
        if self.dedup_dir is None:
            return {"exact": 0, "near": 0, "by_source": {}, "cluster_sizes": {}}
        exact, near = self.totals.removed_exact, self.totals.removed_near
        by_source = {
            s.name: {"exact": int(exact[i]), "near": int(near[i])}
            for i, s in enumerate(self.recipe.sources)
        }
        summary = json.loads((removals_dir(self.dedup_dir) / "summary.json").read_text())
        return {
            "exact": int(exact.sum()),
            "near": int(near.sum()),
            "by_source": by_source,
            "cluster_sizes": self._cluster_sizes(),
            "candidate_pairs": summary["candidate_pairs"],
            "verified_pairs": summary["verified_pairs"],
            **({"file": self.duplicates} if self.duplicates is not None else {}),
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

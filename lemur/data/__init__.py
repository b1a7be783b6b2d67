"""The corpus build (`lemur-data`): sources -> documents -> tokens -> mixed, shuffled shards.

| module / package | what it holds |
|---|---|
| `build` | `build`, the driver: the output locked, the inputs listed, `STAGES` run |
| `stages/` | the stages, one module each: read, fim, repos, plan, shuffle, commit, export |
| `context` | `BuildContext`: recipe, corpus, tokenizer opened once, stage runner; `BuildError` |
| `recipe/`, `recipe_loader` | the config of every stage (`Recipe`); `load_recipe` |
| `corpus`, `mix` | the kind of corpus (every way a chat build differs); the mix planner |
| `runs/` | the run between stages: token runs, document records, dedup removals (their bytes) |
| `read/` | listing inputs, compressed file streams, checkouts, the sources reader, notebooks |
| `filter/` | base, code and text rules, language tagging, decontamination, PII |
| `dedup/` | signatures (content hash, MinHash) and clusters (LSH) |
| `encode/` | the build's tokenizer (trained or given), chat rendering, the tokenize step |
| `fim/` | the FIM stage: one document's cut, the tasks that rewrite a run |
| `repos/` | repository documents: file order, the repository format, the group stage |
| `pack/` | mix plan, external shuffle, shard writing, the manifest's sections |
| `run/` | datatrove executors, quiet logs, the output lock |
| `labels`, `counts` | stat labels (made and parsed), the manifest's counts assembled from them |
| `stats`, `demo`, `cli` | corpus statistics, the demo recipe, the command |

The names below are importable from `lemur.data` directly; each loads its module on first
use, so importing one stage does not import the whole build.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "BuildError": "context",
    "build": "build",
    "Recipe": "recipe.recipe",
    "RecipeError": "recipe.errors",
    "load_recipe": "recipe_loader",
    "recipe_from_dict": "recipe_loader",
    "demo_recipe": "demo",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

"""The corpus build (`lemur-data`): sources -> documents -> tokens -> mixed, shuffled shards.

| module / package | what it holds |
|---|---|
| `build` | `build`, the driver of every stage, and `BuildError` |
| `recipe`, `load` | every stage's config (`Recipe`); `load_recipe` reads and validates one |
| `read/` | listing inputs, compressed streams, the sources reader, notebooks |
| `filter/` | base, code and text rules, language tagging, decontamination, PII |
| `dedup/` | signatures (content hash, MinHash) and clusters (LSH) |
| `tokenize/` | SentencePiece training and loading, the tokenize step |
| `pack/` | records, mix plan, external shuffle, shard writing |
| `run/` | datatrove executors, quiet logs, the output lock |
| `counts`, `stats`, `demo`, `cli` | stat labels, corpus statistics, the demo recipe, the command |

The names below are importable from `lemur.data` directly; each loads its module on first
use, so importing one stage does not import the whole build.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "BuildError": "build",
    "build": "build",
    "Recipe": "recipe",
    "RecipeError": "recipe",
    "load_recipe": "load",
    "recipe_from_dict": "load",
    "demo_recipe": "demo",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

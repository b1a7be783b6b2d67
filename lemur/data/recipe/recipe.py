"""The build recipe: every stage's config as a typed dataclass, mapped from YAML.

Each section checks its values in its own `__post_init__` (so `Recipe(...)` and
`dataclasses.replace` check them too), and `Recipe` the rules that span sections; every
mistake raises `RecipeError` with a one-line message naming the key, which the CLI prints
before exiting with code 2. `lemur.data.recipe_loader` reads a recipe from YAML and
checks its paths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Re-exported: the recipe's sections are imported from here.
from lemur.data.recipe.classifier import ClassifierConfig as ClassifierConfig
from lemur.data.recipe.classifier import check_classifiers
from lemur.data.recipe.errors import RecipeError as RecipeError
from lemur.data.recipe.executor import ExecutorConfig
from lemur.data.recipe.export import ExportConfig, check_exports
from lemur.data.recipe.filters import BUILTIN_BENCHMARKS as BUILTIN_BENCHMARKS
from lemur.data.recipe.filters import PII_KINDS as PII_KINDS
from lemur.data.recipe.filters import BenchmarkConfig as BenchmarkConfig
from lemur.data.recipe.filters import C4Config as C4Config
from lemur.data.recipe.filters import CodeFilterConfig as CodeFilterConfig
from lemur.data.recipe.filters import DecontaminateConfig, FiltersConfig, PiiConfig
from lemur.data.recipe.filters import FineWebConfig as FineWebConfig
from lemur.data.recipe.filters import GopherQualityConfig as GopherQualityConfig
from lemur.data.recipe.filters import GopherRepetitionConfig as GopherRepetitionConfig
from lemur.data.recipe.filters import TextFiltersConfig as TextFiltersConfig
from lemur.data.recipe.fim import FimConfig
from lemur.data.recipe.repos import ReposConfig
from lemur.data.recipe.sources import CHAT_DOMAIN as CHAT_DOMAIN
from lemur.data.recipe.sources import CHAT_SCHEMAS as CHAT_SCHEMAS
from lemur.data.recipe.sources import FORMATS as FORMATS
from lemur.data.recipe.sources import SOURCE_PRESETS as SOURCE_PRESETS
from lemur.data.recipe.sources import (
    ExcludeConfig,
    SourceConfig,
    StorageOptions,
    check_sources,
)
from lemur.data.recipe.tokenizer import TOKENIZER_ENGINES as TOKENIZER_ENGINES
from lemur.data.recipe.tokenizer import TokenizerConfig
from lemur.data.recipe.tokenizer import TokenizerTrainConfig as TokenizerTrainConfig
from lemur.data.samples.records import SampleSettings


@dataclass(frozen=True)
class DedupConfig:
    """Deduplication settings (recipe `dedup:`); defaults after The Stack's near-dedup."""

    exact: bool = True
    near: bool = True
    ngram: int = 5
    bands: int = 25
    rows: int = 5
    min_similarity: float = 0.75
    seed: int = 42
    write_duplicates: bool = False
    # Bucket tasks of the near-dup stage: each band's keys are split into
    # ceil(bucket_tasks / bands) key ranges (None: one task per band).
    bucket_tasks: int | None = None
    # Memory a bucket task's k-way merge and verification buffers may use.
    merge_buffer_mb: float = 64
    # Bottom-k sketch (shingle hashes kept per document) that verifies candidates whose
    # MinHash estimate is close to min_similarity: exact Jaccard for documents with fewer
    # distinct shingles. 0: verify by the MinHash estimate alone.
    sketch_size: int = 1024

    @property
    def num_perm(self) -> int:
        """Number of MinHash permutations (bands x rows)."""
        return self.bands * self.rows

    def signer_settings(self) -> tuple:
        """The settings the signatures and sorted runs depend on (a tokenize work key part)."""
        return (
            self.exact,
            self.near,
            self.ngram,
            self.bands,
            self.rows,
            self.seed,
            self.sketch_size,
        )

    def __post_init__(self) -> None:
        if self.ngram < 1 or self.bands < 1 or self.rows < 1:
            raise RecipeError("recipe: dedup.ngram, dedup.bands and dedup.rows must be >= 1")
        if self.bucket_tasks is not None and self.bucket_tasks < 1:
            raise RecipeError(f"recipe: dedup.bucket_tasks must be >= 1, got {self.bucket_tasks}")
        if self.sketch_size < 0:
            raise RecipeError(f"recipe: dedup.sketch_size must be >= 0, got {self.sketch_size}")
        if not self.merge_buffer_mb > 0:
            raise RecipeError(
                f"recipe: dedup.merge_buffer_mb must be > 0, got {self.merge_buffer_mb}"
            )
        if not 0 < self.min_similarity <= 1:
            raise RecipeError(
                f"recipe: dedup.min_similarity must be in (0, 1], got {self.min_similarity}"
            )


@dataclass(frozen=True)
class MixConfig:
    """Token budgets: the code:text ratio after filtering, an optional total and shares."""

    ratio: dict[str, float] = field(default_factory=lambda: {"code": 10.0, "text": 1.0})
    preset: str | None = None
    total_tokens: float | None = None
    shares: dict[str, dict[str, float]] | None = None
    max_repeats: float = 1.0
    # Chat builds only: token shares between chat sources ({source name: weight}); without
    # it a chat build takes every kept conversation once (`ratio` does not apply to chat).
    weights: dict[str, float] | None = None
    # Budgeted reading (lemur/data/budget.py, docs/scale.md): read only the units of a
    # source its domain's budget needs. Unset means off (and keeps older recipes' hashes).
    budgeted_reading: bool | None = None
    read_margin: float | None = None  # units read for need x margin (default 1.3)
    sample_fraction: float | None = None  # units per source sampled to estimate (0.02)

    def __post_init__(self) -> None:
        # Written so that NaN fails: every comparison with NaN is false.
        for d, r in self.ratio.items():
            # 0 is allowed: the domain gives val shards but no train tokens (a one-domain
            # arm of a ratio sweep keeps the other domain's held-out set).
            if not r >= 0:
                raise RecipeError(f"recipe: mix.ratio.{d} must be >= 0, got {r}")
        # Each weight is finite (typed_yaml), but their sum may not be (1e308 twice): every
        # domain's share would then be 0 and the mix planner fail after the tokenize pass.
        if not math.isfinite(sum(self.ratio.values())):
            raise RecipeError(
                f"recipe: mix.ratio's weights sum to infinity ({self.ratio}): use smaller numbers"
            )
        if self.total_tokens is not None and not self.total_tokens > 0:
            raise RecipeError("recipe: mix.total_tokens must be > 0")
        if not self.max_repeats >= 1:
            raise RecipeError("recipe: mix.max_repeats must be >= 1")
        for name, w in (self.weights or {}).items():
            if not w > 0:
                raise RecipeError(f"recipe: mix.weights.{name} must be > 0, got {w}")
        if self.read_margin is not None and not self.read_margin >= 1:
            raise RecipeError(f"recipe: mix.read_margin must be >= 1, got {self.read_margin}")
        if self.sample_fraction is not None and not 0 < self.sample_fraction <= 1:
            raise RecipeError(
                f"recipe: mix.sample_fraction must be in (0, 1], got {self.sample_fraction}"
            )
        for d, per in (self.shares or {}).items():
            for lang, share in per.items():
                if not 0 <= share <= 1:
                    raise RecipeError(
                        f"recipe: mix.shares.{d}.{lang} must be in [0, 1], got {share}"
                    )
            if sum(per.values()) > 1 + 1e-9:
                raise RecipeError(f"recipe: mix.shares.{d} sum to {sum(per.values()):.4f} > 1")


# The values of `chat.long`: the one list (tokenize/chat.py's ChatStep checks its argument too).
CHAT_LONG = ("truncate", "drop")


@dataclass(frozen=True)
class ChatConfig:
    """Chat builds (sources of `format: chat`): what to do with conversations over seq_len.

    `long: truncate` cuts a conversation at the end of the last assistant turn that fits
    (dropping it when not even the first exchange fits); `drop` drops it. Both are counted.
    `demo_data`: a path where `lemur-data build` first writes the built-in demo
    conversations (lemur/data/chat_demo.py) when it is missing (recipes/chat-demo.yaml).
    """

    long: str = "truncate"
    demo_data: str | None = None

    def __post_init__(self) -> None:
        if self.long not in CHAT_LONG:
            raise RecipeError(
                f"recipe: chat.long {self.long!r} is not one of {', '.join(CHAT_LONG)}"
            )


@dataclass(frozen=True)
class InspectConfig:
    """What the build keeps for `lemur-data inspect` (`<build>/samples/`): up to `per_reason`
    documents per source and drop reason (and per source and language kept, per cluster
    kind, ...), each text capped at `max_bytes` UTF-8 bytes; picked by the recipe's seed."""

    enabled: bool = True
    per_reason: int = 20
    max_bytes: int = 8192

    def __post_init__(self) -> None:
        if self.per_reason < 1:
            raise RecipeError(f"recipe: inspect.per_reason must be >= 1, got {self.per_reason}")
        if self.max_bytes < 64:
            raise RecipeError(f"recipe: inspect.max_bytes must be >= 64, got {self.max_bytes}")

    def settings(self, seed: int) -> SampleSettings:
        """The samples' settings for a build of `seed`."""
        return SampleSettings(self.per_reason, self.max_bytes, seed)


@dataclass(frozen=True)
class Recipe:
    """A whole `lemur-data build` recipe."""

    output: str
    sources: list[SourceConfig]
    tokenizer: TokenizerConfig
    seed: int = 1234
    seq_len: int = 4096
    mix: MixConfig = field(default_factory=MixConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontaminate: DecontaminateConfig = field(default_factory=DecontaminateConfig)
    pii: PiiConfig = field(default_factory=PiiConfig)
    rejects: str | None = None
    inspect: InspectConfig = field(default_factory=InspectConfig)
    # Where the build keeps its work (tokenizer, token runs, dedup, shuffle); default
    # `<output>/.work`. Builds of one recipe into different outputs that differ only in the
    # mix (or the pack settings) share the read/filter/dedup/tokenize work through it.
    work_dir: str | None = None
    chat: ChatConfig | None = None
    val_fraction: float = 0.005
    shard_tokens: int = 1 << 27
    tokenize_batch_docs: int = 256
    # Repository documents (lemur/data/repos/); None: one document per file.
    repos: ReposConfig | None = None
    # Fill-in-the-middle documents of code sources (recipe/fim.py); None: none.
    fim: FimConfig | None = None
    # `output.provenance`: a documents.parquet per shard (lemur/data/runs/provenance.py);
    # unset is off (and keeps older recipes' hashes). In YAML, `output: {path, provenance}`.
    provenance: bool | None = None
    # Repositories, paths and document ids dropped at read (recipe/sources.py ExcludeConfig).
    exclude: ExcludeConfig | None = None

    # `export:` formats written from the finished shards (lemur/data/stages/exporting.py);
    # not part of the build's identity (`sha256`, the build folder's name). None: none.
    export: list[ExportConfig] | None = None

    def __post_init__(self) -> None:
        # The sections checked themselves; these checks span several of them.
        _check_outputs(self)
        check_sources(self.sources)
        check_classifiers(self.filters.classifier or [], self.sources)
        _check_chat(self)
        _check_repos(self)
        if not self.is_chat():  # the code:text ratio and language shares do not apply to chat
            _check_mix_domains(self)
        _check_sizes(self)
        check_exports(self.export or [], self.output)
        _check_fim(self)

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain data (what `--dry-run` prints and the manifest stores)."""
        return _strip_none(dataclasses.asdict(self))

    def sha256(self) -> str:
        """Hash of the resolved recipe, stored in the manifest."""
        # Exports are written from the shards, not into them: adding one rebuilds nothing.
        settings = {k: v for k, v in self.to_dict().items() if k != "export"}
        blob = json.dumps(settings, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def work_root(self) -> Path:
        """The build's work directory: `work_dir`, else `<output>/.work`."""
        if self.work_dir is not None:
            return Path(self.work_dir).expanduser()
        return Path(self.output).expanduser() / ".work"

    def is_chat(self) -> bool:
        """A chat build: its sources are conversations (ChatML tokens with loss masks)."""
        return any(s.format == "chat" for s in self.sources)

    def chat_settings(self) -> ChatConfig:
        """The `chat:` section, defaults filled in."""
        return self.chat or ChatConfig()

    def domains(self) -> list[str]:
        """Domains in the order their first source appears."""
        return list(dict.fromkeys(s.domain for s in self.sources))

    def repo_sources(self) -> list[int]:
        """Indexes of the sources whose files become repository documents (none without
        `repos:`): the listed ones, else every code source."""
        if self.repos is None:
            return []
        names = self.repos.sources
        return [
            i
            for i, s in enumerate(self.sources)
            if (s.name in names if names is not None else s.domain == "code")
        ]


def _strip_none(obj: Any) -> Any:
    if isinstance(obj, StorageOptions):  # credentials are never shown or written
        return obj.public()
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj]
    return obj


def _check_outputs(recipe: Recipe) -> None:
    """Output directories are never empty (that would be the current directory)."""
    for key, value in (
        ("output", recipe.output),
        ("rejects", recipe.rejects),
        ("work_dir", recipe.work_dir),
    ):
        if value is not None and not value.strip():
            raise RecipeError(f"recipe: {key} is empty")


def _check_chat(recipe: Recipe) -> None:
    """A chat build takes only chat sources; `mix.weights` and `chat:` only apply to one."""
    mix = recipe.mix
    if not recipe.is_chat():
        if mix.weights is not None:
            raise RecipeError("recipe: mix.weights is for chat builds (sources of format chat)")
        if recipe.chat is not None:
            raise RecipeError("recipe: chat: applies only to builds of chat sources")
        return
    for i, s in enumerate(recipe.sources):
        if s.format != "chat":
            raise RecipeError(
                f"recipe: sources[{i}] '{s.name}' is format {s.format!r}: a chat build takes only "
                f"chat sources (build pre-training and chat corpora separately)"
            )
    names = [s.name for s in recipe.sources]
    for name in mix.weights or {}:
        if name not in names:
            raise RecipeError(f"recipe: mix.weights.{name}: no chat source is named '{name}'")
    if mix.weights and len(mix.weights) < len(names):
        missing = next(n for n in names if n not in mix.weights)
        raise RecipeError(f"recipe: mix.weights has no entry for source '{missing}'")
    if not mix.weights and mix.total_tokens is not None:
        raise RecipeError("recipe: mix.total_tokens in a chat build needs mix.weights")


def _check_repos(recipe: Recipe) -> None:
    """`repos:` names code sources, and is for pre-training builds without duplicate dumps."""
    repos = recipe.repos
    if repos is None:
        return
    if recipe.is_chat():
        raise RecipeError("recipe: repos: applies to code sources, not to a chat build")
    if recipe.dedup.write_duplicates:
        raise RecipeError(
            "recipe: repos: and dedup.write_duplicates cannot be combined (duplicates are "
            "removed per file before grouping; set dedup.write_duplicates: false)"
        )
    by_name = {s.name: s for s in recipe.sources}
    for name in repos.sources or ():
        if name not in by_name:
            raise RecipeError(f"recipe: repos.sources: no source is named '{name}'")
        if by_name[name].domain != "code":
            raise RecipeError(f"recipe: repos.sources: '{name}' is not a code source")
    if not recipe.repo_sources():
        raise RecipeError("recipe: repos: there is no code source to group")


def _check_mix_domains(recipe: Recipe) -> None:
    """`mix.ratio` has one entry per domain of the sources, one above 0; shares name domains."""
    domains = recipe.domains()
    ratio = recipe.mix.ratio
    for d in ratio:
        if d not in domains:
            raise RecipeError(f"recipe: mix.ratio.{d}: no source has domain '{d}'")
    for d in domains:
        if d not in ratio:
            raise RecipeError(f"recipe: mix.ratio has no entry for domain '{d}'")
    if not any(r > 0 for r in ratio.values()):
        raise RecipeError("recipe: mix.ratio needs at least one domain above 0")
    for d in recipe.mix.shares or {}:
        if d not in domains:
            raise RecipeError(f"recipe: mix.shares.{d}: no source has domain '{d}'")


def _check_sizes(recipe: Recipe) -> None:
    """Sequence length, val fraction, shard and batch sizes."""
    if recipe.seq_len < 1:
        raise RecipeError(f"recipe: seq_len must be >= 1, got {recipe.seq_len}")
    if not 0 <= recipe.val_fraction < 0.5:
        raise RecipeError(f"recipe: val_fraction must be in [0, 0.5), got {recipe.val_fraction}")
    if recipe.shard_tokens < 1024:
        raise RecipeError("recipe: shard_tokens must be >= 1024")
    if recipe.tokenize_batch_docs < 1:
        raise RecipeError("recipe: tokenize_batch_docs must be >= 1")


def _check_fim(recipe: Recipe) -> None:
    """`fim:` applies to pre-training builds, to domains their sources have."""
    if recipe.fim is None:
        return
    if recipe.is_chat():
        raise RecipeError("recipe: fim: applies to code documents of pre-training builds, not chat")
    domains = recipe.domains()
    for d in recipe.fim.domains:
        if d not in domains:
            raise RecipeError(f"recipe: fim.domains: no source has domain '{d}'")

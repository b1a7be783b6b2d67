"""The recipe's `filters.classifier` list: fastText quality classifiers run as a build stage
(lemur/data/filter/classifier.py; docs/filters.md#quality-classifiers)."""

from __future__ import annotations

from dataclasses import dataclass

from lemur.data.recipe.errors import RecipeError
from lemur.data.recipe.sources import NAME_RE, SourceConfig

LABEL_PREFIX = "__label__"  # fastText's default label prefix


@dataclass(frozen=True)
class ClassifierConfig:
    """One fastText classifier: its model, the label scored, the cut, the text it reads.

    `min_score` keeps documents whose probability of `label` is at least it; `keep_top`
    keeps that fraction of each source, by a threshold taken from a seeded sample of
    `sample_docs` documents per source; neither only writes the score. `newline` replaces
    each line break before scoring (fastText reads one line; DCLM joins lines with a space,
    datatrove's filter with nothing), `lowercase` lower-cases the text first.
    """

    name: str
    model: str
    label: str = "hq"
    min_score: float | None = None
    keep_top: float | None = None
    domains: list[str] | None = None  # None: every domain
    sources: list[str] | None = None  # None: every source of those domains
    newline: str = " "
    lowercase: bool = False
    sample_docs: int = 20_000

    def __post_init__(self) -> None:
        key = f"filters.classifier '{self.name}'"
        if not NAME_RE.match(self.name):
            raise RecipeError(
                f"recipe: filters.classifier name {self.name!r} must be letters, digits, _ . -"
            )
        if not self.model.strip():
            raise RecipeError(f"recipe: {key}: model is empty")
        if not self.label.removeprefix(LABEL_PREFIX):
            raise RecipeError(f"recipe: {key}: label is empty")
        if self.min_score is not None and self.keep_top is not None:
            raise RecipeError(f"recipe: {key}: give min_score or keep_top, not both")
        # Written so that NaN fails: every comparison with NaN is false.
        if self.min_score is not None and not 0 <= self.min_score <= 1:
            raise RecipeError(f"recipe: {key}: min_score must be in [0, 1], got {self.min_score}")
        if self.keep_top is not None and not 0 < self.keep_top <= 1:
            raise RecipeError(f"recipe: {key}: keep_top must be in (0, 1], got {self.keep_top}")
        if self.sample_docs < 1:
            raise RecipeError(f"recipe: {key}: sample_docs must be >= 1, got {self.sample_docs}")
        if "\n" in self.newline:
            raise RecipeError(f"recipe: {key}: newline must not contain a line break")

    @property
    def fasttext_label(self) -> str:
        """The label as the model spells it (`hq` -> `__label__hq`)."""
        return LABEL_PREFIX + self.label.removeprefix(LABEL_PREFIX)

    def applies(self, source: SourceConfig) -> bool:
        """Whether this classifier judges the documents of `source`."""
        return (self.domains is None or source.domain in self.domains) and (
            self.sources is None or source.name in self.sources
        )


def check_classifiers(classifiers: list[ClassifierConfig], sources: list[SourceConfig]) -> None:
    """Unique names; listed domains and sources exist; each classifier judges some source."""
    names: set[str] = set()
    domains = {s.domain for s in sources}
    source_names = {s.name for s in sources}
    for c in classifiers:
        key = f"recipe: filters.classifier '{c.name}'"
        if c.name in names:
            raise RecipeError(f"{key}: the name is used twice")
        names.add(c.name)
        for d in c.domains or []:
            if d not in domains:
                raise RecipeError(f"{key}: domains: no source has domain '{d}'")
        for s in c.sources or []:
            if s not in source_names:
                raise RecipeError(f"{key}: sources: no source is named '{s}'")
        if not any(c.applies(s) for s in sources):
            raise RecipeError(f"{key}: no source has both a listed domain and a listed name")

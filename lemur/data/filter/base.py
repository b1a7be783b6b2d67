"""Document filters: each a small datatrove filter with an exact drop reason.

Drops are counted twice: by datatrove as `dropped_<reason>` and by us as
`dropped:<source>:<reason>`, so the manifest can report drops per source. A rule that
drops says why with a `Dropped` verdict (lemur/data/samples/records.py): still
`(False, reason)` to datatrove, with the measured value, the comparison and the threshold,
which the build's samples (`samples`, set when `inspect:` is on) and `rejects:` records
(`metadata.filter_value`, `filter_threshold`, `filter_op`, `filter_rule`) keep.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter, get_filter_result

from lemur.data.labels import dropped_label
from lemur.data.samples.drops import DropSamples
from lemur.data.samples.records import Dropped


class LemurFilter(BaseFilter):
    """A datatrove filter that also counts its drops per source."""

    # The build's samples of this filter's drops (None: `inspect:` off, or used alone).
    samples: DropSamples | None = None

    def __init__(self, exclusion_writer: Any = None) -> None:
        super().__init__(exclusion_writer)

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        """Filter a batch, recording `dropped:<source>:<reason>` for every drop (and, when
        kept, what tripped the rule: samples, `rejects:` metadata)."""
        results = [self.filter(doc) for doc in batch]
        for doc, res in zip(batch, results, strict=True):
            keep, reason = get_filter_result(res)
            if not keep:
                source = doc.metadata.get("source", "?")
                self.stat_update(dropped_label(source, reason or self.name))
                self.record_drop(doc, reason or self.name, res)
        return results

    def record_drop(self, doc: Document, reason: str, result: Any) -> None:
        """Keep what tripped the rule: in the samples, and in the metadata `rejects:` writes."""
        if self.exclusion_writer is not None and isinstance(result, Dropped):
            for key, value in result.fields().items():
                doc.metadata[f"filter_{key}"] = value
        if self.samples is not None:
            self.samples.drop(doc, reason, result)

    def run(self, data: Any, rank: int = 0, world_size: int = 1) -> Any:
        """datatrove's filtering; with samples, the task's part file when it ends."""
        if self.samples is None:
            yield from super().run(data, rank, world_size)
            return
        self.samples.start()
        yield from super().run(data, rank, world_size)
        self.samples.write(rank)


class DomainFilter(LemurFilter):
    """A filter that only judges documents of some domains (e.g. text rules skip code)."""

    def __init__(self, domains: tuple[str, ...], exclusion_writer: Any = None) -> None:
        super().__init__(exclusion_writer)
        self.domains = frozenset(domains)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        """Pass documents of other domains through; judge the rest with `check`."""
        if doc.metadata.get("domain") not in self.domains:
            return True
        return self.check(doc)

    @abstractmethod
    def check(self, doc: Document) -> bool | tuple[bool, str]:
        """Keep (True) or drop with a reason ((False, reason)) a document of our domains."""


class EmptyDocumentFilter(LemurFilter):
    """Drops documents with no non-whitespace text (reason `empty`)."""

    name = "🫙 empty"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        """Keep a document unless it is empty or whitespace only."""
        if not doc.text.strip():
            return Dropped("empty", "non_whitespace_chars", 0, "==", 0)
        return True


class LanguageFilter(LemurFilter):
    """Keeps only documents whose source lists their language (reason `language`)."""

    name = "🌐 language"

    def __init__(self, languages_by_source: dict[str, list[str]]) -> None:
        super().__init__()
        self.languages_by_source = {k: set(v) for k, v in languages_by_source.items()}

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        """Keep a document if its source has no `languages` list or its tag is in it."""
        allowed = self.languages_by_source.get(doc.metadata.get("source", ""))
        language = doc.metadata.get("language")
        if allowed is not None and language not in allowed:
            score = doc.metadata.get("language_score")
            shown = f"{score:.2f}" if isinstance(score, float) else ""
            return Dropped("language", "language", language, "not in", sorted(allowed), shown)
        return True

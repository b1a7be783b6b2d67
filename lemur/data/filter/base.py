"""Document filters: each a small datatrove filter with an exact drop reason.

Drops are counted twice: by datatrove as `dropped_<reason>` and by us as
`dropped:<source>:<reason>`, so the manifest can report drops per source.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter, get_filter_result

from lemur.data.labels import dropped_label


class LemurFilter(BaseFilter):
    """A datatrove filter that also counts its drops per source."""

    def __init__(self, exclusion_writer: Any = None) -> None:
        super().__init__(exclusion_writer)

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        """Filter a batch, recording `dropped:<source>:<reason>` for every drop."""
        results = [self.filter(doc) for doc in batch]
        for doc, res in zip(batch, results, strict=True):
            keep, reason = get_filter_result(res)
            if not keep:
                source = doc.metadata.get("source", "?")
                self.stat_update(dropped_label(source, reason or self.name))
        return results


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
            return False, "empty"
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
        if allowed is not None and doc.metadata.get("language") not in allowed:
            return False, "language"
        return True

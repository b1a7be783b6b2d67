"""Tagging, filtering and redacting documents: code and text quality rules, languages,
benchmark decontamination and PII redaction.

Taggers only write metadata; filters return `True` or `(False, reason)` through
`LemurFilter`, which counts every drop under its reason.
"""

from lemur.data.filter.base import DomainFilter, EmptyDocumentFilter, LanguageFilter, LemurFilter
from lemur.data.filter.code import CodeRule, code_filters
from lemur.data.filter.decontaminate import DecontaminationFilter, decontamination_filter
from lemur.data.filter.pii import PiiRedactor, redact
from lemur.data.filter.tagging import LanguageTagger, code_language, mix_language
from lemur.data.filter.text import (
    C4Filter,
    FineWebFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
    TextRule,
)

__all__ = [
    "C4Filter",
    "CodeRule",
    "DecontaminationFilter",
    "DomainFilter",
    "EmptyDocumentFilter",
    "FineWebFilter",
    "GopherQualityFilter",
    "GopherRepetitionFilter",
    "LanguageFilter",
    "LanguageTagger",
    "LemurFilter",
    "PiiRedactor",
    "TextRule",
    "code_filters",
    "code_language",
    "decontamination_filter",
    "mix_language",
    "redact",
]

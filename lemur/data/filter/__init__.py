"""Filters and redactors of the build: benchmark decontamination and PII redaction."""

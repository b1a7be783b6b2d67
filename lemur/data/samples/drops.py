"""A filter's samples: its drops per (source, reason), each with the value that tripped
the rule; decontamination hits; a classifier's score histogram and borderline documents.

A filter holds a `DropSamples` (set by the build when `inspect:` is on, like datatrove's
`exclusion_writer`), starts it when its task starts and writes it when the task ends.
Texts of documents that the build would redact (PII) are shown redacted: `scrub`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from datatrove.data import Document

from lemur.data.samples.collect import SCORE_EDGES, TaskSamples
from lemur.data.samples.records import (
    DECONTAMINATION,
    DROPS,
    SampleSettings,
    capped,
    verdict_fields,
)

# (text, document id, domain) -> the text as the samples may show it.
Scrub = Callable[[str, str, str], str]
BORDERLINE = "classifier_borderline"
EXCERPT_CHARS = 300  # characters either side of a decontamination hit
# A sample shows a text's first `max_bytes`, redacted. A text longer than that and this
# margin is redacted only as far: a rejected 10 MB file costs a redaction of 16 KiB, not of
# 10 MB (it was most of what `inspect:` cost a build), and a secret that starts inside the
# shown part ends inside the margin (a PEM key block is under 4 KiB), so it is found whole.
SCRUB_MARGIN = 8192


def _source(doc: Document) -> str:
    return str(doc.metadata.get("source", "?"))


class DropSamples:
    """One filter's samples in its tasks' part files under `folder`."""

    def __init__(self, settings: SampleSettings, folder: str, scrub: Scrub | None = None) -> None:
        self.settings, self.folder, self.scrub = settings, folder, scrub
        self.task: TaskSamples | None = None

    def start(self) -> TaskSamples:
        """A task starts: its samples begin empty."""
        self.task = TaskSamples(self.settings, self.folder)
        return self.task

    @property
    def current(self) -> TaskSamples:
        """This task's samples (a filter used alone starts them on first use)."""
        return self.task or self.start()

    def shown(self, doc: Document, text: str | None = None) -> str:
        """The text of `doc` (or a piece of it) as the samples may show it."""
        text = doc.text if text is None else text
        if self.scrub is None:
            return text
        return self.scrub(text, str(doc.id), str(doc.metadata.get("domain", "")))

    def shown_capped(self, doc: Document) -> dict[str, Any]:
        """`{"text", "cut", "bytes"}` of `doc` as a sample shows it: redacted and capped.
        `bytes` is the redacted text's size, or, for a text longer than the cap and
        `SCRUB_MARGIN` (redacted only that far), the document's own."""
        text, limit = doc.text, self.settings.max_bytes + SCRUB_MARGIN
        if self.scrub is None or len(text) <= limit:  # (characters: at most its bytes)
            return capped(self.shown(doc), self.settings.max_bytes)
        head = capped(self.shown(doc, text[:limit]), self.settings.max_bytes)
        return {**head, "cut": True, "bytes": len(text.encode("utf-8", "surrogatepass"))}

    def drop(self, doc: Document, reason: str, result: Any) -> None:
        """Offer a dropped document to its (source, reason) sample, with its verdict."""
        task, source = self.current, _source(doc)

        def record() -> dict[str, Any]:
            return {
                "source": source,
                "reason": reason,
                "id": str(doc.id),
                **self.shown_capped(doc),
                **verdict_fields(result),
            }

        rank = task.seeded(DROPS, source, reason, str(doc.id))
        task.offer(DROPS, (source, reason), rank, record)

    def hit(
        self, doc: Document, benchmark: str, ngram: str, task_id: Callable[[], str | None]
    ) -> None:
        """Offer a decontamination hit: an excerpt around the n-gram, the n-gram, and the
        benchmark task (`task_id()`, asked only for a hit the sample keeps)."""
        task, source = self.current, _source(doc)

        def record() -> dict[str, Any]:
            at = max(doc.text.lower().find(ngram.split(" ")[0]), 0) if ngram else 0
            piece = doc.text[max(at - EXCERPT_CHARS, 0) : at + len(ngram) + EXCERPT_CHARS]
            return {
                "source": source,
                "id": str(doc.id),
                "excerpt": task.text(self.shown(doc, piece))["text"],
                "ngram": ngram,
                "task_id": task_id(),
                "benchmark": benchmark,
            }

        rank = task.seeded(DECONTAMINATION, source, benchmark, str(doc.id))
        task.offer(DECONTAMINATION, (source, benchmark), rank, record)

    def score(self, name: str, doc: Document, score: float, cut: float | None) -> None:
        """Count a classifier's score in its histogram; offer the document to those nearest
        its cut."""
        task, source = self.current, _source(doc)
        task.histogram(("histograms", "classifier", name), SCORE_EDGES, score)
        if cut is None:
            return
        task.note("cuts", f"{name}\x1f{source}", cut)

        def record() -> dict[str, Any]:
            return {"id": str(doc.id), "source": source, "score": score, **self.shown_capped(doc)}

        rank = [round(abs(score - cut), 9), task.seeded(BORDERLINE, name, str(doc.id))]
        task.offer(BORDERLINE, (name,), rank, record)

    def write(self, rank: int) -> None:
        """The task ended: write its part file."""
        self.current.write(rank)
        self.task = None

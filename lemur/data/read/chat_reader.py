"""The chat reader: jsonl or parquet rows of a chat schema, one document per conversation.

A document keeps the conversation's checked messages in its metadata (`MESSAGES_KEY`), for
the tokenize stage to render once in the model's format; its text is their ChatML
rendering, what the tagger and the filters read (lemur/data/read/chat.py).

Each row schema (`messages`, `sharegpt`, `openorca`, `alpaca`) gives one conversation per
row. `oasst1` is a table of messages whose trees span rows, so each file is grouped whole
(its rows' few fields held in memory): a tree split over two files is not joined up (a task
reads whole files, each on its own); the replies whose root is in another file are counted
per file as dropped conversations (`chat:orphan:<file>`), so no row goes uncounted.
A conversation that cannot be trained on is counted as read and dropped under its reason
(`dropped:<source>:chat:<reason>`); malformed lines are logged as by the jsonl reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from datatrove.data import Document

from lemur.chatml import render_chatml
from lemur.data.labels import dropped_label, read_label, repaired_label
from lemur.data.read.chat import (
    MESSAGES_KEY,
    OASST_COLUMNS,
    ChatDrop,
    Message,
    group_oasst1,
    normalize_row,
    oasst1_messages,
    oasst1_orphans,
    orphan_reason,
)
from lemur.data.read.compressed import is_parquet
from lemur.data.read.listing import InputFile
from lemur.data.read.readers import (
    BaseReader,
    JsonlReader,
    ParquetReader,
    ReadLog,
    RepairedRow,
    Row,
)
from lemur.data.recipe.sources import SourceConfig

# The fields each schema reads (parquet reads only these columns, plus id and metadata).
SCHEMA_FIELDS: dict[str, tuple[str, ...]] = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "openorca": ("system_prompt", "question", "response"),
    "alpaca": ("instruction", "input", "output"),
    "oasst1": OASST_COLUMNS,
}


class ChatParquetReader(ParquetReader):
    """Parquet rows with the columns of the source's chat schema (no text column)."""

    def columns(self, f: InputFile, names: set[str]) -> list[str] | None:
        """The schema's columns the file has, with id and metadata columns."""
        source = self.sources[f.source]
        wanted = set(SCHEMA_FIELDS[str(source.schema)]) & names
        return sorted(wanted | set(self.meta_columns(source, names)))


class ChatReader(BaseReader):
    """Chat conversations from jsonl (plain/.gz/.zst) or parquet, one document each."""

    def __init__(self, sources: list[SourceConfig], log: ReadLog) -> None:
        super().__init__(sources, log)
        self.jsonl = JsonlReader(sources, log)
        self.parquet = ChatParquetReader(sources, log)

    def rows(self, f: InputFile) -> Iterator[tuple[int, Row]]:
        """(line or row number, row) of the file's good rows."""
        reader = self.parquet if is_parquet(f.open_path) else self.jsonl
        return reader.rows(f)

    def drop(self, f: InputFile, reason: str) -> None:
        """Count one conversation read and dropped for `reason`."""
        name = self.sources[f.source].name
        self.log.stat_update(read_label(name))
        self.log.stat_update(dropped_label(name, reason))

    def chat_doc(
        self,
        f: InputFile,
        messages: list[Message],
        doc_id: str,
        extra: dict[str, Any],
        line: int | None = None,
    ) -> Document | None:
        """The document of checked messages: their ChatML text, the messages in metadata
        (None, counted, when the recipe's `exclude:` lists name it)."""
        meta = self.metadata(f, {**extra, MESSAGES_KEY: messages}, line)
        if self.excluded(f, doc_id, meta):
            return None
        return self.emit(f, render_chatml(messages)[0], doc_id, meta)

    def read(self, f: InputFile) -> Iterator[Document]:
        """One document per conversation the file holds."""
        source = self.sources[f.source]
        if source.schema == "oasst1":
            yield from self._read_oasst1(f, source)
            return
        for line, row in self.rows(f):
            try:
                messages = normalize_row(str(source.schema), row)
            except ChatDrop as e:
                self.drop(f, e.reason)
                continue
            if isinstance(row, RepairedRow):  # counted once it makes a conversation
                self.log.stat_update(repaired_label(source.name, row.kind))
            doc = self.chat_doc(
                f, messages, self.row_id(f, row, line), self.row_metadata(row, source), line
            )
            if doc is not None:
                yield doc

    def _read_oasst1(self, f: InputFile, source: SourceConfig) -> Iterator[Document]:
        """One document per tree root of the file (trees are grouped within the file)."""
        keep = set(OASST_COLUMNS) | {source.id_key, source.path_key, source.language_key}
        keep |= {"language", *(source.metadata_keys or ())}
        # Only the fields we use: a file's rows sit in memory together until grouped.
        rows = []
        for _, row in self.rows(f):
            if isinstance(row, RepairedRow):  # a message of a tree: counted as it is read
                self.log.stat_update(repaired_label(source.name, row.kind))
            rows.append({k: v for k, v in row.items() if k in keep})
        roots, replies = group_oasst1(rows)
        languages = set(source.languages) if source.languages else None
        for root in roots:
            try:
                messages = oasst1_messages(root, replies, languages)
            except ChatDrop as e:
                self.drop(f, e.reason)
                continue
            meta = self.row_metadata(root, source)
            doc = self.chat_doc(f, messages, str(root["message_id"]), meta)
            if doc is not None:
                yield doc
        # Each group of replies no root here reaches: one conversation read and dropped.
        for _ in oasst1_orphans(rows, replies):
            self.drop(f, orphan_reason(f.rel))

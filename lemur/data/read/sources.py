"""The reader step: every source of a recipe, any format, as one datatrove step.

One `SourcesReader` step reads every source so that a datatrove executor can spread all
input files over its tasks (`files[rank::world_size]`). It hands each file to the reader
of its source's format (`readers`, `chat_reader`), all sharing the task's `ReadLog`.
"""

from __future__ import annotations

from collections.abc import Iterator

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from lemur.data.read.chat_reader import ChatReader
from lemur.data.read.exclude import Exclusions
from lemur.data.read.listing import InputFile
from lemur.data.read.readers import (
    MAX_ERRORS_PER_TASK,
    BaseReader,
    FilesReader,
    JsonlReader,
    ParquetReader,
    ReadLog,
)
from lemur.data.read.stack_v2 import StackV2Reader
from lemur.data.recipe.sources import SourceConfig

__all__ = ["MAX_ERRORS_PER_TASK", "SourcesReader"]
READERS: dict[str, type[BaseReader]] = {
    "jsonl": JsonlReader,
    "parquet": ParquetReader,
    "files": FilesReader,
    "chat": ChatReader,
    "stack-v2": StackV2Reader,
}


class SourcesReader(PipelineStep):
    """Reads the recipe's input files assigned to this task and yields Documents.

    Bad input never stops the task: a bad line or file is skipped, counted as a stat
    (`error_<kind>`) and written to `errors_dir/{rank:05d}.jsonl` with file and line (the
    first MAX_ERRORS_PER_TASK of them); `{rank:05d}.files.json` has every file's total.
    """

    name = "📖 lemur sources"
    type = "📖 - READER"

    def __init__(
        self,
        inputs: list[InputFile],
        sources: list[SourceConfig],
        errors_dir: str,
        exclusions: Exclusions | None = None,
    ):
        super().__init__()
        self.inputs = inputs
        self.sources = sources
        self.errors_dir = errors_dir
        # The recipe's `exclude:` lists: documents dropped as they are read (exclude.py).
        self.log = ReadLog(sources, self.stat_update, exclusions)
        self.readers = {fmt: cls(sources, self.log) for fmt, cls in READERS.items()}

    def read(self, f: InputFile) -> Iterator[Document]:
        """Documents of one input file."""
        if f.error:  # found while listing, e.g. an unreadable directory
            self.log.error("unreadable", f, f.error)
            return iter(())
        return self.readers[self.sources[f.source].format].read(f)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1):
        """Yield this task's documents, then write its error log."""
        self.log.clear()
        for f in self.inputs[rank::world_size]:
            yield from self.read(f)
        self.log.write(self.errors_dir, rank)

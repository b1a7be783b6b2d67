"""Reading the build's inputs: listing files, opening compressed streams, one reader step.

`list_inputs` lists a recipe's files, big ones as several parts (`split`); `SourcesReader`
turns them into documents with one reader per format (`readers`: jsonl, parquet, file trees
and notebooks; `chat_reader`: chat schemas normalized by `chat`; `stack_v2`: The
Stack v2 by blob id), counting and recording every bad input. Inputs given as fsspec URLs
(`s3://`, `gs://`, `hf://`) are listed once per build (`remote_listing`) and read by ranged
requests with retries (`remote`, `remote_inputs`).

The names below load their module on first use: the package imports none of its modules,
so a module below the readers (lemur/data/counts.py, which names `Listing`) can import one
of them without the reader step, which counts with it.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "InputFile": "listing",
    "Listing": "listing",
    "NotebookError": "notebooks",
    "SourcesReader": "sources",
    "UnsupportedInput": "compressed",
    "display_name": "listing",
    "list_inputs": "listing",
    "looks_like_notebook": "notebooks",
    "notebook_to_script": "notebooks",
    "open_maybe_compressed": "compressed",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

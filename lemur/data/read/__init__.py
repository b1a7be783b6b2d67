"""Reading the build's inputs: listing files, opening compressed streams, one reader step.

`list_inputs` lists a recipe's files, big ones as several parts (`split`); `SourcesReader`
turns them into documents with one reader per format (`readers`: jsonl, parquet, file trees
and notebooks; `chat_reader`: chat schemas rendered as ChatML by `chat`; `stack_v2`: The
Stack v2 by blob id), counting and recording every bad input. Inputs given as fsspec URLs
(`s3://`, `gs://`, `hf://`) are listed once per build (`remote_listing`) and read by ranged
requests with retries (`remote`, `remote_inputs`).
"""

from lemur.data.read.chat import render_chatml
from lemur.data.read.listing import InputFile, Listing, display_name, list_inputs
from lemur.data.read.notebooks import NotebookError, looks_like_notebook, notebook_to_script
from lemur.data.read.sources import SourcesReader
from lemur.data.read.streams import UnsupportedInput, open_maybe_compressed

__all__ = [
    "InputFile",
    "Listing",
    "NotebookError",
    "SourcesReader",
    "UnsupportedInput",
    "display_name",
    "list_inputs",
    "looks_like_notebook",
    "notebook_to_script",
    "open_maybe_compressed",
    "render_chatml",
]

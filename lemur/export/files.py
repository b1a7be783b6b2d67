"""What the zero-copy formats share: a shard's bytes linked (else copied), its documents.

A format whose token file is byte for byte a lemur `.bin` (Megatron's `.bin` for uint16 or
ids below 2^31, datatrove's `.ds`, OLMo's `.npy`) gets a hard link to the shard when OUT is
on the same filesystem: no byte moves, and the shard itself is never rewritten in place by
a rebuild (shards are replaced by rename), so the link keeps the exported bytes.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np

from lemur.export.formats import ExportError, ShardPart
from lemur.shards.format import INDEX_DTYPE, PROVENANCE_SUFFIX, open_array

# Errors of os.link that mean "not here", where a copy does: another filesystem, a
# filesystem without hard links, a file we may read but not link (fs.protected_hardlinks).
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}

# Tokens checked per pass when scanning a shard's ids (bounded memory on any shard).
_SCAN_CHUNK = 1 << 24


def link_or_copy(src: Path, dst: Path) -> Path:
    """`dst` as a hard link to `src` when the filesystem allows, else a copy; `dst`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise
        shutil.copyfile(src, dst)
    return dst


def documents_file(part: ShardPart) -> Path | None:
    """The shard's documents.parquet beside its `.bin` (a build with `output.provenance`:
    one provenance row per document, in the `.idx`'s order), else None."""
    path = part.tokens.with_name(part.tokens.name.removesuffix(".bin") + PROVENANCE_SUFFIX)
    return path if path.is_file() else None


def document_ends(part: ShardPart) -> np.ndarray:
    """The shard's exclusive document ends as int64 (read from its `.idx`)."""
    return np.asarray(open_array(part.index, INDEX_DTYPE), np.int64)


def document_lengths(ends: np.ndarray) -> np.ndarray:
    """Each document's token count from exclusive ends (int64)."""
    return np.diff(ends, prepend=0)


def check_ids_below(part: ShardPart, limit: int, why: str) -> None:
    """ExportError (one line naming the shard and the offset) if an id is >= `limit`."""
    tokens = open_array(part.tokens, np.dtype(part.token_dtype).newbyteorder("<"))
    for lo in range(0, len(tokens), _SCAN_CHUNK):
        chunk = np.asarray(tokens[lo : lo + _SCAN_CHUNK])
        if chunk.size and int(chunk.max()) >= limit:
            i = int(np.argmax(chunk >= limit))
            raise ExportError(
                f"{part.tokens}: token id {int(chunk[i])} at offset {lo + i} does not fit {why}"
            )

"""The shard directory format (`lemur-shards/1`): manifest, writer, readers, checks, verify.

| module | what it holds |
|---|---|
| `format` | the manifest (`read_manifest`), `ShardWriter`, token and index readers |
| `check` | start-up checks: `ShardDir` (opened once), `structure_problem`, `check_compatible` |
| `commit` | switching a directory to a new build |
| `verify` | `verify`: every byte, checksums included (`lemur-data verify`) |

Written by `lemur-data build`, read by the trainer and the evals; see docs/format.md.
"""

from lemur.shards.check import (
    ShardCompatibilityError,
    ShardDir,
    check_compatible,
    check_structure,
    structure_problem,
)
from lemur.shards.format import (
    FORMAT,
    MANIFEST,
    ShardFormatError,
    ShardInfo,
    ShardWriter,
    read_manifest,
)
from lemur.shards.verify import verify

__all__ = [
    "FORMAT",
    "MANIFEST",
    "ShardCompatibilityError",
    "ShardDir",
    "ShardFormatError",
    "ShardInfo",
    "ShardWriter",
    "check_compatible",
    "check_structure",
    "read_manifest",
    "structure_problem",
    "verify",
]

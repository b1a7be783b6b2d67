"""The shard directory format (`lemur-shards/1`): manifest, writer, readers, checks, verify.

Written by `lemur-data build`, read by the trainer and the evals; see docs/format.md.
"""

from lemur.shards.check import (
    ShardCompatibilityError,
    check_compatible,
    check_structure,
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
    "ShardFormatError",
    "ShardInfo",
    "ShardWriter",
    "check_compatible",
    "check_structure",
    "read_manifest",
    "verify",
]

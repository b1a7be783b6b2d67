"""Loader states saved before 2026-11-25, when each source's shuffle was seeded with an identity
that held the build folder's name (`build-<id>/`): recognized, so that resuming one is refused
with what to do.

They cannot be converted to today's state exactly: a state is only a position in the stream
(`global_next_index`), and today's stream visits the windows in another order, so no position
in it continues the old order. The last lemur that reads in that order is `LAST_COMMIT`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lemur.train.loader import PipelineIdentity

# The last commit whose loader rebuilt the old order on resume (#45 removed it).
LAST_COMMIT = "b2d62e9"


def content_id_with_build_folder(shards: list[dict[str, Any]]) -> str:
    """The identity lemur gave a source's data before 2026-11-25 (`ShardSource.content_id`
    with the build folder kept in each shard's file name)."""
    listing = [
        [s["file"], s["tokens"], s["documents"], s.get("sha256")]
        + ([s.get("mask_sha256")] if "mask" in s else [])
        for s in shards
    ]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


def saved_before_rename(state: dict[str, Any], identity: PipelineIdentity) -> bool:
    """Whether `state` was saved by the pipeline of `identity` as lemur named it before
    2026-11-25 (and so cannot resume in its order here)."""
    old = identity.fingerprint([content_id_with_build_folder(s.shards) for s in identity.sources])
    return state.get("fingerprint") == old != identity.fingerprint()


def refusal(where: str) -> str:
    """The one line that refuses to resume such a state, naming what to do."""
    return (
        f"{where}: the loader state was saved by lemur before 2026-11-25, whose shuffle order "
        f"this lemur cannot continue; finish the run with lemur at commit {LAST_COMMIT}, or "
        "--set data.strict_state=false to continue from its position in today's order"
    )

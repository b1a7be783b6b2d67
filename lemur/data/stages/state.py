"""What one stage of a build hands the next (`BuildState`), and a stage's signature."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lemur.data.budget import Reading
from lemur.data.context import BuildContext
from lemur.data.pack.plan import PackPlan
from lemur.data.pack.write import PackStages
from lemur.data.read.listing import Listing
from lemur.data.repos.stage import Grouped
from lemur.data.runs.format import TokenRun
from lemur.shards.format import ShardInfo


@dataclass(frozen=True)
class BuildState:
    """What one stage of a build hands the next: the token run so far (the read stage's,
    rewritten by FIM, grouped into repositories) and what the manifest gathers on the way."""

    listing: Listing
    inputs_sha: str
    read: TokenRun | None = None  # the read stage's run (its counts, its dedup)
    run: TokenRun | None = None  # the run the next stage reads
    reading: Reading | None = None  # which units of each source were read
    fim: dict[str, Any] | None = None  # the manifest's `fim` section
    grouped: Grouped | None = None  # the group stage, with `repos:`
    pack: PackStages | None = None
    plan: PackPlan | None = None
    shards: tuple[ShardInfo, ...] = ()
    result: dict[str, Any] | None = None  # set by the stage that ends the build


# A stage of the build: the shared context and the state so far -> the state it leaves.
Stage = Callable[[BuildContext, BuildState], BuildState]

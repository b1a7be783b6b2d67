"""The shuffle stage: scatter tasks, then gather tasks (one per shard) writing the shards."""

from __future__ import annotations

import dataclasses

from lemur.data.context import BuildContext
from lemur.data.stages.state import BuildState


def shuffle_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """Scatter tasks, then gather tasks: the shards, under the build's own directory."""
    assert state.pack is not None and state.plan is not None
    return dataclasses.replace(state, shards=tuple(state.pack.shuffle(state.plan, ctx.out)))

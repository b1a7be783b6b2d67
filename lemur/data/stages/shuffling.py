"""The shuffle stages: scatter tasks put every document of the run in its shard's bucket,
in the plan's order; gather tasks (one per shard) write the shards (pack/write.py)."""

from __future__ import annotations

import dataclasses

from lemur.data.context import BuildContext
from lemur.data.stages.state import BuildState


def scatter_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The scatter tasks over the run, by the plan; the state as it is (their files are the
    shuffle's work, which the gather stage reads)."""
    assert state.pack is not None and state.plan is not None
    state.pack.scatter(state.plan)
    return state


def gather_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The gather tasks: the shards, under the build's own directory of the output."""
    assert state.pack is not None and state.plan is not None
    return dataclasses.replace(state, shards=tuple(state.pack.gather(state.plan, ctx.out)))

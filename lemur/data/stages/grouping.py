"""The group stage: with `repos:`, a repository's files made one document (repos/stage.py)."""

from __future__ import annotations

import dataclasses

from lemur.data.context import BuildContext
from lemur.data.repos.stage import group_repositories
from lemur.data.runs.format import TokenRun
from lemur.data.stages.state import BuildState


def repos_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """With `repos:`, the group tasks: repository documents and the other documents of the
    run, duplicates already removed (repos/stage.py); the state as it is without."""
    if ctx.recipe.repos is None or state.run is None:
        return state
    grouped = group_repositories(ctx, state.run)
    return dataclasses.replace(state, run=TokenRun(grouped.run, grouped.tasks), grouped=grouped)

"""The plan stage: the pack stage's histogram tasks over the run, then the mix and val plan
(pack/); a `plan_only` build ends here.
"""

from __future__ import annotations

import dataclasses

from lemur.data import work as work_folders
from lemur.data.context import BuildContext
from lemur.data.counts import collect_counts, drops
from lemur.data.dedup.stage import expected_memory
from lemur.data.pack.plan import PackError
from lemur.data.pack.write import PackStages
from lemur.data.recipe.recipe import Recipe
from lemur.data.repos.stage import pack_recipe
from lemur.data.runs.format import TokenRun
from lemur.data.stages.state import BuildState
from lemur.data.work import settings_sha
from lemur.shards.format import token_dtype


def plan_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The pack stage's histogram tasks, then the mix and val plan (in this process); with
    `plan_only` the build ends here with the plan."""
    recipe, read, run = ctx.recipe, state.read, state.run
    assert read is not None and run is not None and state.reading is not None
    # A group run has its duplicates removed already: it is packed without dedup.
    stages = pack_stages(ctx, run, pack_recipe(recipe) if state.grouped else None)
    try:
        plan = stages.plan()
    except PackError as e:  # e.g. nothing left to pack: say what the documents became
        counts = collect_counts(read.folder, recipe, ctx.corpus, read.tasks, state.listing)
        raise PackError(f"{e}; {drops(counts)}") from None
    reading = state.reading.summary(recipe)
    if ctx.on_plan:
        memory = {**expected_memory(recipe.dedup, read.dedup), **plan.memory}
        ctx.on_plan({**plan.mix.to_json(), "memory": memory, "reading": reading})
    result = {"plan": plan.mix.to_json(), "reading": reading} if ctx.plan_only else None
    return dataclasses.replace(state, pack=stages, plan=plan, result=result)


def pack_stages(ctx: BuildContext, run: TokenRun, recipe: Recipe | None = None) -> PackStages:
    """The build's pack stage over the token run `run`, tasks run through the context's
    runner, shards under the build's own directory of the output (`PackStages.prefix`);
    `recipe`: the one the run is packed with (default: the build's)."""
    recipe = recipe or ctx.recipe
    key = work_folders.run_key(run.folder)
    # The build's own directory: no file of it shares a path with the previous build's, so
    # that build stays whole for readers until the manifest is replaced.
    # Named by content, not place: the same build in another directory gets the same names.
    skip = ("output", "work_dir", "export")  # where it goes, and what is made of it after
    settings = {k: v for k, v in recipe.to_dict().items() if k not in skip}
    return PackStages(
        recipe,
        ctx.corpus,
        run.token_dir,
        run.tasks,
        token_dtype(ctx.tok.info["vocab_size"]),
        dedup_dir=run.dedup,
        prefix=f"build-{settings_sha([settings, key])[:12]}",
        tokenizer=ctx.tok.path,
        run_stage=ctx.stage,
    )

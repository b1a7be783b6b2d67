"""The FIM stage: with `fim:`, tasks rewrite the run's code documents into prefix/suffix/middle
order (fim/rewrite.py); the manifest's `fim` section.
"""

from __future__ import annotations

import dataclasses

from lemur.data import work as work_folders
from lemur.data.context import BuildContext
from lemur.data.fim.rewrite import FimJob, FimRewrite, fim_counts
from lemur.data.stages.state import BuildState
from lemur.tokenizer.fim import MARKER_ROLES


def fim_stage(ctx: BuildContext, state: BuildState) -> BuildState:
    """The FIM tasks over the read run (fim/rewrite.py): the run with its tokens rewritten,
    and the manifest's `fim` section; the state as it is without FIM. They start from the
    run's kept read, filter, dedup and tokenize work (a new rate re-runs only them and
    packing)."""
    recipe, tok, run = ctx.recipe, ctx.tok, state.run
    fim, markers = recipe.fim, tok.markers
    if fim is None or markers is None or run is None:
        return state
    sources = tuple(i for i, s in enumerate(recipe.sources) if s.domain in fim.domains)
    job = FimJob(str(tok.path), tok.info.get("engine", "auto"), fim, recipe.seed, markers, sources)
    folder = work_folders.fim_folder(run.folder, job.key(tok.key, run.dedup))
    out = work_folders.tokens_dir(folder)
    rewrite = FimRewrite(run.token_dir, run.dedup, str(out), job)
    ctx.stage([rewrite], folder, run.tasks, "fim")
    roles = {r: getattr(markers, r) for r in MARKER_ROLES if getattr(markers, r) is not None}
    section = {
        **fim.work_settings(recipe.seed),
        "domains": list(fim.domains),
        "markers": {"style": markers.style, **roles},
        "counts": fim_counts(out, run.tasks),
    }
    return dataclasses.replace(state, run=dataclasses.replace(run, tokens=out), fim=section)

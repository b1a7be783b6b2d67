"""The build's stages, one module each, in the order `lemur.data.build.STAGES` runs them.

Every stage is a `Stage` (state.py): the build's one `BuildContext` and the `BuildState`
the stage before left -> the state it leaves (the token run so far, what the manifest
gathers). A stage with nothing to do for a recipe returns the state as it is.

| module | stage | what it makes |
|---|---|---|
| `state` | | `BuildState`, `Stage` |
| `reading` | `read_stage` | read, tag, filter, sign, tokenize; then dedup: the read run |
| `infilling` | `fim_stage` | with `fim:`, the run's code documents rewritten |
| `grouping` | `repos_stage` | with `repos:`, repository documents |
| `planning` | `plan_stage` | the pack stage's histograms, the mix and val plan |
| `shuffling` | `scatter_stage`, `gather_stage` | scatter tasks, then gather tasks: the shards |
| `committing` | `commit_stage` | the manifest; the output switched to the new build |
| `exporting` | `export_stage` | the recipe's `export:` formats, after the commit |
"""

"""The run between the build's stages: token runs, document records and dedup removals.

One definition of their bytes (`format`: docs/format.md#token-runs; `provenance`: each
document's source rows beside them, with `output.provenance`), below every stage
that reads or writes them (read, dedup, FIM, repository groups, pack), as `lemur.shards`
is below the loader and the shard writer.
"""

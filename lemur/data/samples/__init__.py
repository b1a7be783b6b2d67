"""The build's samples (`<build>/samples/`, docs/format.md#samples): bounded, seeded samples
of what the build dropped and kept, each drop with the value that tripped its rule.

`records` is the format's one home (file names, the capped text, the drop verdict and its
rule line, the seeded priority); `collect` keeps a task's samples (up to K per key, those
of lowest seeded priority, so the result depends on neither arrival order nor the number
of tasks) and fixed-edge histograms, written as one part file per task and step; `merge`
joins every part into the build's files.
"""

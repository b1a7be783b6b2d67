"""Packing tokenized documents into shards: per-task histograms, the mix plan, and the
shuffle as scatter and gather tasks on the build's executor.

No process holds per-document arrays of the whole corpus: a task holds one tokenize task's
records or one shard, the plan one histogram per mix unit.

Import the modules themselves (`lemur.data.pack.write.PackStages`): the package imports
none of them. The mix planner's arithmetic lies below the package and the corpus
(lemur/data/mix.py): the corpus plans with it, and the pack stage asks the corpus.
"""

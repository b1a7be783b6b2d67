"""Deduplication: exact (normalized content hash) and near (MinHash + LSH) within each domain.

Three stages, like datatrove's multi-stage MinHash, all tasks on the build's executor and
sharing the build's single read:
1. `DedupSigner` (a pipeline step in every tokenize task) writes, per task, a uint64
   normalized content hash, a MinHash signature (uint32 x `num_perm`) and a bottom-k sketch
   of the shingles (sketch.py) per document, and
   per channel (the exact hash, each LSH band) a run of (bucket key, local index) sorted by
   key (runs.py);
2. `DedupBuckets` tasks (one per channel and key range) merge the runs of all tasks in a
   streaming k-way merge with bounded buffers (merge.py), pair each member of an equal-key
   group with the group's first member in keep order, verify near pairs (MinHash estimate,
   then the sketches when the estimate is too close to call) and write the verified pairs
   (buckets.py);
3. one `DedupClusters` task joins the pairs into clusters and keeps one document per
   cluster: the one from the source listed first in the recipe, then the longest, then the
   smallest id hash; it writes the others, per tokenize task, as removed (cluster.py).

Shingles are word n-grams of the lowercased text (words: runs of letters, digits and `_`).
Shingle and MinHash hashing are vectorized with numpy (datatrove hashes each shingle with
a Python call), which is where the speed-up comes from.

Memory: a signing task holds one document at a time, then sorts its runs one channel at a
time (28 bytes per document of the task); a bucket task holds its merge and verification
buffers (`dedup.merge_buffer_mb`); the cluster task holds ~40 bytes per document that has
a verified partner, never one entry per document of the corpus.
"""

from lemur.data.dedup.cluster import DedupResult
from lemur.data.dedup.signer import DedupSigner, combine_ngrams, minhash, normalized_hash, shingles
from lemur.data.dedup.stage import DedupBuckets, DedupClusters, dedup_stages

__all__ = [
    "DedupBuckets",
    "DedupClusters",
    "DedupResult",
    "DedupSigner",
    "combine_ngrams",
    "dedup_stages",
    "minhash",
    "normalized_hash",
    "shingles",
]

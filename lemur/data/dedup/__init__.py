"""Deduplication: exact (normalized content hash) and near (MinHash + LSH) within each domain.

Two stages, like datatrove's multi-stage MinHash, but sharing the build's single read:
1. `DedupSigner` (a pipeline step in every tokenize task) writes, per task, a uint64
   normalized content hash and a MinHash signature (uint32 x `num_perm`) per document;
2. `find_duplicates` (after all tasks) hashes signature bands into LSH buckets band by
   band, verifies candidate pairs by their estimated Jaccard, joins pairs into clusters and
   keeps one document per cluster: the one from the source listed first in the recipe,
   then the longest, then the smallest id hash. It marks the others removed.

Shingles are word n-grams of the lowercased text (words: runs of letters, digits and `_`).
Shingle and MinHash hashing are vectorized with numpy (datatrove hashes each shingle with
a Python call), which is where the speed-up comes from.

Memory: the signer holds one document at a time (shingles are processed in blocks). The
cluster stage holds 8 x (bands + 6) bytes per document of the corpus (bucket keys of every
band, ranks, parents, content hashes: 176 bytes with 16 bands) plus the confirmed pairs,
like datatrove's in-memory cluster stage (~610 bytes per document measured at 1M
documents); signatures stay on disk, memory-mapped, read in blocks and released.
"""

from lemur.data.dedup.cluster import DedupResult, cluster_sizes, find_duplicates, load_signatures
from lemur.data.dedup.signer import DedupSigner, combine_ngrams, minhash, normalized_hash, shingles

__all__ = [
    "DedupResult",
    "DedupSigner",
    "cluster_sizes",
    "combine_ngrams",
    "find_duplicates",
    "load_signatures",
    "minhash",
    "normalized_hash",
    "shingles",
]

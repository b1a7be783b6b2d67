"""Packing tokenized documents into shards: records, dedup, val split, mix plan, shuffle, write.

Only small per-document records are held in memory; tokens move through bucket files on disk.
"""

from lemur.data.pack.mix import MixInfeasible, MixPlan, UnitPlan, plan_mix
from lemur.data.pack.records import Records, load_records
from lemur.data.pack.shuffle import ShuffleError, external_shuffle
from lemur.data.pack.write import Packer, PackError, PackPlan

__all__ = [
    "MixInfeasible",
    "MixPlan",
    "PackError",
    "PackPlan",
    "Packer",
    "Records",
    "ShuffleError",
    "UnitPlan",
    "external_shuffle",
    "load_records",
    "plan_mix",
]

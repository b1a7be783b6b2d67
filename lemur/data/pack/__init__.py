"""Packing tokenized documents into shards: per-task histograms, the mix plan, and the
shuffle as scatter and gather tasks on the build's executor.

No process holds per-document arrays of the whole corpus: a task holds one tokenize task's
records or one shard, the plan one histogram per mix unit.
"""

from lemur.data.pack.mix import MixInfeasible, MixPlan, UnitPlan, plan_mix
from lemur.data.pack.plan import PackError, PackPlan, make_plan
from lemur.data.pack.records import TaskRecords, task_records
from lemur.data.pack.sections import ManifestSections
from lemur.data.pack.settings import PackSettings
from lemur.data.pack.shuffle import ShuffleError
from lemur.data.pack.write import PackStages

__all__ = [
    "ManifestSections",
    "MixInfeasible",
    "MixPlan",
    "PackError",
    "PackPlan",
    "PackSettings",
    "PackStages",
    "ShuffleError",
    "TaskRecords",
    "UnitPlan",
    "make_plan",
    "plan_mix",
    "task_records",
]

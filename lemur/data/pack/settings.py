"""What every scatter and gather task needs to know: `PackSettings`, made from the plan."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lemur.data.pack.plan import PackPlan
from lemur.data.pack.select import Groups, Unit


@dataclass(frozen=True)
class PackSettings:
    """The plan's cuts and shard counts and the build's token layout (pickled into each task)."""

    groups: Groups  # seed, val fraction, and each source's domain and mix group
    val_cut: dict[str, int]  # domain -> val hash cut (a document below it is held out)
    # (group, language, whole passes, packed bitmap of the partial pass's mix-hash bins) per
    # unit: rows, not a dict keyed by tuples, as datatrove writes every step's settings to
    # its executor.json and JSON keys are strings
    units: tuple[tuple[str, str, int, bytes], ...]
    train_shards: int
    val_shards: dict[str, int]  # domain -> number of val shards (recipe domain order)
    dtype: np.dtype  # of the tokenize runs and the shards
    masks: bool  # chat builds: a loss mask beside every token

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))  # "<u2" and np.uint16 alike
        if self.train_shards < 1:
            raise ValueError(f"PackSettings: train_shards is {self.train_shards}, not >= 1")
        if any(n < 0 for n in self.val_shards.values()):
            raise ValueError(f"PackSettings: a negative val shard count in {self.val_shards}")
        if len({u[:2] for u in self.units}) != len(self.units):
            raise ValueError("PackSettings: a (group, language) unit is listed twice")

    def unit_bins(self) -> dict[Unit, tuple[int, bytes]]:
        """(group, language) -> (whole passes, partial-pass bins): what `task_fates` takes."""
        return {(group, lang): (passes, bins) for group, lang, passes, bins in self.units}

    @classmethod
    def of(cls, plan: PackPlan, groups: Groups, dtype: np.dtype, masks: bool) -> PackSettings:
        """The settings that carry out `plan`."""
        return cls(
            groups=groups,
            val_cut=plan.val_cut,
            units=tuple((*unit, *take) for unit, take in sorted(plan.units.items())),
            train_shards=plan.train_shards,
            val_shards=plan.val_shards,
            dtype=np.dtype(dtype),
            masks=masks,
        )

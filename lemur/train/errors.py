"""The trainer's two errors, below every module that raises or catches them.

`RunError` is a user's mistake found before or while a run starts (the data, the pre-trained
weights, the checkpoints): `lemur-train` prints its one line and exits 2. `TrainingDiverged`
is the run's own failure: it exits 1, the last good checkpoint left as it was.
"""

from __future__ import annotations


class RunError(ValueError):
    """A run that cannot start (data, pretrained weights, checkpoints); one line."""


class TrainingDiverged(RuntimeError):
    """The loss, gradient norm or parameter norm stopped being finite."""

"""The private members of datatrove's executors that ours rely on, used here and nowhere else.

- `PipelineExecutor._run_for_rank(rank, local_rank=0, node_rank=-1)` runs one task (its
  logger, stats and completion marker). datatrove's own `run()` methods call it, Slurm's
  inside each array task too, so we override it (our task logs) and call it (`run_task`).
- `_launched`: an executor's `run()` sets it; a datatrove executor that `depends` on another
  runs that one first unless it is set (`mark_launched`).

tests/test_data_executors.py pins both against the installed datatrove, so that a datatrove
that renames or changes them fails there rather than in a build.
"""

from __future__ import annotations

from typing import Any

from lemur.data.run.logs import task_logs


class LemurExecutor:
    """Base of our datatrove executors: each task logs through `task_logs()`, and the task
    hooks above are called by their public names."""

    def _run_for_rank(self, rank: int, local_rank: int = 0, node_rank: int = -1) -> Any:
        """datatrove's hook for one task (see the module docstring), with our task logs."""
        with task_logs():
            return super()._run_for_rank(rank, local_rank, node_rank)  # type: ignore[misc]

    def run_task(self, rank: int, local_rank: int = 0) -> Any:
        """Run task `rank` in this process (local_rank 0 alone logs to the console)."""
        return self._run_for_rank(rank, local_rank)

    def mark_launched(self) -> None:
        """Tell a datatrove executor that depends on this one that it has run."""
        self._launched = True

"""Running the build's stages: datatrove executors (local, Ray, Slurm), the task step of
global stages, quiet logs, the output lock, the `executor` section's checks.

The names below load their module on first use, so that checking a recipe does not import
datatrove or Ray.
"""

from __future__ import annotations

from lemur.lazy_exports import lazy_exports

_EXPORTS = {
    "DirectoryLock": "lock",
    "LemurLocalExecutor": "executors",
    "LockedError": "lock",
    "TaskStep": "task",
    "make_executor": "executors",
    "quiet_datatrove": "logs",
    "run_here": "task",
    "check_executor": "settings",
}
__getattr__, __all__ = lazy_exports(__name__, _EXPORTS)

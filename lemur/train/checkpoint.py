"""Checkpoints of a run: the whole train state plus the loader position, via orbax.

Layout: `DIR/<step>/state` (params, optimizer state, step, RNG: orbax's sharded array
format, each host writing its shards), `DIR/<step>/data` (the loader state, JSON, the
same on every host) and `DIR/<step>/meta` (the resolved config and counters, JSON).
Orbax writes a step under a temporary name and renames it when complete, so a run
killed mid-save leaves the previous checkpoints intact and `latest_step` never returns
a partial one. Saves are asynchronous: the device-to-host copy blocks, the writing
happens in a background thread while training continues.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

ITEMS = ("state", "data", "meta")


class Checkpointer:
    """Save and restore `(state, loader state, meta)` under `directory/<step>/`."""

    def __init__(self, directory: str | os.PathLike, *, keep: int = 3,
                 async_save: bool = True) -> None:
        self.directory = Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        self.manager.reload()  # another process may have written since we opened it
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint, oldest first."""
        self.manager.reload()
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_state: dict[str, Any],
             meta: dict[str, Any]) -> None:
        """Start saving; returns once the arrays are copied off the devices."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=ocp.args.JsonSave(data_state),
                                  meta=ocp.args.JsonSave(meta))
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(state, loader state, meta) of `step`; `target` gives shapes, dtypes, shardings."""
        args = ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                  data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
        restored = self.manager.restore(step, args=args)
        return restored.state, restored.data, restored.meta

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager's threads."""
        self.manager.wait_until_finished()
        self.manager.close()

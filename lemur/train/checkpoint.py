"""Checkpoints of a run: the whole train state plus the loader position, via orbax.

Layout: `DIR/<step>/state` (params, optimizer state, step, RNG: orbax's sharded array
format, each host writing its shards), `DIR/<step>/data` (the loader state, JSON, the
same on every host) and `DIR/<step>/meta` (the resolved config and counters, JSON).
Orbax writes a step under a temporary name and renames it when complete, so a run
killed mid-save leaves the previous checkpoints intact and `latest_step` never returns
a partial one. Saves are asynchronous: the device-to-host copy blocks, the writing
happens in a background thread while training continues.

A complete checkpoint can still be damaged later (a truncated or deleted file, an
empty step directory): `problem` finds what is missing without reading the arrays,
`restore` raises `CheckpointDamaged` with one line, and `move_aside` renames a damaged
step to `<step>.damaged` (orbax ignores that name) so the run can go on from an older one.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from lemur.model.checkpoint import absl_logs_at
from lemur.process_setup import FAILED_RESTORES

ITEMS = ("state", "data", "meta")
# Files every complete checkpoint holds (orbax 0.12's layout): one missing means damage.
REQUIRED_FILES = ("state/_METADATA", "data/metadata", "meta/metadata")
DAMAGED_SUFFIX = ".damaged"


class CheckpointDamaged(Exception):
    """A checkpoint that cannot be restored (missing, truncated or unreadable files)."""


def error_line(e: BaseException, limit: int = 240) -> str:
    """The first line of the innermost cause of `e` (orbax wraps the real reason)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    line = lines[0] if lines else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _collect_quietly(path: Path) -> None:
    """After a failed restore of `path`: drop its leftovers now, and any that come later
    (under `lemur-train`, whose `lemur.process_setup.quiet_failed_restores` filter reads
    FAILED_RESTORES)."""
    FAILED_RESTORES.add(f"{path}{os.sep}")
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


class Checkpointer:
    """Save and restore `(state, loader state, meta)` under `directory/<step>/`."""

    def __init__(
        self, directory: str | os.PathLike, *, keep: int = 3, async_save: bool = True
    ) -> None:
        self.directory = Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save
        )
        with absl_logs_at(logging.ERROR):
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        with absl_logs_at(logging.ERROR):
            self.manager.reload()  # another process may have written since we opened it
            return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of every complete checkpoint, oldest first."""
        with absl_logs_at(logging.ERROR):
            self.manager.reload()
            return sorted(self.manager.all_steps())

    def step_dir(self, step: int) -> Path:
        """The directory of checkpoint `step`."""
        return self.directory / str(step)

    def problem(self, step: int) -> str | None:
        """Why checkpoint `step` cannot be restored, found without reading arrays; else None."""
        path = self.step_dir(step)
        if not path.is_dir() or not any(path.iterdir()):
            return "empty directory"
        for rel in REQUIRED_FILES:
            if not (path / rel).is_file():
                return f"{rel} is missing"
        for item in ("data", "meta"):
            try:
                json.loads((path / item / "metadata").read_text())
            except (OSError, ValueError) as e:
                return f"{item}/metadata is unreadable ({error_line(e)})"
        return None

    def param_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
        """Shape of every parameter in checkpoint `step`, by key path (no arrays read)."""
        handler = ocp.StandardCheckpointHandler()
        try:
            tree = handler.metadata(self.step_dir(step) / "state")
        except Exception as e:  # orbax raises many types for unreadable metadata
            raise CheckpointDamaged(f"state/_METADATA is unreadable ({error_line(e)})") from None
        finally:
            handler.close()
        leaves = jax.tree_util.tree_flatten_with_path(dict(tree)["params"])[0]
        return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}

    def move_aside(self, step: int) -> Path:
        """Rename damaged checkpoint `step` to `<step>.damaged` (kept, never deleted)."""
        target = self.directory / f"{step}{DAMAGED_SUFFIX}"
        n = 1
        while target.exists():
            n += 1
            target = self.directory / f"{step}{DAMAGED_SUFFIX}.{n}"
        os.replace(self.step_dir(step), target)
        with absl_logs_at(logging.ERROR):
            self.manager.reload()
        return target

    def save(self, step: int, state: Any, data_state: dict[str, Any], meta: dict[str, Any]) -> None:
        """Start saving; returns once the arrays are copied off the devices."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state),
            meta=ocp.args.JsonSave(meta),
        )
        self.manager.save(step, args=args, force=True)

    def restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """(state, loader state, meta) of `step`; `target` gives shapes, dtypes, shardings."""
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore(),
        )
        reason = None
        try:
            with absl_logs_at(logging.ERROR):
                restored = self.manager.restore(step, args=args)
        except Exception as e:  # truncated arrays, bad JSON, missing items: all damage
            reason = str(e.__cause__ or e).replace(f"{self.step_dir(step)}{os.sep}", "")
            reason = error_line(CheckpointDamaged(reason))
        if reason is not None:
            # Outside `except`: the traceback no longer holds the failed read's frames.
            _collect_quietly(self.step_dir(step))
            raise CheckpointDamaged(reason)
        return restored.state, restored.data, restored.meta

    def wait(self) -> None:
        """Block until every started save is on disk."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        """Finish pending saves and release the manager's threads."""
        self.manager.wait_until_finished()
        self.manager.close()

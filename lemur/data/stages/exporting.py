"""The build's last stage: the recipe's `export:` formats written from the finished shards.

Each entry is one task on the build's executor: `lemur.export.run.export` of the output
into the entry's folder, which replaces an older export there (a new build) and is written
whole or not at all. An entry whose folder already holds the export of this very manifest
(`export.json`: its sha256, format and split, every file there at its size) is skipped, so
a rerun, or an up-to-date build, redoes only what is missing. Exports are not part of the
build's identity: adding one rebuilds nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lemur.data.context import BuildContext, BuildError
from lemur.data.recipe.export import ExportConfig
from lemur.data.run.task import TaskStep
from lemur.export.formats import ExportError, exporter
from lemur.export.run import EXPORT_JSON, check_out, export, export_info, shard_parts
from lemur.shards.format import MANIFEST, read_manifest, sha256_file


class ExportTask(TaskStep):
    """Export task `rank`: the build's output written as the `rank`-th pending entry."""

    name = "📦 export"
    type = "💽 - WRITER"

    def __init__(self, source: str, exports: list[ExportConfig]) -> None:
        super().__init__()
        self.source = source
        self.exports = exports

    def task(self, rank: int) -> None:
        """Write export `rank` (replacing an older one at its folder)."""
        e = self.exports[rank]
        export(self.source, e.format, Path(e.out).expanduser(), split=e.split, force=True)


def is_exported(source: Path, e: ExportConfig, manifest_sha: str) -> bool:
    """Whether `e.out` holds the export of this manifest as `e` asks, every file present."""
    out = Path(e.out).expanduser()
    try:
        info = json.loads((out / EXPORT_JSON).read_text())
        same = (
            info["source_manifest_sha256"] == manifest_sha
            and info["format"] == e.format
            and info["split"] == e.split
            and info["source"] == str(source.resolve())
        )
        return same and all((out / f["path"]).stat().st_size == f["bytes"] for f in info["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def check_export(source: Path, manifest: dict[str, Any], e: ExportConfig) -> None:
    """Refuse, before any task runs, an export the corpus or its folder cannot take."""
    out = Path(e.out).expanduser().resolve()
    fmt = exporter(e.format)
    parts = shard_parts(source, manifest, e.split)
    if not parts:
        raise ExportError(f"{source / MANIFEST}: no {e.split} shards to export")
    fmt.check(export_info(source, out, manifest, parts))
    check_out(out, force=True)


def export_stage(ctx: BuildContext) -> None:
    """Write the recipe's pending exports of the finished build, one task each."""
    exports = ctx.recipe.export or []
    if not exports or ctx.plan_only:
        return
    source = ctx.out.resolve()
    sha = sha256_file(source / MANIFEST)
    todo = [e for e in exports if not is_exported(source, e, sha)]
    if not todo:
        return
    manifest = read_manifest(source)
    try:
        for e in todo:
            check_export(source, manifest, e)
    except ExportError as err:
        raise BuildError(f"recipe: export: {err}") from None
    # Completion markers of an earlier run must not skip an export redone now.
    folder = ctx.work_root / "export"
    shutil.rmtree(folder, ignore_errors=True)
    ctx.stage([ExportTask(str(source), todo)], folder, len(todo), "export")
    for e in todo:
        ctx.note(f"export: {e.format} written to {Path(e.out).expanduser()}")

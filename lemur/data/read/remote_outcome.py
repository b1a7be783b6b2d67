"""Remote reading a build did not finish: reads that failed for good (their retries spent,
the store down or throttling) and objects changed since they were listed.

Neither is a property of the input: the same recipe run again, the store healthy, must read
them. So a build that met one is not complete: the tasks that met them lose their completion
markers (the next run redoes them, and only them: finished tasks are kept), a source with a
changed object loses its recorded listing (the next run lists it again, a new build of the
new version), and the build fails with one line saying how many reads failed, the first
named, and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lemur.data import work as work_folders
from lemur.data.labels import error_labels, task_labels
from lemur.data.read.readers import REMOTE_FAILED
from lemur.data.read.remote_listing import forget_record
from lemur.data.recipe.recipe import Recipe
from lemur.data.recipe.sources import is_remote


def _first(counts: dict[str, Any]) -> str:
    """The first failed read, as `source 'NAME': URL: what happened` (the URL once)."""
    first = next((e for e in counts["errors"] if e["kind"] == REMOTE_FAILED), None)
    if first is None:  # past the manifest's cap on listed errors
        return "see the task logs"
    said = first["error"]
    named = said.startswith(first["file"]) or is_remote(said.split(": ", 1)[0])  # a blob's URL
    where = "" if named else f"{first['file']}: "
    return f"source '{first['source']}': {where}{said}"


def unfinished_reads(recipe: Recipe, run_dir: Path, n_tasks: int, counts: dict[str, Any]) -> str:
    """The line a build fails with when its tokenize run `run_dir` met remote reads that
    failed for good ("" when none did), after making the next run redo the tasks that met
    them and list again the sources whose objects changed."""
    failed = counts["error_kinds"].get(REMOTE_FAILED, 0)
    if not failed:
        return ""
    label = error_labels(REMOTE_FAILED, "")[0]  # the overall label: every source's
    ranks = [r for r in range(n_tasks) if task_labels(run_dir, r)[label]]
    for rank in ranks:
        work_folders.completion_marker(run_dir, rank).unlink(missing_ok=True)
    changed = [
        i
        for i, s in enumerate(recipe.sources)
        if counts["sources"][s.name].get("remote", {}).get("changed")
    ]
    for index in changed:
        forget_record(recipe, index)
    tasks = (
        "the task that met them is"
        if len(ranks) == 1
        else f"the {len(ranks)} tasks that met them are"
    )
    relist = ""
    if changed:
        names = ", ".join(f"'{recipe.sources[i].name}'" for i in changed)
        relist = f"; source {names} changed since listed: it is listed again"
    return (
        f"{failed:,} remote read{'s' if failed != 1 else ''} failed ({_first(counts)}); "
        f"the build is not complete: run it again when the store answers ({tasks} redone, "
        f"finished work is kept){relist}"
    )

"""Jupyter notebooks -> one script-like document: code cells as code, markdown as comments.

This is how The Stack's "jupyter-scripts" subsets present notebooks (part of Lemur's mix):
outputs are dropped, markdown becomes comments in the kernel's language, cells are
separated by blank lines.
"""

from __future__ import annotations

from typing import Any

import orjson

# Comment prefix per kernel language; `#` covers Python, R, Julia, shells, Ruby, Perl.
LINE_COMMENT = {
    "javascript": "//",
    "typescript": "//",
    "c++": "//",
    "c": "//",
    "java": "//",
    "scala": "//",
    "go": "//",
    "rust": "//",
    "kotlin": "//",
    "swift": "//",
    "c#": "//",
    "sql": "--",
    "haskell": "--",
    "lua": "--",
    "matlab": "%",
    "octave": "%",
}


class NotebookError(ValueError):
    """Text that is not a readable .ipynb notebook."""


def _source(i: int, cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    if isinstance(src, str):
        return src
    if isinstance(src, list) and all(isinstance(x, str) for x in src):
        return "".join(src)
    raise NotebookError(f"cell {i}: 'source' is not a string or a list of strings")


def _mapping(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    """`parent[key]` as a mapping ({} when absent or null), or a NotebookError naming it."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NotebookError(f"'{where}{key}' is not a mapping")
    return value


def _language(nb: dict[str, Any]) -> str:
    """The kernel's language, lower case; `python` when the notebook does not say."""
    meta = _mapping(nb, "metadata", "")
    for key, field in (("kernelspec", "language"), ("language_info", "name")):
        value = _mapping(meta, key, "metadata.").get(field)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise NotebookError(f"'metadata.{key}.{field}' is not a string")
        return value.lower()
    return "python"


def looks_like_notebook(text: str) -> bool:
    """Cheap check for nbformat JSON (used on text fields of jsonl/parquet rows)."""
    head = text[:4096].lstrip("\ufeff \t\r\n")
    return head.startswith("{") and '"cells"' in text and '"nbformat"' in text


def _parse(raw: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(raw, dict):
        nb = raw
    else:
        try:
            # orjson, not json: it caps nesting depth (json.loads recurses until
            # RecursionError on a deeply nested document).
            nb = orjson.loads(raw.lstrip("\ufeff"))
        except orjson.JSONDecodeError as e:
            raise NotebookError(f"invalid notebook JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a notebook: no 'cells' list")
    return nb


def notebook_to_script(raw: str | dict[str, Any]) -> tuple[str, str]:
    """(script text, kernel language) of a notebook given as JSON text or parsed dict.

    Anything malformed (bad JSON, a non-mapping `metadata`, a cell whose `source` is not
    text) raises NotebookError, so the caller skips this one document and names it.
    """
    nb = _parse(raw)
    language = _language(nb)
    prefix = LINE_COMMENT.get(language, "#")
    parts = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict):
            raise NotebookError(f"cell {i} is not a mapping")
        src = _source(i, cell).rstrip()
        if not src.strip():
            continue
        if cell.get("cell_type") == "code":
            parts.append(src)
        elif cell.get("cell_type") in ("markdown", "raw"):
            parts.append("\n".join(f"{prefix} {line}".rstrip() for line in src.splitlines()))
    return "\n\n".join(parts) + ("\n" if parts else ""), language

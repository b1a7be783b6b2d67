"""Jupyter notebooks -> one script-like document: code cells as code, markdown as comments.

This is how The Stack's "jupyter-scripts" subsets present notebooks (part of Lemur's mix):
outputs are dropped, markdown becomes comments in the kernel's language, cells are
separated by blank lines.
"""

from __future__ import annotations

import json
from typing import Any

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


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def looks_like_notebook(text: str) -> bool:
    """Cheap check for nbformat JSON (used on text fields of jsonl/parquet rows)."""
    head = text[:4096].lstrip()
    return head.startswith("{") and '"cells"' in text and '"nbformat"' in text


def notebook_to_script(raw: str | dict[str, Any]) -> tuple[str, str]:
    """(script text, kernel language) of a notebook given as JSON text or parsed dict."""
    try:
        nb = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        raise NotebookError(f"invalid notebook JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a notebook: no 'cells' list")
    meta = nb.get("metadata") or {}
    language = str(
        (meta.get("kernelspec") or {}).get("language")
        or (meta.get("language_info") or {}).get("name")
        or "python"
    ).lower()
    prefix = LINE_COMMENT.get(language, "#")
    parts = []
    for cell in nb["cells"]:
        if not isinstance(cell, dict):
            continue
        src = _source(cell).rstrip()
        if not src.strip():
            continue
        if cell.get("cell_type") == "code":
            parts.append(src)
        elif cell.get("cell_type") in ("markdown", "raw"):
            parts.append("\n".join(f"{prefix} {line}".rstrip() for line in src.splitlines()))
    return "\n\n".join(parts) + ("\n" if parts else ""), language

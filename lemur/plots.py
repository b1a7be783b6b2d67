"""Figures written to files: the one headless pyplot, and the one saver every PNG goes through.

`save_figure` writes through `atomic_files.atomic_path`, so a plot is whole or absent: a save
that fails midway (a full disk, a bad format) leaves no partial PNG, and an older plot under
the same name stays as it was. It is its own module, not part of atomic_files, because
atomic_files imports only the standard library (every layer uses it, cheaply); matplotlib is
imported here inside the functions, on the first plot, so importing this module costs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lemur.atomic_files import atomic_path


def pyplot() -> Any:
    """`matplotlib.pyplot` on the Agg backend (files only: works on headless hosts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike[str], *, dpi: int) -> Path:
    """Write `fig` to `path` whole or not at all, in the format its suffix names (png when it
    has none), and close the figure however the save ends; the path written."""
    path = Path(path)
    try:
        with atomic_path(path) as tmp:  # the format from the name the caller gave, not the temp's
            fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    finally:
        pyplot().close(fig)
    return path

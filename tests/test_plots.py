"""lemur.plots: every PNG is saved whole or not at all, through one function."""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from lemur import plots

ROOT = Path(__file__).resolve().parents[1]


def a_figure():
    """A small real figure on the Agg backend."""
    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1, 2], [1, 0, 1])
    return fig


def test_a_save_writes_the_format_its_name_says(tmp_path: Path) -> None:
    written = plots.save_figure(a_figure(), tmp_path / "sub" / "curve.png", dpi=50)
    assert written == tmp_path / "sub" / "curve.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(written.parent) == ["curve.png"]  # no temporary left beside it
    assert plots.pyplot().get_fignums() == []  # the figure closed


def test_a_failing_save_leaves_no_partial_png(tmp_path: Path) -> None:
    """A save that dies midway (the disk fills after half the PNG) leaves neither a partial
    file nor a temporary, keeps the plot already there, and still closes the figure."""
    out = tmp_path / "curve.png"
    out.write_bytes(b"the previous plot")
    fig = a_figure()
    real_savefig = fig.savefig

    def disk_fills(fname, **kwargs):
        real_savefig(fname, **kwargs)
        data = Path(fname).read_bytes()
        Path(fname).write_bytes(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    fig.savefig = disk_fills
    with pytest.raises(OSError, match="No space left"):
        plots.save_figure(fig, out, dpi=50)
    assert os.listdir(tmp_path) == ["curve.png"]
    assert out.read_bytes() == b"the previous plot"
    assert plots.pyplot().get_fignums() == []

    fresh = tmp_path / "fresh.png"  # no older plot: nothing at all
    fig = a_figure()
    fig.savefig = disk_fills
    with pytest.raises(OSError):
        plots.save_figure(fig, fresh, dpi=50)
    assert not fresh.exists() and sorted(os.listdir(tmp_path)) == ["curve.png"]


def test_every_figure_is_saved_through_save_figure() -> None:
    """No module of lemur but lemur/plots.py calls `savefig` (the PNGs of lemur-train plot,
    lemur-data stats --plots, lemur-eval plot and infill all go through save_figure)."""
    callers = []
    for path in sorted((ROOT / "lemur").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "savefig":
                callers.append(str(path.relative_to(ROOT)))
    assert callers == ["lemur/plots.py"]

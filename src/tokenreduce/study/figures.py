"""The report's PNG figures: matplotlib without a screen, written so that the same numbers give the same
bytes (no software or date metadata)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from ..bench.report import write_figure


def pyplot() -> Any:
    import matplotlib  # optional: only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def set_title(fig: Any, text: str, size: float = 9.0) -> Any:
    """Title ``fig`` with ``text`` wrapped to the figure's width (a long study title is never clipped, and a
    legend beside the axes does not push it off the page); returns the title's Text."""
    columns = max(20, int(fig.get_figwidth() * 72 / (0.55 * size)))  # an average glyph is about 0.55 em wide
    return fig.suptitle("\n".join(textwrap.wrap(text, columns)), fontsize=size)


def colours(n: int) -> list[Any]:
    """``n`` colours, all distinct (matplotlib's default cycle repeats after 10): tab10, tab20, or a spectrum."""
    if n <= 20:
        return [pyplot().get_cmap("tab10" if n <= 10 else "tab20")(i) for i in range(n)]
    return [pyplot().get_cmap("nipy_spectral")(0.05 + 0.9 * i / (n - 1)) for i in range(n)]


def write_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` (bench.report.write_figure: atomically, then closed) with no Software chunk:
    the same numbers give the same bytes."""
    return write_figure(fig, path, dpi=100, metadata={"Software": None})

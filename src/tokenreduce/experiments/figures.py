"""The report's PNG figures: matplotlib without a screen, written so that the same numbers give the same
bytes (no software or date metadata)."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import Any

from ..bench.report import write_text


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (an optional import: only the report draws)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def set_title(ax: Any, text: str, size: float = 9.0) -> None:
    """Title ``ax`` with ``text`` wrapped to the figure's width (a long study title is never clipped)."""
    width_in = ax.figure.get_figwidth()
    columns = max(20, int(width_in * 72 / (0.55 * size)))  # an average glyph is about 0.55 em wide
    ax.set_title("\n".join(textwrap.wrap(text, columns)), fontsize=size)


def write_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` (atomically) and close it."""
    png = io.BytesIO()
    try:  # no Software / date chunks: the same numbers give the same bytes
        fig.savefig(png, format="png", dpi=100, metadata={"Software": None})
    finally:
        pyplot().close(fig)
    return write_text(path, png.getvalue())

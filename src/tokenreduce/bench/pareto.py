"""The accuracy / speed trade-off as a picture and as a flat table.

``plot_pareto``: the task's primary metric (the rows' ``metric``: top1, map, miou; the y label)
against measured speed-up, one colour and marker per method, a line per method through its budgets
(sorted by speed-up), error bars of +- one standard deviation over runs, the unpatched model as a
black star at speed-up 1. Fine-tuned rows share their method's colour with open markers and a
dashed line. A row picked for a target speed-up but measured outside the band of it (``in_band``
False, bench/evaluation.py) is left out of its method's line and drawn as a grey-edged cross of its
method's colour, its legend entry saying so: it is not comparable with the rows on target.
matplotlib with the Agg backend (no display needed).

``write_csv``: the rows as CSV, one line per row; list-valued fields are joined with spaces and
the per-round timing lists and per-run metrics are left out (they are in the JSON).

Both write atomically (``report.write_text``, ``report.write_figure``: a temporary file, then os.replace).
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .report import write_figure, write_text

#: CSV columns, in order; extra keys of the rows are appended after these.
CSV_COLUMNS = (
    "label", "method", "kind", "spec", "budget", "metric", "value", "value_std", "drop", "top1", "top1_std",
    "top1_drop", "n_runs", "seeds", "macs",
    "gmacs", "macs_speedup", "img_per_s", "img_per_s_iqr", "latency_ms", "latency_ms_iqr", "speedup", "in_band",
    "latency_speedup", "tokens_per_block", "schedule_origin",
)
_SKIP = {"runs", "metrics", "img_per_s_runs", "latency_ms_runs"}
_MARKERS = "osD^vP<>Xhp*"
OFF_TARGET = "measured off target"  # the series of a method's rows measured outside the band of their target


def _cell(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    return "" if v is None else v


def write_csv(path: str | os.PathLike, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` as CSV (atomically). Returns the path."""
    extra = sorted({k for r in rows for k in r} - set(CSV_COLUMNS) - _SKIP)
    columns = [c for c in CSV_COLUMNS if any(c in r for r in rows)] + extra
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        writer.writerow([_cell(r.get(c)) for c in columns])
    return write_text(path, buf.getvalue())


def _series(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(method, kind) -> its rows sorted by measured speed-up (rows without one are skipped), and
    (method, OFF_TARGET) -> its rows measured outside the band of their target."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "unpatched" or r.get("speedup") is None or r.get("value") is None:
            continue
        out.setdefault((r["method"], OFF_TARGET if r.get("in_band") is False else r["kind"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["speedup"]) for k, v in out.items()}


def plot_pareto(path: str | os.PathLike, rows: Sequence[dict[str, Any]], title: str = "") -> Path:
    """Write the metric vs measured speed-up PNG for ``rows`` (as from ``evaluate_cases``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = next((r["metric"] for r in rows if r.get("metric")), "value")
    series = _series(rows)
    methods = sorted({m for m, _ in series})
    colours = plt.get_cmap("tab10")
    style = {m: (colours(i % 10), _MARKERS[i % len(_MARKERS)]) for i, m in enumerate(methods)}
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for (method, kind), pts in sorted(series.items()):
        colour, marker = style[method]
        tuned = kind == "fine-tuned"
        xs = [r["speedup"] for r in pts]
        ys = [r["value"] for r in pts]
        errs = [r.get("value_std") or 0.0 for r in pts]
        if kind == OFF_TARGET:
            ax.plot(xs, ys, marker="X", color=colour, markeredgecolor="grey", markersize=9, linestyle="none",
                    label=f"{method}: {OFF_TARGET} (not comparable)")
            continue
        ax.errorbar(xs, ys, yerr=errs if any(errs) else None, color=colour, marker=marker,
                    linestyle="--" if tuned else "-", markerfacecolor="none" if tuned else colour,
                    markersize=7, capsize=3, linewidth=1.3, label=f"{method} (fine-tuned)" if tuned else method)
    for r in rows:
        if r.get("kind") == "unpatched" and r.get("value") is not None:
            ax.plot([1.0], [r["value"]], marker="*", color="black", markersize=14, linestyle="none",
                    label=f"unpatched ({metric} {r['value']:.2f})")
    ax.set_xlabel("measured speed-up (img/s vs unpatched, same run)")
    ax.set_ylabel(metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return write_figure(fig, path, dpi=120)

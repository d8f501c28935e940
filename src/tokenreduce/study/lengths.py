"""The fine-tune length (studies/beds.py, ``LENGTH``): each claim of a study bed tested at more than one
length (``beds.at_longer``: the same words and grid point but for ``steps``) side by side, its verdict stated
at the longest, and one figure per bed of each claim's paired difference against fine-tune steps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .declare import Expect, Study
from .figures import pyplot, set_title, write_png
from .stats import summarize, welch_change
from .tables import (
    INTERVAL,
    NOT_RUN,
    Judged,
    axis,
    ci_text,
    interval_text,
    measured,
    table_head,
    table_row,
    where_text,
    word,
)

AXIS = "steps"


def length(study: Study, at: dict[str, Any]) -> Any | None:
    """The fine-tune length of grid point ``at``: the one it names, else the length axis's implicit one (the
    length a claim or record that names none is at, studies/beds.py ``LENGTH``); None without the axis."""
    a = axis(study, AXIS)
    return None if a is None else at.get(AXIS, a.implicit)


def apart(at: dict[str, Any]) -> dict[str, Any]:
    """A claim's grid point apart from its fine-tune length."""
    return {k: v for k, v in at.items() if k != AXIS}


def _grouped(study: Study, judged: list[Judged]) -> list[list[tuple[Any, Judged]]]:
    """Each of the ``judged`` claims tested at more than one length: its (steps, judged) in increasing steps."""
    if length(study, {}) is None:  # no length axis
        return []
    groups: dict[tuple, list[tuple[Any, Judged]]] = {}
    for j in judged:
        e = j.expect
        key = (e.claim, e.arm, e.baseline, tuple(sorted(apart(e.at).items())))
        groups.setdefault(key, []).append((length(study, e.at), j))
    return [sorted(g, key=lambda sj: sj[0]) for g in groups.values() if len(g) > 1]


def point(study: Study, e: Expect) -> str:
    """Where claim ``e`` is tested, as the tables print it: its grid point, with the fine-tune length named
    where the study has the length axis (a claim that names none is tested at the axis's implicit one)."""
    steps = length(study, e.at)
    return where_text(e.at if steps is None else {**e.at, AXIS: steps})


def stated(group: list[tuple[Any, Judged]]) -> str:
    """The claim's verdict at the longest length run with two seeds or more (a later one-seed length named
    apart), the change of its mean paired difference from each shorter length (Welch: other runs), and where
    its t-interval lies on one side of 0 at one length and on the other at another, whatever the verdicts."""
    ran = [(s, j) for s, j in group if j.verdict is not None]
    if not ran:
        return NOT_RUN
    run = [(s, j) for s, j in ran if j.verdict.n >= 2]  # one seed is no test: stated apart, not as a change
    single = [str(s) for s, j in ran if j.verdict.n < 2 and (not run or s > run[-1][0])]
    note = f"; at {', '.join(single)} steps one seed so far, no test yet" if single else ""
    if not run:
        return f"**{word(ran[-1][1])}** at {ran[-1][0]} steps (one seed so far, no test yet)"
    last, long = run[-1]
    text = f"**{word(long)}** at {last} steps"
    for first, short in run[:-1]:  # the dose-response: the change of effect, tested, not the words compared
        change = welch_change(short.diffs, long.diffs)
        if change is not None:
            d, lo, hi, p = change
            text += (f"; from {first} steps its Δ changes by {d:+.2f} {interval_text((lo, hi))}, Welch p = {p:.2g} "
                     "(the interaction with length, before multiplicity)")
    sides = [(s, 1 if ci[0] > 0 else -1) for s, j in run if (ci := j.verdict.interval) and (ci[0] > 0 or ci[1] < 0)]
    if {side for _, side in sides} == {-1, 1}:
        where = ", ".join(f"{'above' if side > 0 else 'below'} 0 at {s} steps" for s, side in sides)
        text += f"; the difference reverses: its t-interval lies {where} (before multiplicity)"
    return text + note


def pool_text(doc: dict[str, Any]) -> str:
    """What a training record trained on and was scored on, in words (its config's subset, its metrics' n)."""
    subset, n = doc.get("config", {}).get("subset"), doc.get("metrics", {}).get("n_eval")
    trained = f"{subset} training scenes" if subset else "all training scenes"
    return trained + (f", scored on {int(n)} test scenes" if n else "")


def _pools(study: Study, runs: dict[str, dict], lengths: list[Any]) -> str:
    """What else differs between the lengths, read from a training record at each (the training pool, the
    test set), as a sentence; '' where they agree."""
    said: dict[Any, str] = {}
    for p in study.points():
        s = length(study, p.values)
        if s in lengths and s not in said and p.id in runs and runs[p.id].get("config"):
            said[s] = pool_text(runs[p.id])
    if len(set(said.values())) < 2:
        return ""
    return ("Besides the steps, the lengths differ in what they train on and are scored on: "
            + "; ".join(f"{s} steps: {t}" for s, t in sorted(said.items())) + ".")


def section(study: Study, runs: dict[str, dict], judged: list[Judged], root: Path, slug: str) -> list[str]:
    """The report's lines for ``study``'s claims at several lengths (none if it has none; ``judged``: its
    claims as the report judged them), with the figure ``root``/figures/``slug``-lengths.png."""
    groups = _grouped(study, judged)
    if not groups:
        return []
    lengths = sorted({s for g in groups for s, j in g})
    head = ["claim", "where", *(c for s in lengths for c in (f"Δ at {s} steps", f"interval at {s}", f"verdict at {s}")),
            "stated"]
    pools = _pools(study, runs, lengths)
    lines = ["### Over the fine-tune length", "", *([pools, ""] if pools else []), *table_head(head)]
    for g in groups:
        e, at = g[0][1].expect, dict(g)
        cells = [c for s in lengths for c in ((measured(at[s]), ci_text(at[s]), word(at[s])) if s in at
                                              else ("-", "-", "-"))]
        lines.append(table_row([e.claim, where_text(apart(e.at)), *cells, stated(g)]))
    fig = _figure(study, groups, root / "figures" / f"{slug}-lengths.png")
    if fig is not None:
        lines += ["", f"![{slug} over the fine-tune length](figures/{fig.name})"]
    return [*lines, ""]


def _figure(study: Study, groups: list[list[tuple[Any, Judged]]], path: Path) -> Path | None:
    """Each claim's paired difference against fine-tune steps: the mean over seeds with the paired t-interval
    its verdict rests on (a point alone where one seed is run); None before any run."""
    if not any(j.diffs for g in groups for _, j in g):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, g in enumerate(groups):
        nudge = 1.05 ** (i - (len(groups) - 1) / 2)  # side by side on the log axis, so the intervals do not hide
        steps = [s * nudge for s, _ in g]
        means = [m if (m := summarize(j.diffs).mean) is not None else math.nan for _, j in g]
        cis = [j.verdict.interval if j.verdict and j.verdict.interval else (m, m)
               for (_, j), m in zip(g, means, strict=True)]
        yerr = list(zip(*[(m - lo, hi - m) for m, (lo, hi) in zip(means, cis, strict=True)], strict=True))
        e = g[0][1].expect
        ax.errorbar(steps, means, yerr=yerr, marker="o", capsize=3,
                    label=", ".join([f"{e.arm} - {e.baseline}", *(f"{k} {v}" for k, v in apart(e.at).items())]))
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xticks(sorted({s for g in groups for s, _ in g}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("fine-tune steps (batch 64)")
    ax.set_ylabel(f"paired difference, {g[0][1].expect.metric}\n(mean, {INTERVAL})")
    set_title(fig, f"{study.heading}: each claim's difference over the fine-tune length")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return write_png(fig, path)

"""A study's tables and verdicts, rendered from its run JSONs (and nothing else).

``summary(study, runs)`` is the markdown ``tokenreduce study NAME --summarize`` prints and writes to
``<results>/summary.md``; ``verdicts(study, runs)`` judges each declared expectation
(experiments/stats.py); the report page (experiments/page.py) reuses both. A run without a JSON
shows as "not run" with the reason, never as a number.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import stats
from .study import Expect, Study

NOT_RUN = "not run"


def _metric(doc: dict[str, Any], metric: str) -> float | None:
    v = doc.get("metrics", {}).get(metric)
    return float(v) if isinstance(v, (int, float)) else None


def _seeds(study: Study) -> tuple[Any, ...]:
    return next(a.values for a in study.axes() if a.name == "seed")


def _split_values(study: Study) -> list[Any]:
    if study.split is None:
        return [None]
    return list(next(a.values for a in study.axes() if a.name == study.split[0]))


def _runs_of(study: Study, runs: dict[str, dict], arm: str, at: dict[str, Any]) -> dict[Any, dict]:
    """seed -> doc of ``arm``'s runs at ``at`` that have a JSON."""
    at = study.complete(at)
    return {p.values["seed"]: runs[p.id] for p in study.points() if p.arm == arm and p.matches(at) and p.id in runs}


def values(study: Study, runs: dict[str, dict], arm: str, metric: str, at: dict[str, Any]) -> list[float]:
    """``metric`` of each of ``arm``'s runs at ``at`` that has it, in seed order."""
    return [v for d in _runs_of(study, runs, arm, at).values() if (v := _metric(d, metric)) is not None]


def paired(study: Study, runs: dict[str, dict], arm: str, base: str, metric: str,
           at: dict[str, Any]) -> list[float]:
    """Per seed with both runs: ``arm`` minus ``base`` on ``metric`` at ``at``."""
    mine, theirs = _runs_of(study, runs, arm, at), _runs_of(study, runs, base, at)
    out = []
    for seed in _seeds(study):
        if seed in mine and seed in theirs:
            a, b = _metric(mine[seed], metric), _metric(theirs[seed], metric)
            if a is not None and b is not None:
                out.append(a - b)
    return out


def arm_table(study: Study, runs: dict[str, dict], at: dict[str, Any]) -> list[str]:
    """One row per arm at ``at``: each column's mean ± std over the seeds run (Δ columns paired by seed)."""
    headers = ["arm", "seeds", *(c.header for c in study.columns)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    planned = _seeds(study)
    split = study.split[0] if study.split else None
    extra = [a for a in study.axes() if a.name not in ("seed", split)]  # one row per arm and value of each
    for name, arm in study.arms.items():
        for combo in itertools.product(*(a.values for a in extra)):
            here = {**at, **{a.name: v for a, v in zip(extra, combo, strict=True)}}
            if not study.runs_at(name, here):
                continue
            label = arm.label + "".join(f" ({a.name} {v})" for a, v in zip(extra, combo, strict=True)
                                        if v != a.implicit and len(a.values) > 1)
            lines.append(_arm_row(study, runs, name, label, here, planned))
    return lines


def _arm_row(study: Study, runs: dict[str, dict], name: str, label: str, at: dict[str, Any],
             planned: tuple[Any, ...]) -> str:
    docs = _runs_of(study, runs, name, at)
    if not docs:
        return f"| {label} | {NOT_RUN}: no run JSON |" + f" {NOT_RUN} |" * len(study.columns)
    missing = [s for s in planned if s not in docs]
    seeds = ", ".join(str(s) for s in docs) + (f" ({', '.join(map(str, missing))} {NOT_RUN})" if missing else "")
    cells = []
    for c in study.columns:
        if c.paired:
            cells.append("-" if name == study.baseline else
                         stats.summarize(paired(study, runs, name, study.baseline, c.metric, at)).text())
        else:
            cells.append(stats.summarize(values(study, runs, name, c.metric, at)).text())
    return f"| {label} | {seeds} | " + " | ".join(cells) + " |"


def measure_table(decl, doc: dict[str, Any] | None) -> list[str]:
    if doc is None:
        return [f"{NOT_RUN}: no run JSON for {decl.name}"]
    lines = ["| " + " | ".join(c.header for c in decl.columns) + " |", "|" + "---|" * len(decl.columns)]
    for r in doc["result"]["results"]:
        lines.append("| " + " | ".join(c.fmt.format(r[c.metric]) if r.get(c.metric) is not None else "-"
                                       for c in decl.columns) + " |")
    return lines


def bench_table(decl, doc: dict[str, Any] | None) -> list[str]:
    """A bench's table as the ``bench`` command prints it (the same columns, the same cells), under the
    line that says what was timed how."""
    from ..bench.compare import COLUMNS
    from ..bench.report import format_table

    if doc is None:
        return [f"{NOT_RUN}: no run JSON for {decl.name}"]
    result = doc["result"]
    model, settings, prov = result["model"], result["settings"], result["provenance"]
    weights = f"the trained {model['reference']}" if model.get("reference") else "random weights"
    h, w = model["img_size"]
    said = (f"{model['name']} ({h}x{w}, {weights}), batch {settings['batch']} (latency: batch 1), "
            f"{settings['warmup']} warm-up + {settings['repeats']} timed rounds, {prov['threads']} threads, "
            f"{prov['device']} {prov['dtype']}, backend {settings.get('backend', 'eager')}")
    return [said, "", "```", format_table(result["results"], list(decl.columns) or COLUMNS), "```"]


def bench_comparison(decl, runs: dict[str, dict]) -> list[str]:
    """A :class:`~.study.BenchTable`: per spec (and the control) each bench's speed-ups, unpatched and
    matched random, as "batch B / batch 1" to 2 decimals; a cell the bench lacks is empty."""
    missing = [n for n in decl.benches if n not in runs]
    if missing:
        return [f"{NOT_RUN}: no run JSON for {', '.join(missing)}"]
    rows = {n: {r["label"]: r for r in runs[n]["result"]["results"]} for n in decl.benches}
    first = runs[decl.benches[0]]["result"]["results"]

    def pair(r: dict | None, a: str, b: str) -> str:
        return f"{r[a]:.2f} / {r[b]:.2f}" if r and r.get(a) is not None and r.get(b) is not None else ""

    lines = ["| " + " | ".join(decl.headers) + " |", "|" + "---|" * len(decl.headers)]
    for r in first:
        if r["kind"] not in ("control", "method"):
            continue
        label = f"control `{r['spec']}`" if r["kind"] == "control" else f"`{r['label']}`"
        cells = [label]
        for n in decl.benches:
            mine = rows[n].get(r["label"])
            cells += [pair(mine, "speedup", "latency_speedup"), pair(mine, "ratio_vs_random", "latency_vs_random")]
        lines.append(" ".join(["|", *(f"{c} |" if c else "|" for c in cells)]))
    return lines


def probe_text(decl, doc: dict[str, Any] | None) -> list[str]:
    from .entries import report_probe

    if doc is None:
        return [f"{NOT_RUN}: no run JSON for {decl.name}"]
    result = dict(doc["result"])
    if result.get("checkpoint"):  # where it was on the machine that ran it: its last two parts say which
        p = Path(result["checkpoint"])
        result["checkpoint"] = f"{p.parent.name}/{p.name}"
    return [report_probe(doc["experiment"], result)]


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Judged:
    """An expectation, its paired differences and the verdict on them (None: not run, ``why``)."""

    expect: Expect
    diffs: list[float]
    verdict: stats.Verdict | None
    why: str


def verdicts(study: Study, runs: dict[str, dict]) -> list[Judged]:
    out = []
    for e in study.expect:
        diffs = paired(study, runs, e.arm, e.baseline, e.metric, e.at)
        if not diffs:
            out.append(Judged(e, diffs, None, f"{NOT_RUN}: no seed has both {e.arm} and {e.baseline}"))
            continue
        v = stats.verdict(diffs, direction=e.direction, margin=e.margin, level=e.level, effect=e.effect)
        out.append(Judged(e, diffs, v, v.why))
    return out


def _where(e: Expect) -> str:
    return ", ".join(f"{k} {v}" for k, v in e.at.items())


def measured(j: Judged) -> str:
    if j.verdict is None:
        return NOT_RUN
    t = j.verdict.test
    text = stats.Summary(t.n, t.mean, t.std).text()
    return text if t.std is None else f"{text} (n = {t.n})"  # one value's text names its n already


def ci_text(j: Judged) -> str:
    ci = j.verdict.ci if j.verdict else None
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "-"


def verdict_table(study: Study, runs: dict[str, dict]) -> list[str]:
    lines = ["| claim | where | contrast | published | measured Δ (mean ± std) | 95% bootstrap CI | verdict |",
             "|---|---|---|---|---|---|---|"]
    judged = verdicts(study, runs)
    for j in judged:
        e = j.expect
        side = ">" if e.direction > 0 else "<"
        lines.append(f"| {e.claim} | {_where(e) or '-'} | {e.arm} - {e.baseline} {side} {e.margin:g} on {e.metric} "
                     f"| {e.published or '-'} | {measured(j)} | {ci_text(j)} | "
                     f"**{j.verdict.word if j.verdict else NOT_RUN}** |")
    lines.append("")
    for j in judged:
        lines.append(f"- {j.expect.claim} ({_where(j.expect) or 'all'}): {j.why}.")
    ns = sorted({j.verdict.test.n for j in judged if j.verdict and j.verdict.test.df > 0})  # n = 1: no test, no df
    if ns and ns[0] <= 5:
        lines += ["", f"With n = {ns[0]} seeds a one-sided paired t-test has {ns[0] - 1} degree(s) of freedom "
                  f"(t at 0.95: {stats.t_ppf(0.95, ns[0] - 1):.2f}): it resolves only differences several times "
                  "their seed-to-seed spread (the smallest detectable difference is given per claim above); "
                  "'inconclusive' says the test could not tell, not that there is no effect. The bootstrap "
                  f"interval of {ns[0]} values takes few distinct values and is shown for orientation only."]
    return lines


# ----------------------------------------------------------------------------- the summary

#: the schedule fields a study may lay over a named recipe (e.g. the scene bed's shortened fine-tune)
_SCHEDULE = ("epochs", "subset", "batch_size")


def recipe_text(recipe: dict[str, Any]) -> str:
    """The recipe a study trains with, in words: its name, and its schedule when the study changed the
    recipe's ("fmnist-cropr, schedule changed: 1 epoch(s) of 6400 training items, batch 64")."""
    from ..train.recipes import RECIPES

    name = recipe.get("recipe")
    if not name:
        return "recipe"
    if all(recipe.get(k) == RECIPES.get(name, {}).get(k) for k in _SCHEDULE):
        return name
    subset = f" of {recipe['subset']} training items" if recipe.get("subset") else ""
    return f"{name}, schedule changed: {recipe.get('epochs')} epoch(s){subset}, batch {recipe.get('batch_size')}"


def machines_text(runs: dict[str, dict]) -> list[str]:
    """Where the training runs were made, when on more than one machine (their wall times compare only
    within one), and each run made again in place of an earlier one (``Runner._checkpoint``)."""
    trained = {rid: d for rid, d in runs.items() if d.get("kind") == "train"}
    cpus = Counter(d["metrics"].get("provenance", {}).get("cpu") or "unknown" for d in trained.values())
    lines = []
    if len(cpus) > 1:
        parts = "; ".join(f"{cpu}: {n} run{'s' if n > 1 else ''}" for cpu, n in sorted(cpus.items()))
        lines.append(f"The training runs were made on {len(cpus)} machines ({parts}); wall times compare within "
                     "one machine only.")
    for rid, d in sorted(trained.items()):
        old = d.get("replaces")
        if old:
            metric = d["metrics"]["metric"]
            lines.append(f"{rid} was made again ({old['why']}): {metric} {d['metrics'][metric]:.2f} on "
                         f"{d['metrics']['provenance'].get('cpu')}, in place of {old['metrics'][metric]:.2f} on "
                         f"{old.get('cpu')}.")
    return [*lines, ""] if lines else []


def summary(study: Study, runs: dict[str, dict]) -> str:
    """The study's markdown: arm tables per split value, measures, probes, benches, verdicts."""
    lines = [f"## Arms ({recipe_text(study.recipe)}) on {study.bed.text()}", ""] if study.arms else []
    missing = [p.id for p in study.points() if p.id not in runs]
    if missing and study.pending:
        lines += [f"{len(missing)} of {len(study.points())} runs {NOT_RUN}: {study.pending}.", ""]
    for value in _split_values(study) if study.arms else []:
        at = {study.split[0]: value} if study.split else {}
        if study.split:
            lines += [f"### {study.split[1].format(value)}", ""]
        lines += [*arm_table(study, runs, at), ""]
    lines += machines_text(runs)
    for m in study.measures:
        lines += [f"## {m.title or m.name}", "", *measure_table(m, runs.get(m.name)), ""]
    for p in study.probes:
        if p.fmnist_only and not study.bed.fmnist():
            lines += [f"## {p.title or p.name}", "", f"{NOT_RUN}: it reads Fashion-MNIST's raw images; the test "
                      f"bed is {study.bed.text()}", ""]
            continue
        lines += [f"## {p.title or p.name}", "", *probe_text(p, runs.get(p.name)), ""]
    for t in study.bench_tables:
        lines += [f"## {t.title}", "", *bench_comparison(t, runs), ""]
    for b in study.benches:
        lines += [f"## {b.title or b.name}", "", *bench_table(b, runs.get(b.name)), ""]
    if study.expect:
        lines += ["## Verdicts", "", *verdict_table(study, runs), ""]
    return "\n".join(lines).rstrip() + "\n"

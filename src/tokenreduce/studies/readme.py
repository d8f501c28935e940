"""The README's generated tables (between its report:headline markers, written by ``tokenreduce report``): the
baselines' picks on the scene test bed with each contrast's interval and verdict, and the DeiT-S speed-ups. They
read two studies by name, so they live with the declarations, not in the engine that renders any study."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..study import lengths, tables
from ..study.declare import get_study
from ..study.page import stored
from ..study.stats import summarize
from ..study.tables import NOT_RUN, Judgement, measured, table_head, table_row, word


def headline(root: Path, judgement: Judgement | None = None) -> list[str]:
    """The README's tables, read from the records: each baseline's 1.5x and 2x pick on the scene bed
    (the study ``baselines``, its ``final`` measure and its runs) with each contrast's interval and verdict
    (``judgement``: the report's; by default the study's own), and the DeiT-S speed-ups (``deit_bench``)."""
    study = get_study("baselines")("scenes")
    runs = stored(root, study)
    if (final := runs.get("final")) is None:
        return [f"{NOT_RUN}: no run JSON under `{study.key}/runs/`."]
    judgement = judgement or tables.bed_judgement(study, runs)
    prov, recipe = final["provenance"], study.recipe
    # each pick's rows (a random pick's seeds are rows of their own): one line, the median
    speed = {arm: rows for arm, rows in tables.arm_rows(study, runs, "final").items() if not arm.startswith("random~")}
    judged = {(j.expect.arm, j.expect.baseline, str(j.expect.at)): j for j in judgement.judged[study.key]
              if not j.members}

    def diff(arm: str, at: dict[str, Any]) -> str:
        j = judged.get((arm, f"random~{arm}", str(at)))
        if j is None or j.verdict is None:
            return "-"
        ci = j.verdict.interval
        return measured(j) + (f" {tables.interval_text(ci)}" if ci else "") + f" {word(j)}"

    def paired_seeds(steps: int) -> list[Any]:
        """The seeds of the longer fine-tune's cells: those with both records for some pick."""
        return sorted({seed for arm in speed if f"random~{arm}" in study.arms for seed in
                       tables.paired_by_seed(study, runs, arm, f"random~{arm}", "top1", {lengths.AXIS: steps})})

    def pool(at: dict[str, Any]) -> str:
        docs = [d for arm in speed for d in tables.arm_runs(study, runs, arm, at).values()]
        return lengths.pool_text(docs[0]) if docs else ""

    # the longer fine-tunes with a paired record: a column each, so a verdict that turns with training shows here
    axis = tables.axis(study, lengths.AXIS)
    longer = [s for s in axis.values if s != axis.implicit
              and any(diff(arm, {lengths.AXIS: s}) != "-" for arm in speed)]
    lines = [f"Each method's pick nearest 1.5x and 2x speed-up on the scene test bed: chosen once by a measured "
             f"budget search on an earlier 2-core machine (not recorded; the picks are fixed in the study), so a "
             f"pick's speed-up here may miss its target: the column shows it as measured in one interleaved run on "
             f"{prov.get('cpu')}, {prov.get('threads')} threads. Fine-tuned "
             f"({recipe['subset'] // recipe['batch_size'] * recipe['epochs']} steps of {recipe['batch_size']}: "
             f"{pool({})}; seeds "
             f"{', '.join(map(str, tables.planned_seeds(study)))}; mean ± std), against the random pruner at the "
             f"same per-block token counts (Δ, paired by seed, its 95% t-interval and verdict after multiplicity; "
             f"[`tokenreduce study baselines`](results/REPORT.md))"
             + "".join(f"; Δ after {s} steps: the same contrast fine-tuned for {s} steps "
                       f"({pool({lengths.AXIS: s})}; seeds {', '.join(map(str, paired_seeds(s)))})" for s in longer)
             + ":", ""]
    lines += table_head(["pick", "MACs x", "speed-up b32", "top-1 %", "Δ vs random at its counts",
                                *(f"Δ after {s} steps" for s in longer)])
    for arm, rows in speed.items():
        macs, up = (statistics.median(r[k] for r in rows) for k in ("macs_speedup", "speedup"))
        top1 = summarize(tables.values(study, runs, arm, "top1", {})).text()
        cells = [arm, f"{macs:.2f}", f"{up:.2f}", top1, diff(arm, {}), *(diff(arm, {lengths.AXIS: s}) for s in longer)]
        lines.append(table_row(cells))
    bench = stored(root, get_study("deit_bench")()).get("deit_small")
    if bench is not None:
        lines += ["", f"DeiT-S (random weights) at the papers' schedules, one interleaved run on "
                      f"{bench['provenance'].get('cpu')}, {bench['result']['settings'].get('batch')} images a batch "
                      "([`tokenreduce study deit_bench`](results/REPORT.md)):", "",
                  *table_head(["spec", "speed-up b32", "speed-up b1", "vs random at its counts b32"])]
        ratios = ("speedup", "latency_speedup", "ratio_vs_random")
        lines += [table_row([f"`{row['label']}`", *(f"{row[k]:.2f}" for k in ratios)])
                  for row in bench["result"]["results"] if row["kind"] == "method"]
    return lines

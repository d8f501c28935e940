"""``tokenreduce report``: every registered study on one page, results/REPORT.md, with PNG figures, read
from the stored run JSONs of each study's own test bed alone (study/tables.py renders the tables). The page
holds no time stamp and no absolute path, and the PNGs no software or date metadata, so the same JSONs give
the same bytes. A study without results says "not run"."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..bench.report import revision_gap, write_text
from ..core.errors import TokenReduceError
from . import history, lengths, tables
from .declare import POWER, Study, get_study, list_studies
from .figures import colours, pyplot, set_title, write_png
from .plan import Layout, plan
from .records import load_runs
from .stats import summarize
from .tables import NOT_RUN, Judgement, judge, summary


def provenance_text(runs: dict[str, dict]) -> str:
    """The versions, machines and revisions the runs' ``provenance`` records."""
    seen: dict[str, set[str]] = {"tokenreduce git": set(), "torch": set(), "timm": set(), "machine": set()}
    for doc in runs.values():
        prov = doc.get("provenance") or {}
        seen["tokenreduce git"].add(str(prov.get("git_revision", prov.get("git")) or "not recorded"))
        for lib in ("torch", "timm"):
            seen[lib].add(str(prov.get(lib)))
        cpu = prov.get("gpu") or prov.get("cpu") or prov.get("machine")
        seen["machine"].add(f"{cpu}, {prov.get('cpu_count')} cores, {prov.get('threads')} threads")
    return "; ".join(f"{k} {' / '.join(sorted(v))}" for k, v in seen.items() if v)


def provenance_note(runs: dict[str, dict]) -> str:
    """What the runs' recorded git revisions say against reproducing them: made from uncommitted code
    (``-dirty``) or without a revision (bench.report.revision_gap); '' if neither. A claim reading such a
    record is decided only provisionally (:func:`~.tables.word`)."""
    gaps = Counter(revision_gap(doc) for doc in runs.values())
    said = [f"{gaps['dirty']} of its {len(runs)} runs were made from uncommitted code (a git revision ending "
            "`-dirty`): the code that made them is not in the history exactly"] if gaps["dirty"] else []
    said += [f"{gaps['none']} of its {len(runs)} runs record no git revision"] if gaps["none"] else []
    return "; ".join(said) + "." if said else ""


def figure(study: Study, runs: dict[str, dict], path: Path) -> Path | None:
    """Bars of the study's first column metric per arm (mean ± std over seeds), one group per split value."""
    if not study.columns or not runs:
        return None
    plt = pyplot()
    metric, header = study.columns[0].metric, study.columns[0].header
    splits = tables.split_points(study)
    n = len(study.arms)  # the legend, one line per arm, stands right of the bars: as tall as it needs
    fig, ax = plt.subplots(figsize=(10, max(3.6, 0.16 * n + 1.0)), layout="constrained")
    width = 0.8 / max(1, n)
    for i, ((name, arm), colour) in enumerate(zip(study.arms.items(), colours(n), strict=True)):
        done = [summarize(tables.values(study, runs, name, metric, at)) for _, at in splits]
        means = [s.mean if s.mean is not None else math.nan for s in done]  # not run: no bar, never a zero
        stds = [s.std or 0.0 for s in done]
        xs = [j + i * width for j in range(len(splits))]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=arm.label, color=colour)
    ax.set_xticks([j + width * (n - 1) / 2 for j in range(len(splits))])
    ax.set_xticklabels([study.split[1].format(v) if study.split else "" for v, _ in splits])
    ax.set_ylabel(header)
    set_title(fig, f"{study.heading}: mean ± std over seeds")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return write_png(fig, path)


def budget_text(budget: tuple[tuple[int, str, float], ...]) -> str:
    """A bed's compute plan (``Bed.budget``: runs, kind, minutes a run) as the page says it, with its total."""
    parts = [f"{n} {kind} run{'s' * (n != 1)} x {minutes:.3g} min" for n, kind, minutes in budget]
    total = sum(n * minutes for n, _, minutes in budget)
    return " + ".join(parts) + (f": about {total:.0f} min planned" if total < 120 else
                                f": about {total / 60:.1f} h planned")


def as_run(study: Study, runs: dict[str, dict]) -> str:
    """What the stored training runs cost: their recorded training wall time summed, per fine-tune length
    where the bed has that axis ("" before any). Wall time includes whatever shared the cores."""
    by: dict[Any, list[float]] = {}
    for doc in runs.values():
        t = doc.get("metrics", {}).get("train_time_s") if doc.get("kind") == "train" else None
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            by.setdefault(lengths.length(study, doc.get("point", {})), []).append(t)
    if not by:
        return ""
    parts = [f"{'' if k is None else f'{k} steps: '}{len(ts)} run{'s' * (len(ts) != 1)}, {sum(ts) / 60:.0f} min"
             for k, ts in sorted(by.items(), key=lambda kv: kv[0] or 0)]  # lengths, or one None
    return f"as run: {'; '.join(parts)} of training wall time summed"


def study_section(study: Study, runs: dict[str, dict], root: Path, judgement: Judgement) -> list[str]:
    slug = study.key.replace("/", "-")
    lines = [f"## {study.heading}", "", f"Claim: {study.claim}. Source: {study.source}.", "",
             f"- test bed `{study.bed_name}`: {study.bed.text()}" if study.arms else
             f"- test bed `{study.bed_name}`: each bench's own model (it trains nothing)",
             f"- command: `tokenreduce study {study.name}"
             f"{'' if study.is_default_bed else f' --testbed {study.bed_name}'}` (`--list` for one command per run; "
             "`--smoke` for the tiny version)",
             f"- runs: {len(runs)} of {len(plan(study))} stored under `{study.key}/runs/`"
             + (f"; budget: {budget_text(study.budget)}" if study.budget else "")
             + (f"; {cost}" if (cost := as_run(study, runs)) else "")]
    if not runs:  # figures drawn from records deleted since go with them
        for stale in [root / "figures" / f"{slug}.png", *(root / "figures").glob(f"{slug}-*.png")]:
            stale.unlink(missing_ok=True)
        why = study.pending or f"no run JSON under `{study.key}/runs/`"
        return [*lines, "", f"{NOT_RUN}: {why}.", ""]
    note = provenance_note(runs)
    lines.append(f"- provenance: {provenance_text(runs)}" + (f"[^{slug}]" if note else ""))
    fig = figure(study, runs, root / "figures" / f"{slug}.png")
    if fig is not None:
        lines += ["", f"![{slug}](figures/{fig.name})"]
    body = "\n" + summary(study, runs, judgement)  # its headings one level down, under the study's
    body = body.replace("\n### ", "\n#### ").replace("\n## ", "\n### ")
    return [*lines, body, *lengths.section(study, runs, judgement.judged[study.key], root, slug),
            *([f"[^{slug}]: Provenance: {note}", ""] if note else [])]


def claims_table(studies: list[tuple[Study, dict[str, dict]]], judgement: Judgement) -> list[str]:
    head = tables.table_head(["study", "claim", "where", "source", "published", "measured here (Δ)", tables.INTERVAL,
                              "p raw / adjusted", "verdict", "test bed"])
    return head + [tables.table_row([study.name, j.claim, lengths.point(study, j.expect), j.expect.source,
                                     *tables.result_cells(j), study.bed_name])
                   for study, _ in studies for j in judgement.judged[study.key]]


#: the report's account of its statistics, above the claims
METHODS = ("How the verdicts are reached: each claim is a paired contrast (arm minus baseline, paired by seed) "
           "tested by the paired t-test its study declares. " + tables.STATISTICS +
           " Multiplicity: p-values are adjusted by Holm within each study (all its test beds' tests together) and by "
           "Benjamini-Hochberg over the whole report, each over the confirmatory tests declared, run or not (a test "
           "not yet run counts at p = 1, so a run that arrives never weakens another verdict); the verdict comes from "
           "the larger adjusted p, the raw p is shown beside it. A claim declared for several methods is also tested "
           "as one family claim, seeds as the unit. Every \"costs nothing / at or above / keeps\" claim is a "
           "non-inferiority test against a declared margin, given with its reason. Where runs store per-item results "
           "an interval over seeds and test items is shown beside the t-interval: every seed is scored on the same "
           "items, so seeds and items cross, and the interval adds the variance of the items the seeds share to the "
           "seed t-interval's (a two-way random-effects model; its coverage is checked by simulation at 3 seeds x "
           "10 000 items).")


def methods(studies: list[tuple[Study, dict[str, Any]]]) -> str:
    """:data:`METHODS`, how many training records store per-item results (read from them), and which claims
    declared a power plan before their runs (the rest: post hoc)."""
    planned = [s.name for s, _ in studies if any(e.power is not None for e in s.expect)]
    before = (f"Power plans declared before the runs (the n of seeds that gives {POWER:.0%} power at the level "
              "the claim is decided at, its level over the tests of its Holm family, beside the n run): "
              f"the longer fine-tunes of {', '.join(dict.fromkeys(planned))}. Elsewhere no plan was declared: "
              if planned else "No study here declared a power plan before its runs: ")
    trained = [d for _, runs in studies for d in runs.values() if d.get("kind") == "train"]
    held = sum(bool(d.get("metrics", {}).get("items")) for d in trained)
    text = (f"{METHODS} Per-item results: {held} of the {len(trained)} training records store them; a claim whose "
            f"records hold none has the seed-level interval only, and its study's verdict notes say so. {before}where "
            "a claim gives a published effect, the power its n had for it at the observed sd is stated, labelled post "
            "hoc.")
    # the fine-tune length: the grid axis whose longer values set training fields (one epoch, ten)
    length = next((a for s, _ in studies for a in s.grid if a.sets), None)
    papers = [s.paper_epochs for s, _ in studies if s.paper_epochs]
    if length is None or not papers:
        return text
    one, ten = min(length.sets), max(length.sets)
    schedules = "-".join(map(str, sorted({min(papers), max(papers)})))
    return (f"{text} Fine-tune length: the longest run here is one epoch ({one} steps), against the papers' "
            f"{schedules} epochs, so every verdict is of a short fine-tune; the ten-epoch level ({ten} steps) runs "
            f"on a GPU (`tokenreduce study NAME --where steps={ten} --device cuda`).")


#: the README's generated part lies between these two lines
HEADLINE = ("<!-- report:headline -->", "<!-- /report:headline -->")


def write_headline(readme: Path, lines: list[str]) -> Path:
    """Put ``lines`` between the README's :data:`HEADLINE` markers (the rest of the file unchanged)."""
    text = readme.read_text()
    start, end = text.find(HEADLINE[0]), text.find(HEADLINE[1])
    if start < 0 or end < start:
        raise TokenReduceError(f"{readme} has no {HEADLINE[0]} ... {HEADLINE[1]} block for the generated tables")
    body = "\n".join([HEADLINE[0], *lines, HEADLINE[1]])
    return write_text(readme, text[:start] + body + text[end + len(HEADLINE[1]):])


def stored(root: Path, study: Study) -> dict[str, dict]:
    """The study bed's run records stored under ``root``."""
    return load_runs(Layout(root / study.key, root / study.key / "checkpoints"), study)


def judged_results(root: Path, names: list[str] | None = None
                   ) -> tuple[list[tuple[Study, dict[str, Any]]], Judgement]:
    """Every registered study bed (or those of ``names``) with its runs stored under ``root``, and their
    claims judged together (:func:`~.tables.judge`: Holm within a study, Benjamini-Hochberg over all)."""
    studies = [(study, stored(root, study)) for cls in map(get_study, names or list_studies())
               for study in map(cls, cls.beds)]
    return studies, judge(studies)


def build_report(root: str | Path = "results", names: list[str] | None = None,
                 readme: tuple[str | Path, Callable[[Path, Judgement], list[str]]] | None = None) -> Path:
    """Write ``root``/REPORT.md, ``root``/figures/ and each study bed's summary.md from every study's stored
    runs, and with ``readme`` (the README, the function of ``root`` and the judgement that writes its tables:
    studies/readme.py) its generated tables, after appending what moved to the verdict
    history ``root``/verdicts.json (study/history.py; a broken history stops it before anything is written);
    returns REPORT.md's path."""
    root = Path(root)
    studies, judgement = judged_results(root, names)
    changed = history.what_changed(*history.record(root / history.FILE, studies, judgement), studies, judgement)
    for study, runs in studies:
        if runs or (root / study.key / "summary.md").exists():  # a bed whose records were all deleted: not run
            write_text(root / study.key / "summary.md", summary(study, runs, judgement))
    if readme is not None:
        write_headline(Path(readme[0]), readme[1](root, judgement))
    lines = ["# tokenreduce: the studies", "",
             "Built by `tokenreduce report` from the run JSONs stored under `results/<study>/<test bed>/runs/`: every "
             "number below is read from them; a verdict comes only from the test each study declares, at its "
             "level, with n stated.", "", f"{methods(studies)} Claims: {tables.designation_text(judgement)}.", "",
             "## Claims", "", *claims_table(studies, judgement), "",
             "## What changed", "", *changed, ""]
    for study, runs in studies:
        lines += study_section(study, runs, root, judgement)
    return write_text(root / "REPORT.md", "\n".join(lines).rstrip() + "\n")

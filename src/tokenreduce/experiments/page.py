"""``tokenreduce report``: every registered study on one page, results/REPORT.md, with PNG figures.

Per claim: its source, the published value, the value measured here with its interval, the verdict,
the test bed, the command and the provenance of the runs; per study its tables (experiments/tables.py)
and a figure of its first metric per arm. Everything is read from the stored run JSONs of the
study's own test bed (``results/<study>/runs``); the page holds no time stamp and no absolute path,
and the PNGs carry no software or date metadata, so rebuilding it from the same JSONs gives the same
bytes. A study without results says "not run".
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from .runner import Layout, load_runs, plan
from .study import Study, get_study, list_studies
from .tables import NOT_RUN, _split_values, ci_text, measured, summary, values, verdicts


def provenance_text(runs: dict[str, dict]) -> str:
    """The versions, machines and revisions the runs record (old runs: ``run``; new: ``provenance``)."""
    seen: dict[str, set[str]] = {"tokenreduce git": set(), "torch": set(), "timm": set(), "machine": set()}
    for doc in runs.values():
        prov = doc.get("provenance") or doc.get("run") or {}
        seen["tokenreduce git"].add(str(prov.get("git_revision", prov.get("git")) or "not recorded"))
        seen["torch"].add(str(prov.get("torch")))
        seen["timm"].add(str(prov.get("timm")))
        cpu = prov.get("gpu") or prov.get("cpu") or prov.get("machine")
        seen["machine"].add(f"{cpu}, {prov.get('cpu_count')} cores, {prov.get('threads')} threads")
    return "; ".join(f"{k} {' / '.join(sorted(v))}" for k, v in seen.items() if v)


def figure(study: Study, runs: dict[str, dict], path: Path) -> Path | None:
    """Bars of the study's first column metric per arm (mean ± std over seeds), one group per split value."""
    if not study.columns or not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..bench.report import write_text
    from .stats import summarize

    metric, header = study.columns[0].metric, study.columns[0].header
    splits = _split_values(study)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(1, len(study.arms))
    for i, (name, arm) in enumerate(study.arms.items()):
        means, stds = [], []
        for value in splits:
            at = {study.split[0]: value} if study.split else {}
            s = summarize(values(study, runs, name, metric, at))
            means.append(s.mean if s.mean is not None else math.nan)  # not run: no bar, never a zero
            stds.append(s.std or 0.0)
        xs = [j + i * width for j in range(len(splits))]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=arm.label)
    ax.set_xticks([j + width * (len(study.arms) - 1) / 2 for j in range(len(splits))])
    ax.set_xticklabels([study.split[1].format(v) if study.split else "" for v in splits])
    ax.set_ylabel(header)
    ax.set_title(f"{study.title or study.name}: mean ± std over seeds")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png = io.BytesIO()
    try:  # no Software / date chunks: the same numbers give the same bytes
        fig.savefig(png, format="png", dpi=100, metadata={"Software": None})
    finally:
        plt.close(fig)
    return write_text(path, png.getvalue())


def study_section(study: Study, runs: dict[str, dict], root: Path) -> list[str]:
    lines = [f"## {study.title or study.name}", "", f"Claim: {study.claim}. Source: {study.source}.", "",
             f"- test bed: {study.bed.text()}" if study.arms else "- models: each bench's own (it trains nothing)",
             f"- command: `tokenreduce study {study.name}` (`--list` for one command per run; `--smoke` for the "
             "tiny version)",
             f"- runs: {len(runs)} of {len(plan(study))} stored under `{study.name}/runs/`"
             + (f"; budget: {study.budget}" if study.budget else "")]
    if not runs:
        why = study.pending or f"no run JSON under `{study.name}/runs/`"
        return [*lines, "", f"{NOT_RUN}: {why}.", ""]
    lines.append(f"- provenance: {provenance_text(runs)}")
    fig = figure(study, runs, root / "figures" / f"{study.name}.png")
    if fig is not None:
        lines += ["", f"![{study.name}](figures/{fig.name})"]
    body = "\n" + summary(study, runs)  # its headings one level down, under the study's
    body = body.replace("\n### ", "\n#### ").replace("\n## ", "\n### ")
    return [*lines, body]


def claims_table(studies: list[tuple[Study, dict[str, dict]]]) -> list[str]:
    lines = ["| study | claim | source | published | measured here (Δ) | 95% CI | verdict | test bed |",
             "|---|---|---|---|---|---|---|---|"]
    for study, runs in studies:
        for j in verdicts(study, runs):
            e = j.expect
            lines.append(f"| {study.name} | {e.claim} | {e.source} | {e.published or '-'} | {measured(j)} | "
                         f"{ci_text(j)} | **{j.verdict.word if j.verdict else NOT_RUN}** | {study.bed.text()} |")
    return lines


def build_report(root: str | Path = "results", names: list[str] | None = None) -> Path:
    """Write ``root``/REPORT.md (and ``root``/figures/) from every study's stored runs; returns its path."""
    from ..bench.report import write_text

    root = Path(root)
    studies: list[tuple[Study, dict[str, Any]]] = []
    for name in names or list_studies():
        study = get_study(name)()
        studies.append((study, load_runs(Layout(root / name, root / name / "checkpoints"))))
    lines = ["# tokenreduce: the studies", "",
             "Built by `tokenreduce report` from the run JSONs stored under `results/<study>/runs/`: every "
             "number below is read from them; a verdict comes only from the test each study declares, at its "
             "level, with n stated.", "", "## Claims", "", *claims_table(studies), ""]
    for study, runs in studies:
        lines += study_section(study, runs, root)
    return write_text(root / "REPORT.md", "\n".join(lines).rstrip() + "\n")

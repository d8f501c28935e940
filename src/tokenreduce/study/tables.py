"""A study's tables and verdicts, rendered from its run JSONs alone: :func:`summary` (the markdown of
``tokenreduce study NAME --summarize`` and ``<results>/summary.md``) and :func:`judge` (each declared claim
tested, study/stats.py); the report page (study/page.py) reuses both. A run without a JSON shows as "not
run" with the reason, never as a number."""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..bench.compare import bench_text, speedups_text
from ..bench.report import revision_gap
from ..bench.speed import round_speedups, timing_noise
from ..core.errors import SpecError
from ..probes.base import record_report
from ..tasks.items import item_pair, record_items
from ..train.recipes import recipe_text
from . import stats
from .declare import CONFIRMATORY, OFF_THE_SHELF, OWN, POWER, Axis, Col, Expect, Probe, Study, Timing

NOT_RUN = "not run"
#: the confidence of every t-interval (every claim's level), and their column's heading
CONFIDENCE = f"{100 * (1 - Expect.level):g}%"
INTERVAL = f"{CONFIDENCE} t-interval"
#: what an exploratory claim (:attr:`~.declare.Expect.confirmatory` false) shows in place of a verdict word
EXPLORATORY = "exploratory"
#: the words that decide nothing, which a record of uncommitted code therefore cannot make provisional
UNDECIDED = ("inconclusive", EXPLORATORY)
#: what a decided word reads as while a record the claim reads names no clean commit
PROVISIONAL = "provisional (uncommitted code)"


def table_head(headers: list[str]) -> list[str]:
    """A markdown table's header and rule lines."""
    return [table_row(headers), "|" + "---|" * len(headers)]


def table_row(cells: Iterable[str]) -> str:
    """A markdown table's line of ``cells`` (an empty one stays empty: "| |")."""
    return "|" + "".join(f" {c} |" if c else " |" for c in cells)


def _metric(doc: dict[str, Any], metric: str) -> float | None:
    v = doc.get("metrics", {}).get(metric)
    return float(v) if isinstance(v, (int, float)) else None


def axis(study: Study, name: str) -> Axis | None:
    return next((a for a in study.axes() if a.name == name), None)


def planned_seeds(study: Study) -> tuple[Any, ...]:
    return axis(study, "seed").values


def split_points(study: Study) -> list[tuple[Any, dict[str, Any]]]:
    """(value, grid point) of each value of the axis the tables are split by (``study.split``); one table:
    [(None, {})]."""
    return [(None, {})] if study.split is None else [(v, {study.split[0]: v}) for v in
                                                     axis(study, study.split[0]).values]


def arm_runs(study: Study, runs: dict[str, dict], arm: str, at: dict[str, Any]) -> dict[Any, dict]:
    """seed -> doc of ``arm``'s runs at ``at`` that have a JSON."""
    at = study.complete(at)
    return {p.values["seed"]: runs[p.id] for p in study.points() if p.arm == arm and p.matches(at) and p.id in runs}


def values(study: Study, runs: dict[str, dict], arm: str, metric: str, at: dict[str, Any]) -> list[float]:
    """``metric`` of each of ``arm``'s runs at ``at`` that has it, in seed order."""
    return [v for d in arm_runs(study, runs, arm, at).values() if (v := _metric(d, metric)) is not None]


def _both(study: Study, runs: dict[str, dict], arm: str, base: str, at: dict[str, Any]) -> dict[Any, tuple]:
    """Seed -> (``arm``'s doc, ``base``'s doc) at ``at``, for each planned seed with both, in seed order."""
    mine, theirs = arm_runs(study, runs, arm, at), arm_runs(study, runs, base, at)
    return {s: (mine[s], theirs[s]) for s in planned_seeds(study) if s in mine and s in theirs}


def paired_by_seed(study: Study, runs: dict[str, dict], arm: str, base: str, metric: str,
                   at: dict[str, Any]) -> dict[Any, float]:
    """Seed -> ``arm`` minus ``base`` on ``metric`` at ``at``, for each seed with both values, in seed order."""
    return {s: x - y for s, (a, b) in _both(study, runs, arm, base, at).items()
            if (x := _metric(a, metric)) is not None and (y := _metric(b, metric)) is not None}


def arm_table(study: Study, runs: dict[str, dict], at: dict[str, Any]) -> list[str]:
    """One row per arm at ``at``: each column's mean ± std over the seeds run (Δ columns paired by seed)."""
    lines = table_head(["arm", "seeds", *(c.header for c in study.columns)])
    split = study.split[0] if study.split else None
    extra = [a for a in study.axes() if a.name not in ("seed", split)]  # one row per arm and value of each
    for name, arm in study.arms.items():
        for combo in itertools.product(*(a.values for a in extra)):
            here = {**at, **{a.name: v for a, v in zip(extra, combo, strict=True)}}
            if not study.runs_at(name, here):
                continue
            label = arm.label + "".join(f" ({a.name} {v})" for a, v in zip(extra, combo, strict=True)
                                        if v != a.implicit and len(a.values) > 1)
            lines.append(_arm_row(study, runs, name, label, here))
    return lines


def _arm_row(study: Study, runs: dict[str, dict], name: str, label: str, at: dict[str, Any]) -> str:
    docs = arm_runs(study, runs, name, at)
    if not docs:
        return table_row([label, f"{NOT_RUN}: no run JSON", *[NOT_RUN] * len(study.columns)])
    missing = [s for s in planned_seeds(study) if s not in docs]
    seeds = ", ".join(str(s) for s in docs) + (f" ({', '.join(map(str, missing))} {NOT_RUN})" if missing else "")
    both = len(docs.keys() & arm_runs(study, runs, study.baseline, at).keys())

    def cell(vals: Iterable[float], of: int) -> str:  # a record without the column's metric: its n says so
        s = stats.summarize(vals)
        if not 0 < s.n < of:
            return s.text()
        return f"{s.mean:.2f} (n = 1 of {of})" if s.n == 1 else f"{s.text()} (n = {s.n} of {of})"

    base = study.baseline
    cells = [cell(values(study, runs, name, c.metric, at), len(docs)) if not c.paired else "-" if name == base
             else cell(paired_by_seed(study, runs, name, base, c.metric, at).values(), both) for c in study.columns]
    return table_row([label, seeds, *cells])


def measure_table(decl: Timing, doc: dict[str, Any]) -> list[str]:
    return table_head([c.header for c in decl.columns]) + [
        table_row(c.text(r[c.metric]) if r.get(c.metric) is not None else "-" for c in decl.columns)
        for r in doc["result"]["results"]]


def bench_comparison(columns: tuple[Col, ...], runs: dict[str, dict]) -> list[str]:
    """A bench table (``Bed.columns`` of a bed that trains nothing): a row per spec and the control, labelled in
    the first column; each other column the speed-ups (bench.compare.speedups_text) of the bench its
    ``metric`` names, against the unpatched model or (``paired``) the matched random."""
    benches = list(dict.fromkeys(c.metric for c in columns[1:]))
    missing = [n for n in benches if n not in runs]
    if missing:
        return [f"{NOT_RUN}: no run JSON for {', '.join(missing)}"]
    rows = {n: {r["label"]: r for r in runs[n]["result"]["results"]} for n in benches}
    lines = table_head([c.header for c in columns])
    for r in runs[benches[0]]["result"]["results"]:
        if r["kind"] in ("control", "method"):
            label = f"control `{r['spec']}`" if r["kind"] == "control" else f"`{r['label']}`"
            lines.append(table_row([label, *(speedups_text(rows[c.metric].get(r["label"]), c.paired)
                                             for c in columns[1:])]))
    return lines


# ----------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Judged:
    """A claim, its paired differences and the verdict on them (None: not run, ``why``). ``claim``: its text
    as printed; ``items``: the seeds x items interval (low, high, centre), else None and ``items_why``;
    ``members``: a family claim's number of claims (0: its own); ``uncommitted``: the records it reads that
    name no clean commit (bench.report.revision_gap), which make a decided word provisional; ``read``: the digest
    of the records its test read (:func:`records_digest`), which the verdict history compares (study/history.py)."""

    expect: Expect
    diffs: list[float]
    verdict: stats.Verdict | None
    why: str
    claim: str = ""
    items: tuple[float, float, float] | None = None
    items_why: str = ""
    members: int = 0
    uncommitted: tuple[str, ...] = ()
    read: str = ""


@dataclass(frozen=True)
class Judgement:
    """Every judged claim of some study beds (``judged``: study key -> its claims), and the families their
    p-values were adjusted in, each the declared tests whether run or not: ``holm`` (study name -> the number
    of tests of all its beds, Holm), ``bh`` (the number of tests over all of them, Benjamini-Hochberg) and
    ``waiting`` (study name -> how many of its tests are not yet run, counted at p = 1)."""

    judged: dict[str, list[Judged]]
    holm: dict[str, int]
    bh: int
    scope: str = "the report"
    waiting: dict[str, int] = field(default_factory=dict)


def _uncommitted(study: Study, runs: dict[str, dict], claims: list[Expect]) -> tuple[str, ...]:
    """The ids of the records ``claims`` read (their arms' and baselines' runs at their grid points, and the
    speed record a speed-matched claim reads) that name no clean commit."""
    docs = [d for e in claims for arm in (e.arm, e.baseline) for d in arm_runs(study, runs, arm, e.at).values()]
    docs += [runs[e.speed[0]] for e in claims if e.speed and e.speed[0] in runs]
    return tuple(sorted({str(d.get("id", d.get("run"))) for d in docs if revision_gap(d)}))


def records_digest(study: Study, runs: dict[str, dict], claims: list[Expect]) -> str:
    """SHA-256 (its first 16 hex digits) over what ``claims``' tests read, sorted: per seed paired, each of the
    two records' id, ``metric`` value, per-item values and revision_gap; it changes when a run is added,
    made again or re-made from committed code, and only then."""
    read = sorted(json.dumps([str(d.get("id", d.get("run"))), d.get("metrics", {}).get(e.metric),
                              d.get("metrics", {}).get("items", {}).get(e.metric), revision_gap(d)],
                             sort_keys=True)
                  for e in claims for pair in _both(study, runs, e.arm, e.baseline, e.at).values() for d in pair)
    return hashlib.sha256("\n".join(read).encode()).hexdigest()[:16]


def by_item(study: Study, e: Expect) -> bool:
    """Whether ``e``'s test pairs test items: a claim declared with the item as unit, unless one of its arms
    draws another random pattern for each seed (its spec names ``{seed}``): its folds then differ in more
    than their test items (the masks vary between them), so the fold is the unit of the test."""
    return study.per_item(e) and not any("{seed}" in (study.arms[a].spec or "") for a in (e.arm, e.baseline)
                                        if a in study.arms)


def paired_items(study: Study, runs: dict[str, dict], e: Expect) -> list[float]:
    """The per-item differences ``e.arm`` minus ``e.baseline`` on ``e.metric``, in percent (100 x the item
    values, as the metric is 100 x their mean), pooled over the seeds whose two records both hold them (off the
    shelf each seed is a fold of the test items). An item without a value in either record (NaN) is left out,
    as the metric leaves it out."""
    out: list[float] = []
    for a, b in _both(study, runs, e.arm, e.baseline, e.at).values():
        if (pair := item_pair(a, b, e.metric)) is not None:
            d = 100.0 * (pair[0] - pair[1])
            out += d[~np.isnan(d)].tolist()
    return out


def without_items(study: Study, runs: dict[str, dict], e: Expect) -> list[str]:
    """The ids of the records, of the seeds where both of ``e``'s arms ran, that hold no per-item ``e.metric``."""
    return [d.get("id", "?") for pair in _both(study, runs, e.arm, e.baseline, e.at).values() for d in pair
            if record_items(d, e.metric) is None]


def item_interval(study: Study, runs: dict[str, dict], e: Expect) -> tuple[tuple[float, float, float] | None, str]:
    """The seeds x items interval of claim ``e`` (stats.crossed_interval) where every paired seed's two records
    hold ``e.metric``'s per-item results and its test has the seed as unit; else None and why not."""
    if by_item(study, e):
        return None, "the test items are the unit"
    if study.per_item(e):
        return None, "the folds are the unit: a random pruner's mask differs between them"
    both = _both(study, runs, e.arm, e.baseline, e.at)
    pairs = [item_pair(*both[s], e.metric) for s in paired_by_seed(study, runs, e.arm, e.baseline, e.metric, e.at)]
    if pairs and all(p is None for p in pairs):
        return None, "seed-level only: the records hold no per-item results (runs made from now on store them)"
    if any(p is None for p in pairs):
        return None, (f"seed-level only: {', '.join(without_items(study, runs, e))} hold no per-item {e.metric} "
                      "(the other seeds' records do)")
    if len(pairs) < 2:
        return None, f"seed-level only: a seeds x items interval needs at least 2 seeds (n = {len(pairs)})"
    return stats.crossed_interval([a for a, _ in pairs], [b for _, b in pairs], confidence=1.0 - e.level), ""


def arm_rows(study: Study, runs: dict[str, dict], measure: str) -> dict[str, list[dict]]:
    """Arm -> its rows in the record of ``measure``: of its fine-tuned runs, or, for an arm evaluated off the
    shelf (``Arm.kind`` off_the_shelf), the training-free row of its spec (at seed 0's pattern)."""
    doc, arm_of = runs.get(measure), {p.id: p.arm for p in study.points()}
    free = {a.spec.format(seed=0): name for name, a in study.arms.items() if a.kind == OFF_THE_SHELF}
    found: dict[str, list[dict]] = {}
    for row in (doc or {}).get("result", {}).get("results", []):
        arms = {arm_of.get(r.get("run")) for r in row.get("runs", [])}
        if row.get("kind") == "fine-tuned" and len(arms) == 1 and None not in arms and row.get("speedup"):
            found.setdefault(arms.pop(), []).append(row)
        elif row.get("kind") == "training-free" and row.get("spec") in free and row.get("speedup"):
            found.setdefault(free[row["spec"]], []).append(row)
    return found


def claim_text(study: Study, runs: dict[str, dict], e: Expect) -> str:
    """``e.claim``, its ``{at_speed}`` read from the speed record: "at equal measured speed" only when an
    equivalence test (TOST, two-sided at the claim's level) on the per-round differences of the two arms'
    speed-ups (each the mean over its rows in a round), timed in one interleaved run, holds within the
    declared margin; else "at its own pick" with both measured speeds (the median over an arm's rows)."""
    if e.speed is None:
        return e.claim
    measure, margin = e.speed
    mine, rows = arm_rows(study, runs, measure), (runs.get(measure) or {}).get("result", {}).get("results", [])
    rounds = [[round_speedups(r, rows) for r in mine.get(arm, [])] for arm in (e.arm, e.baseline)]
    if not all(got and all(g is not None for g in got) for got in rounds):
        return e.claim.format(at_speed=f"at its own pick (no per-round timings of both arms in the {measure} "
                                       "record)")
    a, b = (statistics.median(float(r["speedup"]) for r in mine[arm]) for arm in (e.arm, e.baseline))
    diffs = (np.mean(rounds[0], axis=0) - np.mean(rounds[1], axis=0)).tolist()
    p = None if (p := stats.tost(diffs, -margin, margin)) is None else stats.doubled(p)
    test = f"TOST within ±{margin:g}x over {len(diffs)} interleaved rounds: p = " + ("-" if p is None else f"{p:.2g}")
    if p is not None and p < e.level:
        return e.claim.format(at_speed=f"at equal measured speed ({a:.2f}x and {b:.2f}x; {test})")
    return e.claim.format(at_speed=f"at its own pick ({a:.2f}x against {b:.2f}x measured; not shown equal, {test})")


def _family_claims(study: Study, runs: dict[str, dict]) -> list[tuple[Expect, dict[Any, float], list[Expect]]]:
    """Each declared family of at least two claims at one grid point: a claim of its own whose paired
    value per seed is the mean of its members' (seeds where every member has one)."""
    groups: dict[tuple, list[Expect]] = {}
    for e in study.expect:
        if e.family:
            groups.setdefault((e.family, tuple(sorted(e.at.items()))), []).append(e)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        first = members[0]
        if len({(e.metric, e.direction, e.margin, e.kind, e.level) for e in members}) > 1:
            raise SpecError(f"study {study.name}: the family {first.family!r} mixes metrics, directions, margins, "
                            "kinds or levels")
        per = [paired_by_seed(study, runs, e.arm, e.baseline, e.metric, e.at) for e in members]
        seeds = [s for s in planned_seeds(study) if all(s in p for p in per)]
        source = next((e.source for e in members if not e.confirmatory), first.source)  # one exploratory: all
        fam = Expect(first.family, source, arm=f"the mean over {len(members)} claims' arms",
                     baseline="their baselines", metric=first.metric, direction=first.direction, at=first.at,
                     margin=first.margin, kind=first.kind, delta=first.delta, why=first.why)
        out.append((fam, {s: statistics.fmean(p[s] for p in per) for s in seeds}, members))
    return out


def test_keywords(e: Expect) -> dict[str, Any]:
    """The keywords of ``e``'s tests (stats.hypotheses, stats.verdict): what its test is, beside its contrast."""
    return {"kind": e.kind, "direction": e.direction, "margin": e.margin, "level": e.level, "effect": e.effect,
            "delta": e.delta}


def _test(e: Expect, diffs: list[float]) -> list[stats.Hypothesis]:
    """The tests ``e`` declares, on ``diffs``; a claim not yet testable keeps its place in the family with each
    test at p = 1, so the family is the declared one: Holm and Benjamini-Hochberg are monotone in every p, so
    a run that arrives later can only lower the other claims' adjusted p-values."""
    return stats.hypotheses(diffs, **test_keywords(e)) or \
        [replace(h, p=1.0) for h in stats.hypotheses([0.0, 1.0], **test_keywords(e))]


def judge(studies: list[tuple[Study, dict[str, dict]]], scope: str = "the report") -> Judgement:
    """Every claim (and family claim) of ``studies`` judged, its p-values adjusted by Holm within each study
    (all its beds' tests together) and by Benjamini-Hochberg over all; a test rejects only when both
    adjusted p-values lie below its level, so the adjusted p shown is the larger of the two."""
    rows: list[tuple[Study, dict, Expect, list[float], list[Expect], str]] = []  # ..., family members, text
    for study, runs in studies:
        for e in study.expect:
            diffs = paired_items(study, runs, e) if by_item(study, e) else \
                list(paired_by_seed(study, runs, e.arm, e.baseline, e.metric, e.at).values())
            rows.append((study, runs, e, diffs, [], claim_text(study, runs, e)))
        rows += [(study, runs, fam, list(d.values()), m, fam.claim) for fam, d, m in _family_claims(study, runs)]
    tests = [_test(r[2], r[3]) if r[2].confirmatory else [] for r in rows]  # the families: confirmatory alone
    names = [r[0].name for r, t in zip(rows, tests, strict=True) for _ in t]
    ps = [h.p for t in tests for h in t]
    adjusted = stats.adjust(ps, "fdr_bh")
    holm_sizes = dict(Counter(names))
    waiting = Counter(r[0].name for r, t in zip(rows, tests, strict=True) if len(r[3]) < 2 for _ in t)
    for name in holm_sizes:
        where = [k for k, n in enumerate(names) if n == name]
        for k, p in zip(where, stats.adjust([ps[k] for k in where], "holm"), strict=True):
            adjusted[k] = max(adjusted[k], p)
    judged: dict[str, list[Judged]] = {study.key: [] for study, _ in studies}
    k = 0
    for (study, runs, e, diffs, members, text), t in zip(rows, tests, strict=True):
        adj, k = adjusted[k:k + len(t)], k + len(t)
        family = holm_sizes.get(study.name, 0)
        if not diffs:
            what = f"{e.arm} and {e.baseline}" + ("'s per-item results" if study.per_item(e) else "")
            why = f"{NOT_RUN}: no seed has both {what}" + _power_text(study, runs, e, None, family)
            judged[study.key].append(Judged(e, diffs, None, why, text, members=len(members)))
            continue
        v = stats.verdict(diffs, **test_keywords(e), adjusted=adj if e.confirmatory else None)
        if not e.confirmatory:
            said = "; ".join(f"{h.text} (raw p = {h.p:.3g})" for h in v.tests) or v.why
            v = replace(v, word=EXPLORATORY, why=f"{EXPLORATORY} (a contrast of {OWN} own, not "
                        f"{CONFIRMATORY}: outside the multiplicity families, no verdict): n = {v.n}: {said}")
        items, items_why = item_interval(study, runs, e) if not members else (None, "a family claim: seeds as the unit")
        left = without_items(study, runs, e) if by_item(study, e) and not members else []
        dropped = f"; left out: {', '.join(left)} hold no per-item {e.metric}, so the test is over the other " \
                  f"folds' {v.n} items only" if left else ""
        why = v.why + dropped + _power_text(study, runs, e, v, family)
        uncommitted = _uncommitted(study, runs, members or [e])
        if uncommitted and v.word not in UNDECIDED:
            why += (f"; provisional: as run it reads {v.label}, but {len(uncommitted)} of the records it reads name "
                    f"no clean commit ({', '.join(uncommitted)}), so it is decided only when re-run from one")
        judged[study.key].append(Judged(e, diffs, v, why, text, items, items_why, len(members), uncommitted,
                                        records_digest(study, runs, members or [e])))
    return Judgement(judged, holm_sizes, len(ps), scope, dict(waiting))


def verdicts(study: Study, runs: dict[str, dict]) -> list[Judged]:
    """The study bed's claims judged on their own (multiplicity adjusted over this bed's tests alone; the
    report adjusts over every study: :func:`judge`)."""
    return bed_judgement(study, runs).judged[study.key]


def bed_judgement(study: Study, runs: dict[str, dict]) -> Judgement:
    """The study bed's claims judged with this bed's tests alone as the families."""
    return judge([(study, runs)], scope="this test bed")


def _power_text(study: Study, runs: dict[str, dict], e: Expect, v: stats.Verdict | None, family: int) -> str:
    """The declared power plan (its pilot sd read from the records where it names a grid point); else, for
    a published effect, the power n had for it, labelled post hoc. Both at the level the claim is decided at:
    ``e.level`` over the ``family`` tests of its study (Holm's first step, the strictest it may have to pass;
    Bonferroni's level). '' for an exploratory claim: it is decided at no level."""
    if not e.confirmatory:
        return ""
    deciding = e.level / max(1, family)
    at = f"one-sided {deciding / 2:.2g}: {e.level:g} over the {family} tests of its Holm family, two-sided"
    if e.power is not None:
        diffs = list(paired_by_seed(study, runs, e.arm, e.baseline, e.metric, study.pilot(e)).values())
        sd = statistics.stdev(diffs) if len(diffs) > 1 else None
        pilot = f"the same contrast at {where_text(study.pilot(e))}, n = {len(diffs)}"
        ran = f"run with n = {v.n}" if v is not None else "not run yet"
        if not sd:
            return f"; power plan (declared before the runs): Δ = {e.power:g}, its pilot ({pilot}) not stored; {ran}"
        n = stats.seeds_for_power(e.power, sd, POWER, deciding)
        return (f"; power plan (declared before the runs): n = {n} seeds give {POWER:.0%} power to detect "
                f"Δ = {e.power:g} at the pilot sd {sd:.2g} ({pilot}; {at}); {ran}")
    if v is None:
        return ""
    toward = None if e.effect is None else (e.effect - e.margin) * e.direction
    if not toward or toward <= 0 or not v.std:
        return ""
    power = stats.power_paired_t(toward, v.std, v.n, deciding)
    return (f"; no power plan was declared before the runs; post hoc, at the observed sd {v.std:.2f}, n = {v.n} "
            f"had {power:.0%} power for the published {e.effect:+.2f} ({at})")


def where_text(at: dict[str, Any], empty: str = "-") -> str:
    """A grid point as the tables print it: ``{"bits": 16, "steps": 937}`` -> "bits 16, steps 937"; the
    point of no axis: ``empty``."""
    return ", ".join(f"{k} {v}" for k, v in at.items()) or empty


def measured(j: Judged) -> str:
    if j.verdict is None:
        return NOT_RUN
    v = j.verdict
    text = stats.Summary(v.n, v.mean, v.std).text()
    return text if v.std is None else f"{text} (n = {v.n})"  # one value's text names its n already


def interval_text(ci: tuple[float, ...] | None) -> str:
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "-"


def ci_text(j: Judged) -> str:
    """The (1 - level) paired t-interval, and the crossed seeds x items interval where the records allow one."""
    items = f"; seeds x items {interval_text(j.items)}" if j.items is not None else ""
    return interval_text(j.verdict.interval if j.verdict else None) + items


def p_text(j: Judged) -> str:
    """The claim's test: raw p, then adjusted."""
    p = j.verdict.p("claim") if j.verdict else None
    return "-" if not p else f"{p[0]:.3g} / -" if j.verdict.word == EXPLORATORY else f"{p[0]:.3g} / {p[1]:.3g}"


def result_cells(j: Judged) -> list[str]:
    """A judged claim's cells in a table of claims: published, measured, t-interval, p raw / adjusted, the
    verdict."""
    return [j.expect.published or "-", measured(j), ci_text(j), p_text(j), f"**{word(j)}**"]


def word(j: Judged) -> str:
    """The verdict as printed: a decided word only where every record the claim reads names a clean commit."""
    if j.verdict is None:
        return NOT_RUN
    return PROVISIONAL if j.uncommitted and j.verdict.word not in UNDECIDED else j.verdict.label


def _contrast(e: Expect) -> str:
    if e.kind == "equivalent":
        return f"equivalent: |{e.arm} - {e.baseline}| < {abs(e.margin):g} on {e.metric}"
    what = "non-inferior: " if e.kind == "noninferior" else ""
    return f"{what}{e.arm} - {e.baseline} {'>' if e.direction > 0 else '<'} {e.margin:g} on {e.metric}"


def designation_text(judgement: Judgement, study: str | None = None) -> str:
    """How many of the judged claims (of ``study``'s beds, or all) are confirmatory and how many exploratory."""
    claims = [j.expect for key, js in judgement.judged.items() if study in (None, key.split("/")[0]) for j in js]
    own = sum(not e.confirmatory for e in claims)
    return f"{len(claims) - own} confirmatory and {own} exploratory"


def adjustment_text(judgement: Judgement, study: Study) -> str:
    m, waiting = judgement.holm.get(study.name, 0), judgement.waiting.get(study.name, 0)
    unrun = f", {waiting} of them not yet run and counted at p = 1" if waiting else ""
    return (f"Claims of study {study.name} in {judgement.scope}: {designation_text(judgement, study.name)}. "
            f"Multiplicity: each p is adjusted by Holm over the {m} tests study {study.name} declares{unrun}, and "
            f"by Benjamini-Hochberg over the {judgement.bh} declared tests of {judgement.scope} "
            f"({sum(judgement.waiting.values())} not yet run); the families are fixed by the declarations, so a "
            "run that arrives can only lower another claim's adjusted p. A test rejects only when both adjusted "
            "p-values lie below its level (the adjusted p shown is the larger).")


def verdict_table(study: Study, runs: dict[str, dict], judgement: Judgement | None = None) -> list[str]:
    judgement = judgement or bed_judgement(study, runs)
    judged = judgement.judged[study.key]
    lines = table_head(["claim", "where", "contrast", "published", "measured Δ (mean ± sd)",
                        INTERVAL, "p raw / adjusted", "verdict"])
    lines += [table_row([j.claim, where_text(j.expect.at), _contrast(j.expect), *result_cells(j)]) for j in judged]
    lines.append("")
    for j in judged:
        e = j.expect
        why = f" Margin / bound: {e.why}." if e.why else ""
        pooled = f" (a family claim: per seed the mean over its {j.members} claims' paired differences)" \
            if j.members else ""
        lines.append(f"- {j.claim} ({where_text(e.at, 'all')}){pooled}: {j.why}.{why}")
    lines += ["", f"Tests as run. {STATISTICS}", "", adjustment_text(judgement, study)]
    ran = [j for j in judged if j.verdict]
    per_item = sum(by_item(study, j.expect) for j in ran)
    said = {"per_item": per_item, "per_fold": sum(study.per_item(j.expect) for j in ran) - per_item,
            "without": "; ".join(sorted({j.items_why for j in ran if j.items is None and not j.members
                                         and not study.per_item(j.expect)}))}
    return lines + [line for key, text in UNITS.items() if said[key] for line in ("", text.format(said[key]))]


#: the notes under a verdict table on the unit each claim's test and interval are over, by what they count
UNITS = {
    "per_item": "Per-item claims ({}): arms evaluated off the shelf, where the seeds are disjoint folds of the test "
                "items; their test and t-interval are over the per-item differences of all folds (n = the test "
                "items), which is the sampling such a claim has.",
    "per_fold": "Per-fold claims ({}): off the shelf too, but an arm is the random pruner, whose mask differs from "
                "fold to fold; the item-level test would leave that variance out, so their test and t-interval are "
                "over the folds' paired differences (n = the folds).",
    "without": "Intervals: {}, so the t-interval over seeds is the only interval; it leaves out test-item sampling "
               "(every seed is scored on the same test items).",
}
#: how every verdict table's tests were run, in words
STATISTICS = (f"Every claim's test is two-sided at its level ({Expect.level:g}), i.e. each side one-sided at "
              f"{Expect.level / 2:g}, so \"reproduced\" and \"contradicted\" together keep {Expect.level:g}; "
              "one-sided p-values (TOST, the test against a published effect) are shown doubled so every p compares "
              f"with {Expect.level:g}. The t-interval is the {CONFIDENCE} paired t-interval over seeds whose side of "
              "the margin decides the claim before multiplicity. \"equivalent within ±δ\": TOST at a declared ±δ "
              "rejects; \"not reproduced\": the test of H0 Δ = published effect, one-sided toward no effect, rejects; "
              "\"inconclusive\": no test rejects, which says the data could not tell, not that there is no effect. A "
              f"claim is confirmatory when it is {CONFIRMATORY}; one whose source names the contrast as {OWN} own is "
              "exploratory: its difference, interval and raw p are shown with the word \"exploratory\", never a "
              "verdict, and it stays outside the multiplicity families.")


# ----------------------------------------------------------------------------- the summary

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
        if old := d.get("replaces"):
            metric = d["metrics"]["metric"]
            was = f" on {old['cpu']}" if old.get("cpu") else " (its machine not recorded)"
            lines.append(f"{rid} was made again ({old['why']}): {metric} {d['metrics'][metric]:.2f} on "
                         f"{d['metrics']['provenance'].get('cpu')}, in place of {old['metrics'][metric]:.2f}{was}.")
    return [*lines, ""] if lines else []


def schedule_text(study: Study) -> str:
    """The recipe the arm tables' runs train with, in words; with a named setting on the grid (``Axis.sets``: the
    fine-tune length), also what the rows marked with its values train on and are scored on instead."""
    marked = [(a, v, {**study.recipe, **a.sets[v]}) for a in study.axes() for v in a.values if v in a.sets]
    if not marked:
        return recipe_text(study.recipe)
    rows = [f"a row marked ({a.name} {v}): {r.get('epochs')} epoch(s) of {train}, scored on {test}"
            for a, v, r in marked for train, test in [_items_text(r)]]
    return "; ".join([f"{recipe_text(study.recipe)}, scored on {_items_text(study.recipe)[1]}", *rows])


def _items_text(recipe: dict[str, Any]) -> tuple[str, str]:
    """What ``recipe`` trains on and is scored on: ("6400 training items" or "every training item", ditto test)."""
    return (f"{recipe['subset']} training items" if recipe.get("subset") else "every training item",
            f"{recipe['eval_subset']} test items" if recipe.get("eval_subset") else "every test item")


def summary(study: Study, runs: dict[str, dict], judgement: Judgement | None = None) -> str:
    """The study's markdown: arm tables per split value, measures, probes, benches, verdicts (``judgement``:
    the claims judged with others, :func:`judge`; default: this bed's alone)."""
    lines = [f"## Arms ({schedule_text(study)}) on {study.bed.text()}", ""] if study.arms else []
    missing = [p for p in study.points() if p.id not in runs]
    if missing and study.pending:
        by = "".join(f" ({name} {', '.join(f'{v}: {n}' for v, n in count.items())})"
                     for name, count in study.by_setting(missing).items())
        lines += [f"{len(missing)} of {len(study.points())} runs {NOT_RUN}{by}: {study.pending}.", ""]
    for value, at in split_points(study) if study.arms else []:
        if study.split:
            lines += [f"### {study.split[1].format(value)}", ""]
        lines += [*arm_table(study, runs, at), ""]
    lines += machines_text(runs)

    def part(decl: Timing | Probe, render: Any) -> list[str]:
        doc = runs.get(decl.name)
        if isinstance(decl, Probe) and decl.fmnist_only and not study.bed.fmnist():
            body = [f"{NOT_RUN}: it reads Fashion-MNIST's raw images; the test bed is {study.bed.text()}"]
        else:
            body = render(decl, doc) if doc is not None else [f"{NOT_RUN}: no run JSON for {decl.name}"]
        noise = timing_noise(doc["result"]["results"]) if isinstance(decl, Timing) and doc is not None else ""
        return [f"## {decl.title or decl.name}", "", *body, *(["", noise] if noise else []), ""]

    for m in study.measures:
        lines += part(m, measure_table)
    for p in study.probes:
        lines += part(p, lambda _, doc: [record_report(doc)])
    for title, columns in study.bench_tables.items():
        lines += [f"## {title}", "", *bench_comparison(columns, runs), ""]
    for b in study.benches:
        lines += part(b, lambda d, doc: bench_text(doc["result"], [(c.metric, c.header) for c in d.columns]))
    if study.expect:
        lines += ["## Verdicts", "", *verdict_table(study, runs, judgement), ""]
    return "\n".join(lines).rstrip() + "\n"

"""A study's plan: its runs in execution order, each ``Unit(id, step, needs)``, and where they go. Nothing runs
here: the runner makes each unit's request, the record reader checks each record against its unit."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import TokenReduceError
from .declare import EVALUATED, OFF_THE_SHELF, REFERENCE, Probe, Study, Timing
from .grid import Point


@dataclass(frozen=True)
class Layout:
    """Where a study's results (``results/runs/<id>.json``, summary.md) and checkpoints go."""

    results: Path
    checkpoints: Path

    def json(self, run_id: str) -> Path:
        return self.results / "runs" / f"{run_id}.json"


def layout_for(study: Study, out: str | None) -> Layout:
    """``--out DIR``: results in DIR, checkpoints in DIR/checkpoints. Without it: results/<study>/<bed>
    and runs/<study>/<bed> for a declared test bed, runs/studies/<study>-<bed>-<test bed or smoke>
    otherwise (a run on another test bed never lands beside the committed results)."""
    if out:
        return Layout(Path(out), Path(out) / "checkpoints")
    if study.default_bed and not study.is_smoke:
        return Layout(Path("results") / study.key, Path("runs") / study.key)
    root = Path("runs") / "studies" / f"{study.name}-{study.bed_name}-{'smoke' if study.is_smoke else study.bed.slug()}"
    return Layout(root, root / "checkpoints")


#: The kinds of run (:attr:`Unit.kind`): a record names one.
KINDS = ("train", "evaluate", "measure", "probe", "bench")
#: The kinds of run that time (measures and benches): each runs last, alone, with every thread.
TIMED = ("measure", "bench")


@dataclass(frozen=True)
class Unit:
    """One run of the plan: a training ``point`` (``needs``: the run an evaluated arm reads, or the one a
    second training phase starts from), a ``measure`` / ``probe`` that ``needs`` runs, or a ``bench``.
    ``reads``: the one of its ``needs`` whose checkpoint it reads (a measure's reference run, when it names one);
    ``evaluates``: what an evaluated arm's point evaluates, the run it reads or ``REFERENCE`` (off the shelf)."""

    id: str
    point: Point | None = None
    step: Timing | Probe | None = None
    needs: tuple[str, ...] = ()
    reads: str | None = None
    evaluates: str | None = None

    @property
    def kind(self) -> str:
        if self.point is not None:
            return "evaluate" if self.evaluates else "train"
        return "probe" if isinstance(self.step, Probe) else "bench" if self.step.bench else "measure"


def plan(study: Study) -> list[Unit]:
    """The study's runs in execution order."""
    units = []
    for p in study.points():
        arm = study.arms[p.arm]
        reads = study.point(arm.reads, p.values).id if arm.reads else None
        evaluates = REFERENCE if arm.kind == OFF_THE_SHELF else reads if arm.kind == EVALUATED else None
        units.append(Unit(p.id, point=p, needs=(reads,) if reads else (), reads=reads, evaluates=evaluates))
    for m in study.measures:
        ref, tuned = study.measure_runs(m)
        units.append(Unit(m.name, step=m, needs=(*([ref] if ref else []), *tuned), reads=ref))
    for pr in study.probes:
        if pr.fmnist_only and not study.bed.fmnist():
            continue  # the summary says why it is not run
        reads = study.point(pr.arm, pr.at).id if pr.arm else \
            None if study.bed.reference else study.point(study.baseline, {}).id
        units.append(Unit(pr.name, step=pr, needs=(reads,) if reads else (), reads=reads))
    units += [Unit(b.name, step=b) for b in study.benches]
    return units


def select(study: Study, units: Sequence[Unit], where: Mapping[str, Collection[str]]) -> list[Unit]:
    """The ``units`` in the grid slice ``where`` (axis name -> the values kept, written as in run ids'
    values: ``{"steps": {"937"}}``): the runs at those values, and the measures and probes whose every
    run read is in the slice; a bench, on no grid, is in none. An axis or value the study's grid lacks
    is refused, naming the valid ones."""
    axes = {a.name: a.values for a in study.axes()}
    for name, values in where.items():
        if name not in axes:
            raise TokenReduceError(f"study {study.name} has no grid axis {name!r}; its axes: {', '.join(axes)}")
        unknown = sorted(set(values) - {str(v) for v in axes[name]})
        if unknown:
            raise TokenReduceError(f"study {study.name}: {name}={','.join(unknown)} is not on its grid; valid: "
                                   f"{name}={','.join(map(str, axes[name]))}")
    inside = {u.id for u in units
              if u.point is not None and all(str(u.point.values[n]) in v for n, v in where.items())}
    return [u for u in units if u.id in inside or (u.point is None and u.needs and set(u.needs) <= inside)]

"""What the engine asks of a study's declarations: its runs (:class:`Point`, one per arm and grid point it runs
at), where each runs, and what each trains, reads and times. :class:`Planned` is the base of
:class:`~tokenreduce.study.declare.Study`; no study author calls these."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import TokenReduceError
from ..core.registry import format_spec, parse_spec
from ..train.config import field_names
from .testbed import Testbed, synthetic_data

#: What an arm is (``Arm.kind``)
TRAINED, AFTER, EVALUATED, OFF_THE_SHELF = "trained", "after", "evaluated", "off_the_shelf"
ARM_KINDS = (TRAINED, AFTER, EVALUATED, OFF_THE_SHELF)
#: the zero-reduction control every bench times
CONTROL = "tome(r=0)"
#: a recipe's ``teacher`` meaning "the test bed's reference checkpoint" (it distils from what it starts from)
TESTBED_TEACHER = "testbed"


@dataclass(frozen=True)
class Point:
    """One run of a study: ``arm`` at grid ``values``; ``id`` e.g. ``d_eet-b16-s0``."""

    arm: str
    values: dict[str, Any]
    id: str

    def matches(self, at: dict[str, Any]) -> bool:
        return all(self.values.get(k) == v for k, v in at.items())


def alternatives(only: dict[str, Any] | tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    return (only,) if isinstance(only, dict) else tuple(only)


def allows(only: dict[str, Any] | tuple[dict[str, Any], ...], at: dict[str, Any]) -> bool:
    """Whether an arm with ``only`` has runs at ``at`` (one alternative leaves every value ``at`` fixes in)."""
    return any(all(k not in o or v in o[k] for k, v in at.items()) for o in alternatives(only))


class Planned:
    """The engine's reading of one study on one bed (the attributes :class:`Study` sets from its bed)."""

    name: str
    arms: dict[str, Any]
    grid: tuple[Any, ...]
    recipe: dict[str, Any]
    baseline: str
    smoke: dict[str, Any] | None
    is_smoke: bool
    bed: Testbed

    def axes(self) -> tuple[Any, ...]:
        """The grid it runs: the declared one, or with a smoke the smoke's values of the axes it names."""
        grid = self.smoke_over("grid")
        return tuple(dataclasses.replace(a, values=tuple(grid[a.name])) if a.name in grid else a for a in self.grid)

    def smoke_over(self, key: str) -> dict[str, Any]:
        """What the smoke sets for ``key`` (:data:`SMOKE_KEYS`); nothing outside a smoke."""
        return self.smoke.get(key, {}) if self.is_smoke else {}

    def points(self) -> list[Point]:
        """Every arm at every grid point it runs at, in a stable order (grid outer, arms inner)."""
        axes = self.axes()
        out = []
        for values in itertools.product(*(a.values for a in axes)):
            point = dict(zip((a.name for a in axes), values, strict=True))
            parts = [f"{a.short}{v}" for a, v in zip(axes, values, strict=True) if v != a.implicit]
            out += [Point(arm, point, "-".join([arm, *parts])) for arm in self.arms if self.runs_at(arm, point)]
        return out

    def runs_at(self, arm: str, at: dict[str, Any]) -> bool:
        """Whether ``arm`` has runs at ``at`` (its ``only`` allows every value ``at`` fixes)."""
        only = tuple({k: [self.resolve({k: v})[k] for v in vs] for k, vs in o.items()}
                     for o in alternatives(self.arms[arm].only))
        return allows(only, self.resolve(at))

    def complete(self, at: dict[str, Any]) -> dict[str, Any]:
        r"""``at`` (:meth:`resolve`\ d) with every axis but the seed that it leaves out fixed at that axis'
        ``implicit`` value, else its first: a claim or measure that names no length reads the runs every arm has."""
        fixed = {a.name: a.implicit if a.implicit is not None else a.values[0] for a in self.axes() if a.name != "seed"}
        return {**fixed, **self.resolve(at)}

    def resolve(self, at: dict[str, Any]) -> dict[str, Any]:
        """``at`` with each value the grid lacks (a smoke grid has fewer) replaced by its axis' first."""
        axes = {a.name: a.values for a in self.axes()}
        return {k: v if v in axes[k] else axes[k][0] for k, v in at.items()}

    def point(self, arm: str, at: dict[str, Any]) -> Point:
        """The run of ``arm`` at ``at`` (:meth:`resolve`; an axis not given: its first value)."""
        at = self.resolve(at)
        full = {a.name: at.get(a.name, a.values[0]) for a in self.axes()}
        for p in self.points():
            if p.arm == arm and p.values == full:
                return p
        raise TokenReduceError(f"study {self.name}: no run of arm {arm!r} at {at}")

    def measure_runs(self, m: Any) -> tuple[str | None, list[str]]:
        """The run ids measure ``m`` reads: its reference's (None: the test bed's reference checkpoint, or
        where it has none and the baseline is evaluated off the shelf, the model at its initialisation)
        and its fine-tuned runs' (every run of each arm at ``m.at``, in plan order)."""
        off_the_shelf = self.arms[self.baseline].kind == OFF_THE_SHELF
        ref = m.model or (None if self.bed.reference or off_the_shelf else self.baseline)
        at = self.complete(m.at)
        tuned = [p.id for a in m.finetuned for p in self.points() if p.arm == a and p.matches(at)]
        return (self.point(ref, m.at).id if ref else None), tuned

    def by_setting(self, points: list[Point]) -> dict[str, dict[Any, int]]:
        """For each named setting on the grid with several values (``Axis.sets``: the fine-tune length), how many
        of ``points`` run at each of its values (a value with none left out)."""
        return {a.name: {v: n for v in a.values if (n := sum(p.values.get(a.name) == v for p in points))}
                for a in self.axes() if a.sets and len(a.values) > 1}

    def pilot(self, e: Any) -> dict[str, Any]:
        """The grid point whose records give claim ``e``'s power plan its pilot sd: the same contrast with each
        axis that has an ``implicit`` value at it (the runs made first: the shortened fine-tune)."""
        return {**e.at, **{a.name: a.implicit for a in self.grid if a.implicit is not None}}

    def per_item(self, e: Any) -> bool:
        """Whether claim ``e`` takes the test item as its unit, not the seed: its arms are evaluated off the
        shelf, so their seeds are disjoint folds of the test items (a metric kept per item: 100 or 0)."""
        return all(a in self.arms and self.arms[a].kind == OFF_THE_SHELF for a in (e.arm, e.baseline))

    def bench_run(self, b: Any) -> dict[str, Any]:
        """The fields of the ``bench`` command's request (bench.compare.BenchRequest) of the bench ``b`` (a Timing of
        a model off the grid) as this study runs it: a smoke's timing settings and narrower model, no checkpoint; a
        recipe's checkpoint found where train/ keeps it."""
        from ..models.build import ModelSource  # late: the command line reads declarations without torch
        from ..train.recipes import reference_checkpoint

        model, settings = dict(b.model), dict(b.settings)
        if self.is_smoke:
            over = dict(self.smoke_over("bench"))
            model = {**model, "kwargs": {**model.get("kwargs", {}), **over.pop("model_kwargs", {})}}
            model.pop("checkpoint", None)
            settings.update(over)
        recipe = model.get("checkpoint")
        source = ModelSource(checkpoint=str(reference_checkpoint(recipe)), spec=None) if recipe else ModelSource(
            config={"name": model["name"], "kwargs": dict(model.get("kwargs", {})), "pretrained": False})
        return {"source": source, "specs": tuple(b.specs), "control": CONTROL,
                "match_random": settings.pop("match_random", False), "speed": settings, "reference": recipe,
                "stem": model.get("stem")}

    def eval_items(self, scratch: Path) -> tuple[str | None, int | None]:
        """(data_dir, eval_subset) of the study's runs: where a measure finds the same test items (a
        synthetic test bed's folder under ``scratch``, else the checkpoint's own data) and how many."""
        recipe = {**self.recipe, **self.smoke_over("recipe")}
        data_dir = str(synthetic_data(scratch)) if self.bed.synthetic and self.bed.data else None
        return data_dir, recipe.get("eval_subset")

    def train_fields(self, p: Point, scratch: Path) -> dict[str, Any]:
        """TrainConfig fields of run ``p`` (without ``out``, set by the runner): recipe, test bed, smoke
        overrides, arm, grid point, in increasing priority; ``scratch``: where a synthetic test bed's data goes."""
        arm = self.arms[p.arm]
        fields = {**self.recipe, **self.bed.train_fields(scratch), **self.smoke_over("recipe")}
        task = arm.task or fields.get("task") or "classify"
        sets = {a.name: a.sets for a in self.axes() if a.sets}
        for k, v in p.values.items():
            if k in sets:
                fields.update(sets[k].get(v, {}))
            elif k in field_names():
                fields[k] = v
            else:  # a parameter of the task
                name, params = parse_spec(task)
                task = format_spec(name, {**params, k: v})
        fields["task"] = task
        fields["spec"] = arm.spec.format(**p.values) if arm.spec and arm.kind != EVALUATED else None
        if fields.get("teacher") == TESTBED_TEACHER:
            fields["teacher"] = self.bed.checkpoint()
            if fields["teacher"] is None:
                raise TokenReduceError(f"study {self.name}: its recipe distils from the test bed's reference, and "
                                       f"{self.bed.text()} has none; give a test bed with a reference checkpoint")
        if arm.stem or arm.transforms:
            if not fields.get("model") and self.bed.reference:
                from ..train.recipes import get_recipe  # the reference's architecture, its stem swapped / transformed

                fields["model"] = get_recipe(self.bed.reference)["model"]
            if not fields.get("model"):
                raise TokenReduceError(f"study {self.name}, arm {p.arm}: a stem or transform needs a test bed "
                                       "that builds its model (not a reference checkpoint)")
            fields["model"] = {**fields["model"], **({"stem": arm.stem} if arm.stem else {}),
                               **({"transforms": list(arm.transforms)} if arm.transforms else {})}
        return fields

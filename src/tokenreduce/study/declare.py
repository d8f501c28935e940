"""A study: a paper's claims as controlled comparisons, declared once and run on each of its test beds.

A study (one module under studies/, named as registered) names the ``claim`` it tests, its
``source`` and its claims (``expect``: :class:`Expect`, the statistic, the level, the published effect),
and its test beds (``beds``: name -> :class:`Bed`; the first is the default, ``tokenreduce study NAME
--testbed BED`` picks another). A bed declares what depends on the test bed: the :class:`Testbed` its
runs start from and are scored on (a built-in reference, or a timm model with pretrained or local
weights and a dataset or image folder), a typed ``recipe`` (TrainConfig fields, checked when the study
is registered), its ``arms`` (:class:`Arm`: task spec, reducer spec, stem, transforms, init, teacher;
their specs name per-block counts, which depend on the patch grid), a ``grid`` (:class:`Axis`: seeds,
code lengths ...), the tables it prints (:class:`Col`), ``measures`` and ``probes`` that evaluate its
trained runs, ``benches`` (:class:`Bench`: the ``bench`` command's timing of specs on a model given by
its config; ``bench_tables``, :class:`BenchTable`: several side by side), a ``smoke`` version
(:class:`Smoke`: the same bed at tiny sizes, run by the test suite) and its ``budget``. Every bed
tests each claim whose two arms it has (:func:`tests_claim`), so a claim is written once however many
beds test it; a user's own test bed (``--model``, ``--data``) runs a declared bed's plan on it.

Every arm x grid point of a bed is one run with a stable id (``d_eet-b16-s0``; ``eet/scenes/d_eet-b16-s0``
with the study and bed), executed by study/runner.py. A bed of benches only has no arms: it trains
nothing, so it has no grid (no seeds), baseline, columns or claims.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from ..core.errors import SpecError, TokenReduceError
from ..core.registry import NoParams, Registry, format_spec, parse_spec
from .testbed import Testbed, synthetic_data

# ----------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Arm:
    """One arm: what differs from the recipe. ``task``: a task spec (None: the recipe's); ``spec``: the
    reducer to train with (None: none); ``stem``, ``transforms``: model options (models/build.py; on a test
    bed's reference checkpoint a stem is swapped in with fresh weights, the rest kept);
    ``init``, ``teacher``: checkpoints (None: the test bed's); ``label``: the name tables print. ``spec`` may
    name grid values in braces (``random(..., seed={seed})``: a pruner's own seed that follows the run's).

    An *evaluated* arm trains nothing: ``evaluates`` names the arm whose checkpoint it reads at the same
    grid point, and ``experiment`` the registered experiment (probes/base.py) run on it, whose
    result's ``metrics`` are the arm's (e.g. ``oracle_at_counts``: the oracle at a trained pruner's
    counts, on its weights; its spec may name the point's training settings in braces,
    ``subset={eval_subset}``: the test items the source run was scored on). Its runs pair with the
    others' by seed like any arm's.

    An arm evaluated on the *test bed's reference* (``evaluates=REFERENCE``, no experiment) trains nothing
    either: it is ``spec`` applied to the reference off the shelf (a training-free method as its paper
    measures it), scored per item; its run at the n-th planned seed is scored on the n-th of as many
    disjoint folds of the test items (items n, n + S, n + 2S, ... of the runs' items, S seeds), so the
    seeds of two such arms pair item for item and together cover every test item once. Its claims take
    the test item as their unit (``Expect.unit='item'``).

    ``after`` names a trained arm whose checkpoint at the same grid point this arm's training starts
    from (a second phase: its run waits for that one), in place of the test bed's.

    ``only`` narrows the grid for this arm: axis name -> the values it runs at (``{"bits": (16,)}``: a
    sensitivity arm at one of several code lengths); an axis not named runs at all of its values, and a
    smoke grid without a named value runs the arm at the axis' first (:meth:`Study.resolve`). A tuple of
    such dicts: the arm runs where any of them allows (``({"steps": (100,)}, {"bits": (16,)})``: every
    code length on the short schedule, 16 bits on the long one)."""

    label: str
    task: str | None = None
    spec: str | None = None
    stem: str | None = None
    transforms: tuple[str, ...] = ()
    init: str | None = None
    teacher: str | None = None
    evaluates: str | None = None
    experiment: str | None = None
    after: str | None = None
    only: dict[str, tuple[Any, ...]] | tuple[dict[str, tuple[Any, ...]], ...] = field(default_factory=dict)


#: ``Arm.evaluates`` of an arm that applies its spec to the test bed's reference, off the shelf
REFERENCE = "@reference"


@dataclass(frozen=True)
class Axis:
    """A grid axis: ``name`` is a TrainConfig field (``seed``) or a parameter of the task spec
    (``bits``); ``short`` prefixes its value in run ids (``s0``, ``b16``). With ``sets`` the axis is a
    named setting instead: value -> the TrainConfig fields it sets (``Axis("steps", (100, 938), "t",
    sets={938: {"subset": None}})``: the fine-tune length). ``implicit``: the value run ids leave out (the
    runs made before the axis existed keep their ids)."""

    name: str
    values: tuple[Any, ...]
    short: str
    sets: dict[Any, dict[str, Any]] = field(default_factory=dict)
    implicit: Any = None


@dataclass(frozen=True)
class Col:
    """A table column headed ``header``. In an arm table: the run metric ``metric`` (mean ± std over the
    grid's seeds), with ``paired=True`` the difference from the baseline arm, paired by seed. In a
    measure's table: the row's value ``metric`` written with ``fmt``."""

    metric: str
    header: str
    paired: bool = False
    fmt: str = "{:.2f}"


#: The margin within which two arms count as "at equal measured speed" (study/tables.py, claim_text):
#: a tenth of the speed-up, the order the timing noise of one interleaved run on 2 CPU threads allows
#: with ten rounds (each speed table prints its own measured noise); a tighter margin could not be shown.
EQUAL_SPEED = 0.1


@dataclass(frozen=True)
class Power:
    """A power plan declared before the runs: the smallest ``effect`` (paired difference, toward the claim)
    the claim's test must detect, at the per-seed spread ``sd`` of the ``pilot`` (named: the runs or study
    the spread was read from), with ``power`` (80%); the report states the n of seeds that gives it at the
    level the claim is decided at (its level over the tests of its study's Holm family: study/stats.py,
    :func:`~.stats.seeds_for_power`) beside the n run. ``at`` instead of ``sd``: the
    pilot is the same contrast at that grid point of the study's own records (its paired differences' sd is
    read from them, so the number lives in the records alone)."""

    effect: float
    sd: float | None = None
    pilot: str = ""
    power: float = 0.8
    at: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.effect > 0 or (self.sd is None) == (self.at is None) or not (self.at is not None or self.pilot):
            raise SpecError(f"power plan: a positive effect (toward the claim, not {self.effect:g}) and either sd= "
                            "with pilot= naming where it was read, or at= (the same contrast's runs at that grid "
                            "point)")


@dataclass(frozen=True)
class Expect:
    """What the study expects of one paired contrast, and how it is judged (study/stats.py).

    ``arm - baseline`` on ``metric`` at the grid point ``at`` (every other axis but the seed fixed),
    paired by seed; the claim is that the difference lies above ``margin`` (``direction=+1``) or
    below it (``-1``), by the paired t-test at ``level`` two-sided (each side at ``level / 2``).
    ``kind``: "superior" (beyond the margin, 0 by default), "noninferior" (a "costs nothing / at or above /
    keeps" claim: the margin is the loss it allows, on the losing side, and ``why`` says why that size)
    or "equivalent" (|Δ| < |margin|, by TOST). ``delta`` (optional, with ``why``): the smallest
    difference that matters; a difference shown to lie within ±delta reads "equivalent within ±delta".
    ``effect``: the difference the source reports ("not reproduced" only from a test rejecting it);
    ``claim``, ``source``: in words, with the published values.

    ``family``: claims of one study bed sharing this text are also tested as one family claim (per seed
    the mean of their paired differences, one test; they must share metric, direction, margin and
    kind). ``speed``: (measure, margin): the claim is "at equal measured speed" only when an equivalence
    test on that measure's per-round timings of both arms (one interleaved run) holds within ``margin`` (x,
    e.g. :data:`EQUAL_SPEED`); the claim text's ``{at_speed}`` reads so, or "at its own pick" with both
    speeds. ``power``: a plan declared before
    the runs (:class:`Power`). ``unit``: what the test pairs: "seed" (each seed's difference of the two
    runs), or "item" (each test item's difference, pooled over the paired seeds: the unit of arms evaluated
    off the shelf on the reference, whose seeds are disjoint folds of the test items, not replications of a
    training run; a metric kept per item, in percent: a correct item is 100, a wrong one 0).
    """

    claim: str
    source: str
    arm: str
    baseline: str
    metric: str
    direction: int
    at: dict[str, Any] = field(default_factory=dict)
    margin: float = 0.0
    level: float = 0.05
    effect: float | None = None
    published: str = ""
    kind: str = "superior"
    delta: float | None = None
    why: str = ""
    family: str = ""
    speed: tuple[str, float] | None = None
    power: Power | None = None
    unit: str = "seed"

    def __post_init__(self) -> None:
        if self.unit not in ("seed", "item"):
            raise SpecError(f"claim {self.claim!r}: unit must be seed or item, not {self.unit!r}")
        if self.kind not in ("superior", "noninferior", "equivalent"):
            raise SpecError(f"claim {self.claim!r}: kind must be superior, noninferior or equivalent, "
                            f"not {self.kind!r}")
        if self.kind == "noninferior" and not (self.margin * self.direction < 0 and self.why):
            raise SpecError(f"claim {self.claim!r}: a non-inferiority claim declares its margin on the losing side "
                            f"(direction {self.direction:+d}, margin {self.margin:g}) and why that size (why=)")
        if self.kind == "equivalent" and not (self.margin and self.why):
            raise SpecError(f"claim {self.claim!r}: an equivalence claim declares its bound (margin=) and why=")
        if self.delta is not None and not (self.delta > 0 and self.why):
            raise SpecError(f"claim {self.claim!r}: delta= is a positive bound, declared with why=")
        if ("{at_speed}" in self.claim) != (self.speed is not None):
            raise SpecError(f"claim {self.claim!r}: speed= (measure, tolerance) and '{{at_speed}}' in its text go "
                            "together")


@dataclass(frozen=True)
class Measure:
    """A run that evaluates trained runs with the evaluation the ``eval`` command uses: the checkpoint
    of ``reference`` (arm at the grid point ``at``; None: the test bed's reference checkpoint, or on a
    test bed without one the baseline arm's run) unpatched and with each training-free ``specs``, and
    the runs ``finetuned`` (arm names, every run of theirs at ``at``: leave the seed out of ``at`` to
    group all seeds; each with the final evaluation its record holds, its cost counted and timed on its
    model), with throughput and latency; ``speed``: the eval's speed settings (``backend``)."""

    name: str
    reference: str | None
    at: dict[str, Any]
    specs: tuple[str, ...] = ()
    finetuned: tuple[str, ...] = ()
    speed: dict[str, Any] = field(default_factory=dict)
    columns: tuple[Col, ...] = ()  #: its table
    title: str = ""


@dataclass(frozen=True)
class Probe:
    """A run of a registered Experiment (probes/base.py) given as a spec, on the test bed's
    reference checkpoint (a test bed without one: the baseline arm's run at the grid's first point);
    with ``arm``: on that arm's run at the grid point ``at``.
    ``fmnist_only``: it reads Fashion-MNIST's raw images, so a test bed on other data skips it."""

    name: str
    experiment: str
    title: str = ""
    fmnist_only: bool = False
    arm: str | None = None
    at: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bench:
    """A run of the ``tokenreduce bench`` pipeline (bench/compare.py): ``specs`` against the unpatched
    model and the zero-reduction ``control`` in one interleaved run, with ``match_random`` a random
    pruner of each spec's token counts beside it; on the timm model ``model`` (``{"name", "kwargs"}``,
    random weights: nothing to train or load) or, with ``checkpoint`` (a trained recipe's name), on its
    trained weights. ``speed``: the command's timing flags (batch, warmup, repeats, min_run_s), backend,
    dtype and seed; ``stem``: ``--stem`` (the model with that stem, unreduced and with each spec, beside the
    plain rows); ``columns``: its table, (row key, header) as the command prints it."""

    name: str
    model: dict[str, Any]
    specs: tuple[str, ...] = ()
    checkpoint: str | None = None
    control: str = "tome(r=0)"
    match_random: bool = False
    stem: str | None = None
    speed: dict[str, Any] = field(default_factory=dict)
    columns: tuple[tuple[str, str], ...] = ()  #: empty: the bench command's (bench/compare.py)
    title: str = ""


@dataclass(frozen=True)
class BenchTable:
    """Several benches of the same specs side by side (one backend each, say): a row per spec and the
    control, two cells per bench: speed-ups against the unpatched model at batch B / batch 1, and against
    the matched random pruner (``match_random``). ``headers``: the first column's, then two per bench."""

    title: str
    benches: tuple[str, ...]
    headers: tuple[str, ...]


@dataclass(frozen=True)
class Smoke:
    """The smoke version: a test bed, recipe overrides (TrainConfig fields) and a smaller grid
    (axis name -> values); everything else is the bed's own."""

    testbed: Testbed
    recipe: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    measure: dict[str, Any] = field(default_factory=dict)  #: speed settings (bench/evaluation.py)
    probe: dict[str, Any] = field(default_factory=dict)  #: parameters added to every probe's spec
    #: every bench's overrides: timing settings (batch, repeats ...) and ``model_kwargs``, merged into its
    #: model's kwargs (a narrow copy of the same depth and patch grid); a smoke never loads a checkpoint
    bench: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Bed:
    """What a study declares for one test bed: the ``testbed`` its runs start from and are scored on, and
    everything that depends on it: the ``recipe`` (TrainConfig fields), the ``arms`` (their specs name
    per-block counts, which depend on the patch grid), the ``baseline`` arm, the ``grid``, the axis tables
    are ``split`` by, the table ``columns``, ``measures``, ``probes``, ``benches`` and ``bench_tables``, the
    ``smoke`` version, the ``budget`` (what the bed's runs cost where they were run) and ``pending`` (why
    runs are missing). ``title``: the bed's heading (default: the study's). The claims are the study's,
    declared once (:attr:`Study.expect`): a bed tests each claim whose arms it has.

    A bed with benches only trains nothing: no arms, recipe, baseline, grid, columns or measures."""

    testbed: Testbed = Testbed()
    title: str = ""
    recipe: dict[str, Any] = field(default_factory=dict)
    arms: dict[str, Arm] = field(default_factory=dict)
    baseline: str = ""
    grid: tuple[Axis, ...] = ()
    split: tuple[str, str] | None = None
    columns: tuple[Col, ...] = ()
    measures: tuple[Measure, ...] = ()
    probes: tuple[Probe, ...] = ()
    benches: tuple[Bench, ...] = ()
    bench_tables: tuple[BenchTable, ...] = ()
    smoke: Smoke | None = None
    #: the compute plan, declared before the runs: (runs, kind of run, measured minutes a run) per kind of run
    budget: tuple[tuple[int, str, float], ...] = ()
    pending: str = ""


@dataclass(frozen=True)
class Point:
    """One run of a study: ``arm`` at grid ``values`` (axis name -> value); ``id`` e.g. ``d_eet-b16-s0``."""

    arm: str
    values: dict[str, Any]
    id: str

    def matches(self, at: dict[str, Any]) -> bool:
        return all(self.values.get(k) == v for k, v in at.items())


def tests_claim(bed: Bed, e: Expect) -> bool:
    """Whether ``bed`` tests the claim ``e``: it has both its arms, and they run where ``e`` reads them."""
    axes = {a.name: a.values for a in bed.grid}
    return (e.arm in bed.arms and e.baseline in bed.arms and all(k in axes and v in axes[k] for k, v in e.at.items())
            and all(_allows(bed.arms[a].only, e.at) for a in (e.arm, e.baseline)))


# ----------------------------------------------------------------------------- the study


class Study:
    """Base class of every study (module docstring). A subclass sets ``title``, ``claim``, ``source``, its
    claims (``expect``) and its ``beds`` (name -> :class:`Bed`, the first the default). An instance is the
    study on one bed: its attributes are that bed's declarations, its ``expect`` the claims the bed tests."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoParams  # the registry's; a study takes its parameters as test bed and flags
    title: ClassVar[str] = ""
    claim: ClassVar[str] = ""
    source: ClassVar[str] = ""
    #: the claims, each declared once; every bed tests those whose arms it has (:func:`tests_claim`)
    expect: ClassVar[tuple[Expect, ...]] = ()
    beds: ClassVar[dict[str, Bed]] = {}
    #: the paper's own schedule in epochs (the report sets the fine-tune lengths run here against the papers')
    paper_epochs: ClassVar[int | None] = None

    def __init__(self, bed: str | None = None, *, testbed: Testbed | None = None, smoke: bool = False) -> None:
        cls = type(self)
        self.bed_name = bed or next(iter(cls.beds))
        if self.bed_name not in cls.beds:
            raise TokenReduceError(f"study {cls.name} has no test bed {bed!r}; choose from {', '.join(cls.beds)}")
        decl = cls.beds[self.bed_name]
        for f in dataclasses.fields(Bed):
            if f.name != "testbed":
                setattr(self, f.name, getattr(decl, f.name))
        self.title = decl.title or cls.title
        self.expect = tuple(e for e in cls.expect if tests_claim(decl, e))
        self.is_smoke = smoke
        if smoke and self.smoke is None:
            raise TokenReduceError(f"study {cls.name} declares no smoke version on the test bed {self.bed_name}")
        default = self.smoke.testbed if smoke else decl.testbed
        if not self.arms and testbed is not None and testbed != default:
            raise TokenReduceError(f"study {cls.name} trains nothing (benches only, each on its own model); "
                                   "it takes no test bed (--model, --pretrained, --weights, --data)")
        self.bed = testbed if testbed is not None else default
        self.default_bed = testbed is None or testbed == default

    @property
    def key(self) -> str:
        """``name/bed``: where its results live under results/ and the prefix of its run ids."""
        return f"{self.name}/{self.bed_name}"

    @property
    def is_default_bed(self) -> bool:
        """Whether the study runs on its first declared bed (its commands need no ``--testbed``)."""
        return self.bed_name == next(iter(type(self).beds))

    # -- the plan

    def axes(self) -> tuple[Axis, ...]:
        if not self.is_smoke:
            return self.grid
        return tuple(dataclasses.replace(a, values=tuple(self.smoke.grid.get(a.name, a.values))) for a in self.grid)

    def points(self) -> list[Point]:
        """Every arm at every grid point it runs at (``Arm.only``), in a stable order (grid outer, arms
        inner)."""
        axes = self.axes()
        out = []
        for values in itertools.product(*(a.values for a in axes)):
            point = dict(zip((a.name for a in axes), values, strict=True))
            for arm in self.arms:
                if not self.runs_at(arm, point):
                    continue
                parts = [f"{a.short}{v}" for a, v in zip(axes, values, strict=True) if v != a.implicit]
                out.append(Point(arm, point, "-".join([arm, *parts])))
        return out

    def runs_at(self, arm: str, at: dict[str, Any]) -> bool:
        """Whether ``arm`` has runs at ``at`` (its ``only`` allows every value ``at`` fixes)."""
        at = self.resolve(at)
        return any(not _outside({k: [self.resolve({k: v})[k] for v in vs] for k, vs in o.items()}, at)
                   for o in _alternatives(self.arms[arm].only))

    def complete(self, at: dict[str, Any]) -> dict[str, Any]:
        r"""``at`` (:meth:`resolve`\ d) with every axis but the seed that it leaves out fixed at that axis'
        ``implicit`` value, else its first: a claim or measure that names no length reads the runs
        every arm has."""
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

    def measure_runs(self, m: Measure) -> tuple[str | None, list[str]]:
        """The run ids measure ``m`` reads: its reference's (None: the test bed's reference checkpoint, or
        where it has none and the baseline is evaluated off the shelf, the model at its initialisation)
        and its fine-tuned runs' (every run of each arm at ``m.at``, in plan order)."""
        off_the_shelf = self.arms[self.baseline].evaluates == REFERENCE
        ref = m.reference or (None if self.bed.reference or off_the_shelf else self.baseline)
        at = self.complete(m.at)
        tuned = [p.id for a in m.finetuned for p in self.points() if p.arm == a and p.matches(at)]
        return (self.point(ref, m.at).id if ref else None), tuned

    def bench_run(self, b: Bench) -> Bench:
        """``b`` as this study runs it: the smoke's timing settings and narrower model, no checkpoint."""
        if not self.is_smoke:
            return b
        over = dict(self.smoke.bench)
        kwargs = {**b.model.get("kwargs", {}), **over.pop("model_kwargs", {})}
        return dataclasses.replace(b, model={**b.model, "kwargs": kwargs}, checkpoint=None, speed={**b.speed, **over})

    def eval_items(self, scratch: Path) -> tuple[str | None, int | None]:
        """(data_dir, eval_subset) of the study's runs: where a measure finds the same test items (a
        synthetic test bed's folder under ``scratch``, else the checkpoint's own data) and how many."""
        recipe = {**self.recipe, **(self.smoke.recipe if self.is_smoke else {})}
        data_dir = str(synthetic_data(scratch)) if self.bed.synthetic and self.bed.data else None
        return data_dir, recipe.get("eval_subset")

    def train_fields(self, p: Point, scratch: Path) -> dict[str, Any]:
        """TrainConfig fields of run ``p`` (without ``out``, set by the runner): recipe, test bed, smoke
        overrides, arm, grid point, in increasing priority; ``scratch``: where a synthetic test bed's
        data goes."""
        arm = self.arms[p.arm]
        fields = {**self.recipe, **self.bed.train_fields(scratch), **(self.smoke.recipe if self.is_smoke else {})}
        task = arm.task or fields.get("task") or "classify"
        sets = {a.name: a.sets for a in self.axes() if a.sets}
        for k, v in p.values.items():
            if k in sets:
                fields.update(sets[k].get(v, {}))
            elif k in _CONFIG_FIELDS:
                fields[k] = v
            else:
                task = _with_param(task, k, v)
        fields["task"] = task
        fields["spec"] = arm.spec.format(**p.values) if arm.spec else None
        if fields.get("teacher") == TESTBED_TEACHER:
            fields["teacher"] = self.bed.checkpoint()
            if fields["teacher"] is None:
                raise TokenReduceError(f"study {self.name}: its recipe distils from the test bed's reference, and "
                                       f"{self.bed.text()} has none; give a test bed with a reference checkpoint")
        if (arm.transforms or arm.stem) and not fields.get("model") and self.bed.reference:
            from ..train.recipes import get_recipe  # the reference's architecture, its stem swapped / transformed

            fields["model"] = get_recipe(self.bed.reference)["model"]
        if arm.stem or arm.transforms:
            if not fields.get("model"):
                raise TokenReduceError(f"study {self.name}, arm {p.arm}: a stem or transform needs a test bed "
                                       "that builds its model (not a reference checkpoint)")
            fields["model"] = {**fields["model"], **({"stem": arm.stem} if arm.stem else {}),
                               **({"transforms": list(arm.transforms)} if arm.transforms else {})}
        for k in ("init", "teacher"):
            if getattr(arm, k):
                fields[k] = getattr(arm, k)
        return fields


_CONFIG_FIELDS: set[str] = set()
#: a recipe's ``teacher`` meaning "the test bed's reference checkpoint" (it distils from what it starts from)
TESTBED_TEACHER = "testbed"


def _config_fields() -> set[str]:
    from ..train.config import TrainConfig

    return {f.name for f in dataclasses.fields(TrainConfig)}


def _with_param(spec: str, key: str, value: Any) -> str:
    name, params = parse_spec(spec)
    return format_spec(name, {**params, key: value})


#: What a bench's ``speed`` may set: the ``bench`` command's timing flags, backend, dtype and seed.
_BENCH_SETTINGS = {"batch", "warmup", "repeats", "min_run_s", "backend", "compile_mode", "dtype", "seed"}


def check_study(cls: type[Study]) -> None:
    """Refuse a study whose declarations do not fit together (a typo here would surface hours later):
    each bed's, and a claim that no bed tests."""
    if not _CONFIG_FIELDS:
        _CONFIG_FIELDS.update(_config_fields())
    if not cls.beds:
        raise SpecError(f"study {cls.name} declares no test bed (beds = {{name: Bed(...)}})")
    for bed, decl in cls.beds.items():
        view = SimpleNamespace(**{f.name: getattr(decl, f.name) for f in dataclasses.fields(Bed)},
                               name=f"{cls.name} (test bed {bed})",
                               expect=tuple(e for e in cls.expect if tests_claim(decl, e)))
        _check_bed(view, cls.expect)
    untested = [e.claim for e in cls.expect if not any(tests_claim(d, e) for d in cls.beds.values())]
    if untested:
        arms = {b: sorted(d.arms) for b, d in cls.beds.items()}
        raise SpecError(f"study {cls.name}: no test bed has the arms (at the grid point) of the claims {untested}; "
                        f"its beds' arms: {arms}")


def _check_bed(cls: SimpleNamespace, claims: tuple[Expect, ...]) -> None:
    """One bed's declarations (``cls``: the bed's fields, its name and the claims it tests)."""
    where = f"study {cls.name}"
    names = [*(m.name for m in cls.measures), *(p.name for p in cls.probes), *(b.name for b in cls.benches)]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: its measures, probes and benches need distinct names; they are {names}")
    smoke_bench = [("smoke bench", cls.smoke.bench, {"model_kwargs"})] if cls.smoke else []
    for what, speed, more in [*((f"bench {b.name}", b.speed, set()) for b in cls.benches), *smoke_bench]:
        bad = sorted(set(speed) - _BENCH_SETTINGS - more)
        if bad:
            raise SpecError(f"{where}: its {what} names unknown settings {bad}; "
                            f"choose from {sorted(_BENCH_SETTINGS | more)}")
    for t in cls.bench_tables:
        unknown = sorted(set(t.benches) - {b.name for b in cls.benches})
        if unknown or len(t.headers) != 1 + 2 * len(t.benches):
            raise SpecError(f"{where}: bench table {t.title!r} needs benches it declares (unknown: {unknown}) and "
                            f"1 + 2 per bench headers (it has {len(t.headers)} for {len(t.benches)})")
    if not cls.arms:
        extra = [k for k in ("recipe", "baseline", "grid", "split", "columns", "expect", "measures", "probes")
                 if getattr(cls, k)]
        if extra or not cls.benches:
            raise SpecError(f"{where} has no arms: it trains nothing, so it declares benches only and no recipe, "
                            "baseline, grid, split, columns, expectations, measures or probes "
                            f"(it has {', '.join(extra) or 'no benches'})")
        return
    overrides = [("recipe", cls.recipe)] + ([("smoke recipe", cls.smoke.recipe)] if cls.smoke else []) + \
        [(f"axis {a.name} at {v}", f) for a in cls.grid for v, f in a.sets.items()]
    for what, fields in overrides:
        bad = sorted(set(fields) - _CONFIG_FIELDS)
        if bad:
            raise SpecError(f"{where}: its {what} names unknown training settings {bad}")
    for name, arm in cls.arms.items():
        if arm.evaluates == REFERENCE:
            if not arm.spec or arm.experiment or any(getattr(arm, k) for k in (
                    "task", "stem", "transforms", "init", "teacher", "after")):
                raise SpecError(f"{where}: arm {name} is evaluated on the test bed's reference; it takes a label, "
                                "evaluates=REFERENCE and the spec applied off the shelf, nothing else")
            continue
        if (arm.evaluates is None) != (arm.experiment is None):
            raise SpecError(f"{where}: arm {name} gives one of evaluates= and experiment=; an evaluated arm needs both")
        if arm.evaluates is not None:
            source = cls.arms.get(arm.evaluates)
            if source is None or source.evaluates is not None:
                raise SpecError(f"{where}: arm {name} evaluates {arm.evaluates!r}, which is not one of its trained "
                                f"arms {sorted(n for n, a in cls.arms.items() if a.evaluates is None)}")
            if any(getattr(arm, k) for k in ("task", "spec", "stem", "transforms", "init", "teacher", "after")):
                raise SpecError(f"{where}: arm {name} is evaluated (it trains nothing); it takes only a label, "
                                "evaluates= and experiment=")
        if arm.after is not None:
            source = cls.arms.get(arm.after)
            if source is None or source.evaluates is not None or arm.after == name or arm.init:
                raise SpecError(f"{where}: arm {name} continues after {arm.after!r}, which must be another of its "
                                f"trained arms {sorted(n for n, a in cls.arms.items() if a.evaluates is None)}, "
                                "and then gives no init=")
    axes = {a.name: a.values for a in cls.grid}
    for name, arm in cls.arms.items():
        bad = {k: v for o in _alternatives(arm.only) for k, v in o.items()
               if k not in axes or k == "seed" or set(v) - set(axes[k])}
        if bad:
            raise SpecError(f"{where}: arm {name} runs only at {bad}, which is not a set of values of its grid's "
                            f"axes other than the seed ({ {k: v for k, v in axes.items() if k != 'seed'} })")
        source = arm.after or (arm.evaluates if arm.evaluates != REFERENCE else None)
        grid = [dict(zip(axes, v, strict=True)) for v in itertools.product(*axes.values())]
        if source and any(_allows(arm.only, p) and not _allows(cls.arms[source].only, p) for p in grid):
            raise SpecError(f"{where}: arm {name} reads arm {source}'s runs where {source} has none (its only= "
                            f"{arm.only} reaches beyond {source}'s {cls.arms[source].only})")
    if cls.baseline not in cls.arms:
        raise SpecError(f"{where}: baseline {cls.baseline!r} is not one of its arms {sorted(cls.arms)}")
    names = {a.name for a in cls.grid}
    if cls.smoke and set(cls.smoke.grid) - names:
        raise SpecError(f"{where}: its smoke grid names axes it lacks {sorted(set(cls.smoke.grid) - names)}")
    if "seed" not in names:
        raise SpecError(f"{where}: its grid needs a 'seed' axis (contrasts are paired by seed)")
    for e in claims:
        if "seed" in e.at:
            raise SpecError(f"{where}: the claim {e.claim!r} fixes the seed; it may fix grid axes other than seed")
    for m in cls.measures:
        for arm in (*([m.reference] if m.reference else []), *m.finetuned):
            if arm not in cls.arms:
                raise SpecError(f"{where}: measure {m.name} names unknown arm {arm!r}")
        _runs_there(cls, f"measure {m.name}", (*([m.reference] if m.reference else []), *m.finetuned), m.at)
        same: dict[tuple, str] = {}
        for arm in m.finetuned:
            a = cls.arms[arm]
            other = same.setdefault((a.spec, a.stem, a.transforms), arm)
            if other != arm:  # the evaluation groups checkpoints by model and spec
                raise SpecError(f"{where}: measure {m.name} reads arms {other} and {arm}, which carry the same model "
                                "and spec: their checkpoints would make one row; measure one of them")
    for pr in cls.probes:
        if pr.arm is not None and pr.arm not in cls.arms:
            raise SpecError(f"{where}: probe {pr.name} names unknown arm {pr.arm!r}")


def _outside(only: dict[str, Any], at: dict[str, Any]) -> bool:
    """Whether ``at`` fixes a value that one alternative of an arm's ``only`` leaves out."""
    return any(k in only and v not in only[k] for k, v in at.items())


def _alternatives(only: dict[str, Any] | tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """An arm's ``only`` as alternatives: the arm runs where any of them allows."""
    return (only,) if isinstance(only, dict) else tuple(only)


def _allows(only: dict[str, Any] | tuple[dict[str, Any], ...], at: dict[str, Any]) -> bool:
    """Whether an arm with ``only`` has runs at ``at`` (one alternative leaves every fixed value in)."""
    return any(not _outside(o, at) for o in _alternatives(only))


def _runs_there(cls: type[Study], what: str, arms: tuple[str, ...], at: dict[str, Any]) -> None:
    for arm in arms:
        only = cls.arms[arm].only
        if not _allows(only, at):
            raise SpecError(f"study {cls.name}: {what} reads arm {arm} at {at}, where it has no runs (only {only})")


# ----------------------------------------------------------------------------- registry


def _builtins() -> None:
    importlib.import_module("tokenreduce.studies")  # the built-in studies register themselves on import


_STUDIES: Registry[type[Study]] = Registry("study", load=_builtins)


def register_study(name: str) -> Callable[[type[Study]], type[Study]]:
    """Class decorator: register a Study subclass as ``name`` (its runs' ids start ``name/``)."""
    def wrap(cls: type[Study]) -> type[Study]:
        cls.name = name
        check_study(cls)
        return _STUDIES.register_class(name)(cls)

    return wrap


def list_studies() -> list[str]:
    return _STUDIES.names()


def get_study(name: str) -> type[Study]:
    return _STUDIES.get(name)

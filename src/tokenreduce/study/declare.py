"""A study: a paper's claims as controlled comparisons, declared once and run on each of its test beds.

A study (one module under studies/, named as registered) names the ``claim`` it tests, its
``source`` and its claims (``expect``: :class:`Expect`, the statistic, the margin, the published effect),
and its test beds (``beds``: name -> :class:`Bed`; the first is the default, ``tokenreduce study NAME
--testbed BED`` picks another). A bed declares what depends on the test bed: the :class:`Testbed` its
runs start from and are scored on (a built-in reference, or a timm model with pretrained or local
weights and a dataset or image folder), a typed ``recipe`` (TrainConfig fields, checked when the study
is registered), its ``arms`` (:class:`Arm`: what each is, by its ``kind``, and its reducer spec, task
spec, stem, transforms; their specs name per-block counts, which depend on the patch grid), a ``grid``
(:class:`Axis`: seeds, code lengths ...), the tables it prints (:class:`Col`, every table's columns), its
``evaluations`` off the grid, each said by its type (:class:`Measure` and :class:`Probe` evaluate its
trained runs, :class:`Bench` is the ``bench`` command's timing of specs on a model given by its config;
``bench_tables``: several side by side), a ``smoke`` version (a dict, :data:`SMOKE_KEYS`: the same bed at
tiny sizes, run by the test suite) and its ``budget``. Every bed
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

from ..core.errors import SpecError, TokenReduceError
from ..core.registry import NoParams, Registry, format_spec, parse_spec
from .testbed import Testbed, synthetic_data

# ----------------------------------------------------------------------------- declarations


#: What an arm is (:attr:`Arm.kind`): ``trained`` from the test bed's start; trained ``after`` another arm (a
#: second phase from its checkpoint); ``evaluated``: a registered experiment run on another arm's checkpoint;
#: ``off_the_shelf``: its spec applied to the test bed's reference, untrained
TRAINED, AFTER, EVALUATED, OFF_THE_SHELF = "trained", "after", "evaluated", "off_the_shelf"
ARM_KINDS = (TRAINED, AFTER, EVALUATED, OFF_THE_SHELF)


@dataclass(frozen=True)
class Arm:
    """One arm: what differs from the recipe, and what it is: its ``kind`` (:data:`ARM_KINDS`). ``label``: the
    name tables print; ``only``: where on the grid it runs (below); the rest by kind.

    ``trained`` (the default): ``spec`` is the reducer to train with (None: none), ``task`` a task spec (None:
    the recipe's), ``stem`` and ``transforms`` model options (models/build.py; on a test bed's reference
    checkpoint a stem is swapped in with fresh weights, the rest kept). ``spec`` may name grid values in braces
    (``random(..., seed={seed})``: a pruner's own seed that follows the run's).

    ``after``: the same, its training started from the checkpoint of the trained arm ``reads`` at the same grid
    point in place of the test bed's (a second phase: its run waits for that one).

    ``evaluated``: trains nothing; ``spec`` is the registered experiment (probes/base.py) run on the checkpoint
    of the arm ``reads`` at the same grid point, whose result's ``metrics`` are the arm's (e.g.
    ``oracle_at_counts``: the oracle at a trained pruner's counts, on its weights; the spec may name the
    point's training settings in braces, ``subset={eval_subset}``: the test items the source run was scored
    on). Its runs pair with the others' by seed like any arm's.

    ``off_the_shelf``: trains nothing either: ``spec`` applied to the test bed's reference (a training-free
    method as its paper measures it), scored per item; its run at the n-th planned seed is scored on the n-th
    of as many disjoint folds of the test items (items n, n + S, n + 2S, ... of the runs' items, S seeds), so
    the seeds of two such arms pair item for item and together cover every test item once. Its claims take
    the test item as their unit (:meth:`Study.per_item`).

    ``only`` narrows the grid for this arm: axis name -> the values it runs at (``{"bits": (16,)}``: a
    sensitivity arm at one of several code lengths); an axis not named runs at all of its values, and a
    smoke grid without a named value runs the arm at the axis' first (:meth:`Study.resolve`). A tuple of
    such dicts: the arm runs where any of them allows (``({"steps": (100,)}, {"bits": (16,)})``: every
    code length on the short schedule, 16 bits on the long one)."""

    label: str
    spec: str | None = None
    kind: str = TRAINED
    reads: str | None = None
    task: str | None = None
    stem: str | None = None
    transforms: tuple[str, ...] = ()
    only: dict[str, tuple[Any, ...]] | tuple[dict[str, tuple[Any, ...]], ...] = field(default_factory=dict)


#: what an off-the-shelf arm's record says it evaluates: the test bed's reference
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
    """A table column headed ``header`` (the one column syntax of every table). In an arm table: the run metric
    ``metric`` (mean ± std over the grid's seeds), with ``paired=True`` the difference from the baseline arm,
    paired by seed. In a measure's table: the row's value ``metric`` written with ``fmt``. In a bench's: the
    ``bench`` command's row key ``metric``, as the command writes it. In a bench table (:attr:`Bed.bench_tables`):
    the first column the row's label, each other the speed-ups of the bench ``metric`` names, against the
    unpatched model or, ``paired``, its matched random pruner."""

    metric: str
    header: str
    paired: bool = False
    fmt: str = "{:.2f}"


#: The power a claim's plan (:attr:`Expect.power`) asks of its test
POWER = 0.8

#: The margin within which two arms count as "at equal measured speed" (study/tables.py, claim_text):
#: a tenth of the speed-up, the order the timing noise of one interleaved run on 2 CPU threads allows
#: with ten rounds (each speed table prints its own measured noise); a tighter margin could not be shown.
EQUAL_SPEED = 0.1


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
    speeds. ``power``: a power plan declared before the runs: the smallest difference (toward the claim) its
    test must detect with :data:`POWER`; the report states the n of seeds that gives it at the level the
    claim is decided at (its level over the tests of its study's Holm family: :func:`~.stats.seeds_for_power`)
    beside the n run, at the pilot sd of the same contrast's own records where the grid was first run
    (:meth:`Study.pilot`: a longer fine-tune's plan reads the shortened schedule's). What the test pairs follows from
    the arms (:meth:`Study.per_item`): each seed's difference of the two runs, or for arms evaluated off the
    shelf each test item's.
    """

    claim: str
    source: str
    arm: str
    baseline: str
    metric: str
    direction: int
    at: dict[str, Any] = field(default_factory=dict)
    margin: float = 0.0
    effect: float | None = None
    published: str = ""
    kind: str = "superior"
    delta: float | None = None
    why: str = ""
    family: str = ""
    speed: tuple[str, float] | None = None
    power: float | None = None
    #: every claim's level, two-sided (not a field: no claim declares another)
    level = 0.05

    def __post_init__(self) -> None:
        if self.power is not None and not self.power > 0:
            raise SpecError(f"claim {self.claim!r}: a power plan's effect is positive (toward the claim), "
                            f"not {self.power:g}")
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
    plain rows); ``columns``: its table (:class:`Col`; empty: the command's)."""

    name: str
    model: dict[str, Any]
    specs: tuple[str, ...] = ()
    checkpoint: str | None = None
    match_random: bool = False
    stem: str | None = None
    speed: dict[str, Any] = field(default_factory=dict)
    columns: tuple[Col, ...] = ()
    title: str = ""
    #: the zero-reduction control every bench times (not a field: no bench declares another)
    control = "tome(r=0)"


#: What a bed's ``smoke`` may set (one smoke syntax with an experiment's, probes/base.py: a dict of what differs in
#: the smoke, the rest the bed's own): its ``testbed`` (default: the bed's), ``recipe`` overrides (TrainConfig
#: fields), a smaller ``grid`` (axis name -> values), the ``measure``\ s' speed settings (bench/evaluation.py),
#: the parameters added to every ``probe``'s spec, and every ``bench``'s overrides: timing settings (batch,
#: repeats ...) and ``model_kwargs``, merged into its model's kwargs (a narrow copy of the same depth and patch
#: grid; a smoke never loads a checkpoint)
SMOKE_KEYS = ("testbed", "recipe", "grid", "measure", "probe", "bench")


@dataclass(frozen=True)
class Bed:
    """What a study declares for one test bed: the ``testbed`` its runs start from and are scored on, and
    everything that depends on it: the ``recipe`` (TrainConfig fields), the ``arms`` (their specs name
    per-block counts, which depend on the patch grid), the ``baseline`` arm, the ``grid``, the axis tables
    are ``split`` by, the table ``columns``, its ``evaluations`` off the grid (each said by its type:
    :class:`Measure`, :class:`Probe`, :class:`Bench`; read as ``measures``, ``probes``, ``benches``), the
    ``bench_tables``, the
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
    evaluations: tuple[Measure | Probe | Bench, ...] = ()
    #: several benches of the same specs side by side (one backend each, say): title -> its columns (:class:`Col`)
    bench_tables: dict[str, tuple[Col, ...]] = field(default_factory=dict)
    smoke: dict[str, Any] | None = None  #: :data:`SMOKE_KEYS`
    #: the compute plan, declared before the runs: (runs, kind of run, measured minutes a run) per kind of run
    budget: tuple[tuple[int, str, float], ...] = ()
    pending: str = ""

    @property
    def measures(self) -> tuple[Measure, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Measure))

    @property
    def probes(self) -> tuple[Probe, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Probe))

    @property
    def benches(self) -> tuple[Bench, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Bench))


def _declared(bed: Bed) -> dict[str, Any]:
    """``bed``'s declarations by name: its fields, and its evaluations by type (measures, probes, benches)."""
    return {**{f.name: getattr(bed, f.name) for f in dataclasses.fields(Bed)},
            **{k: getattr(bed, k) for k in ("measures", "probes", "benches")}}


@dataclass(frozen=True)
class Point:
    """One run of a study: ``arm`` at grid ``values`` (axis name -> value); ``id`` e.g. ``d_eet-b16-s0``. The
    engine's (:meth:`Study.points`), not a declaration: no study writes one."""

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
        for k, v in _declared(decl).items():
            if k != "testbed":
                setattr(self, k, v)
        self.title = decl.title or cls.title
        self.expect = tuple(e for e in cls.expect if tests_claim(decl, e))
        self.is_smoke = smoke
        if smoke and self.smoke is None:
            raise TokenReduceError(f"study {cls.name} declares no smoke version on the test bed {self.bed_name}")
        default = self.smoke.get("testbed", decl.testbed) if smoke else decl.testbed
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
        grid = self.smoke_over("grid")
        return tuple(dataclasses.replace(a, values=tuple(grid.get(a.name, a.values))) for a in self.grid)

    def smoke_over(self, key: str) -> dict[str, Any]:
        """What the smoke sets for ``key`` (:data:`SMOKE_KEYS`: recipe, grid, measure, probe, bench); nothing
        outside a smoke."""
        return self.smoke.get(key, {}) if self.is_smoke else {}

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
        off_the_shelf = self.arms[self.baseline].kind == OFF_THE_SHELF
        ref = m.reference or (None if self.bed.reference or off_the_shelf else self.baseline)
        at = self.complete(m.at)
        tuned = [p.id for a in m.finetuned for p in self.points() if p.arm == a and p.matches(at)]
        return (self.point(ref, m.at).id if ref else None), tuned

    def pilot(self, e: Expect) -> dict[str, Any]:
        """The grid point whose records give claim ``e``'s power plan its pilot sd: the same contrast with each
        axis that has an ``implicit`` value at it (the runs made first: the shortened fine-tune)."""
        return {**e.at, **{a.name: a.implicit for a in self.grid if a.implicit is not None}}

    def per_item(self, e: Expect) -> bool:
        """Whether claim ``e`` takes the test item as its unit, not the seed: its arms are evaluated off the
        shelf, so their seeds are disjoint folds of the test items, not replications of a training run (a
        metric kept per item, in percent: a correct item is 100, a wrong one 0)."""
        return all(a in self.arms and self.arms[a].kind == OFF_THE_SHELF for a in (e.arm, e.baseline))

    def bench_run(self, b: Bench) -> Bench:
        """``b`` as this study runs it: the smoke's timing settings and narrower model, no checkpoint."""
        if not self.is_smoke:
            return b
        over = dict(self.smoke_over("bench"))
        kwargs = {**b.model.get("kwargs", {}), **over.pop("model_kwargs", {})}
        return dataclasses.replace(b, model={**b.model, "kwargs": kwargs}, checkpoint=None, speed={**b.speed, **over})

    def eval_items(self, scratch: Path) -> tuple[str | None, int | None]:
        """(data_dir, eval_subset) of the study's runs: where a measure finds the same test items (a
        synthetic test bed's folder under ``scratch``, else the checkpoint's own data) and how many."""
        recipe = {**self.recipe, **self.smoke_over("recipe")}
        data_dir = str(synthetic_data(scratch)) if self.bed.synthetic and self.bed.data else None
        return data_dir, recipe.get("eval_subset")

    def train_fields(self, p: Point, scratch: Path) -> dict[str, Any]:
        """TrainConfig fields of run ``p`` (without ``out``, set by the runner): recipe, test bed, smoke
        overrides, arm, grid point, in increasing priority; ``scratch``: where a synthetic test bed's
        data goes."""
        arm = self.arms[p.arm]
        fields = {**self.recipe, **self.bed.train_fields(scratch), **self.smoke_over("recipe")}
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
        fields["spec"] = arm.spec.format(**p.values) if arm.spec and arm.kind != EVALUATED else None
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
        view = SimpleNamespace(**_declared(decl), name=f"{cls.name} (test bed {bed})",
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
    smoke = cls.smoke or {}
    if set(smoke) - set(SMOKE_KEYS):
        raise SpecError(f"{where}: its smoke sets unknown keys {sorted(set(smoke) - set(SMOKE_KEYS))}; "
                        f"choose from {list(SMOKE_KEYS)}")
    smoke_bench = [("smoke bench", smoke.get("bench", {}), {"model_kwargs"})]
    for what, speed, more in [*((f"bench {b.name}", b.speed, set()) for b in cls.benches), *smoke_bench]:
        bad = sorted(set(speed) - _BENCH_SETTINGS - more)
        if bad:
            raise SpecError(f"{where}: its {what} names unknown settings {bad}; "
                            f"choose from {sorted(_BENCH_SETTINGS | more)}")
    for title, columns in cls.bench_tables.items():
        unknown = sorted({c.metric for c in columns[1:]} - {b.name for b in cls.benches})
        if unknown or len(columns) < 2:
            raise SpecError(f"{where}: bench table {title!r} needs its label column, then columns of the benches it "
                            f"declares (unknown: {unknown})")
    if not cls.arms:
        extra = [k for k in ("recipe", "baseline", "grid", "split", "columns", "expect", "measures", "probes")
                 if getattr(cls, k)]
        if extra or not cls.benches:
            raise SpecError(f"{where} has no arms: it trains nothing, so it declares benches only and no recipe, "
                            "baseline, grid, split, columns, expectations, measures or probes "
                            f"(it has {', '.join(extra) or 'no benches'})")
        return
    overrides = [("recipe", cls.recipe), ("smoke recipe", smoke.get("recipe", {}))] + \
        [(f"axis {a.name} at {v}", f) for a in cls.grid for v, f in a.sets.items()]
    for what, fields in overrides:
        bad = sorted(set(fields) - _CONFIG_FIELDS)
        if bad:
            raise SpecError(f"{where}: its {what} names unknown training settings {bad}")
    trained = sorted(n for n, a in cls.arms.items() if a.kind in (TRAINED, AFTER))
    for name, arm in cls.arms.items():
        if arm.kind not in ARM_KINDS:
            raise SpecError(f"{where}: arm {name} is of kind {arm.kind!r}; choose from {', '.join(ARM_KINDS)}")
        if arm.kind in (EVALUATED, OFF_THE_SHELF) and (not arm.spec or arm.task or arm.stem or arm.transforms):
            raise SpecError(f"{where}: arm {name} is {arm.kind} (it trains nothing); it takes a label, its spec (the "
                            f"{'experiment' if arm.kind == EVALUATED else 'reducer'} it applies), reads= and only=")
        if (arm.reads is not None) != (arm.kind in (AFTER, EVALUATED)):
            raise SpecError(f"{where}: arm {name}: reads= (the arm whose checkpoint it reads) goes with the kinds "
                            f"{AFTER!r} and {EVALUATED!r} alone (its kind: {arm.kind!r})")
        if arm.reads is not None and (arm.reads == name or arm.reads not in trained):
            raise SpecError(f"{where}: arm {name} reads {arm.reads!r}, which is not another of its trained arms "
                            f"{trained}")
    axes = {a.name: a.values for a in cls.grid}
    for name, arm in cls.arms.items():
        bad = {k: v for o in _alternatives(arm.only) for k, v in o.items()
               if k not in axes or k == "seed" or set(v) - set(axes[k])}
        if bad:
            raise SpecError(f"{where}: arm {name} runs only at {bad}, which is not a set of values of its grid's "
                            f"axes other than the seed ({ {k: v for k, v in axes.items() if k != 'seed'} })")
        source = arm.reads
        grid = [dict(zip(axes, v, strict=True)) for v in itertools.product(*axes.values())]
        if source and any(_allows(arm.only, p) and not _allows(cls.arms[source].only, p) for p in grid):
            raise SpecError(f"{where}: arm {name} reads arm {source}'s runs where {source} has none (its only= "
                            f"{arm.only} reaches beyond {source}'s {cls.arms[source].only})")
    if cls.baseline not in cls.arms:
        raise SpecError(f"{where}: baseline {cls.baseline!r} is not one of its arms {sorted(cls.arms)}")
    names = {a.name for a in cls.grid}
    if set(smoke.get("grid", {})) - names:
        raise SpecError(f"{where}: its smoke grid names axes it lacks {sorted(set(smoke['grid']) - names)}")
    if "seed" not in names:
        raise SpecError(f"{where}: its grid needs a 'seed' axis (contrasts are paired by seed)")
    first = {a.name: a.implicit for a in cls.grid if a.implicit is not None}
    for e in claims:
        if "seed" in e.at:
            raise SpecError(f"{where}: the claim {e.claim!r} fixes the seed; it may fix grid axes other than seed")
        if e.power is not None and e in cls.expect and {**e.at, **first} == e.at:
            raise SpecError(f"{where}: the claim {e.claim!r} declares a power plan, whose pilot is the same contrast "
                            "where the grid was first run (an axis' implicit value); it is there itself")
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
#: registries given for a while (:func:`reading`): :func:`get_study` finds their studies too, never listed
_GIVEN: list[Registry[type[Study]]] = []


def register_study(name: str, into: Registry[type[Study]] | None = None) -> Callable[[type[Study]], type[Study]]:
    """Class decorator: register a Study subclass as ``name`` (its runs' ids start ``name/``) into the built-in
    studies' registry, or ``into`` another (the tests' own studies: :func:`reading`)."""
    def wrap(cls: type[Study]) -> type[Study]:
        cls.name = name
        check_study(cls)
        return (into or _STUDIES).register_class(name)(cls)

    return wrap


@contextmanager
def reading(registry: Registry[type[Study]]) -> Iterator[None]:
    """While inside, :func:`get_study` (the ``study`` command, the report) finds the studies of ``registry``
    as well as the built-in ones (the tests' own studies); :func:`list_studies` lists the built-in ones only."""
    _GIVEN.append(registry)
    try:
        yield
    finally:
        _GIVEN.remove(registry)


def list_studies() -> list[str]:
    return _STUDIES.names()


def get_study(name: str) -> type[Study]:
    given = next((r for r in _GIVEN if name in r.names()), _STUDIES)
    return given.get(name)

"""The declaration types: what a study author writes (one module under studies/ per paper).

A study declares its claims once (:class:`Expect`) and its test beds (``beds``: name -> :class:`Bed`, the first the
default, ``--testbed BED`` another, a user's own test bed, ``--model``/``--data``, runs a declared bed's plan); a
bed tests each claim whose two arms it has (:func:`tests_claim`). Every arm x grid point is one run with a stable id
(``eet/scenes/d_eet-b16-s0``), planned by study/grid.py and study/plan.py. :func:`register_study` refuses
declarations that do not fit together, at import rather than hours into a run.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..bench.settings import SPEED
from ..core.errors import SpecError, TokenReduceError
from ..core.registry import NoParams, Registry
from ..train.config import field_names
from .grid import AFTER, ARM_KINDS, EVALUATED, OFF_THE_SHELF, TRAINED, Planned, allows, alternatives
from .grid import TESTBED_TEACHER as TESTBED_TEACHER  # re-exported: a recipe's value a study writes
from .testbed import Testbed


def _refuse(where: str, refusals: dict[str, bool]) -> None:
    """Every combination check's one mechanism: raise the first refusal that holds (its text -> whether it
    does) as ``where: text``."""
    for refusal, refused in refusals.items():
        if refused:
            raise SpecError(f"{where}: {refusal}")


def _unknown(what: str, given: Any, valid: Any) -> dict[str, bool]:
    """The refusal of names in ``given`` outside ``valid`` (``what``: what names them)."""
    unknown = sorted(set(given) - set(valid))
    return {f"its {what} {unknown}; choose from {sorted(valid)}": True} if unknown else {}


@dataclass(frozen=True)
class Arm:
    """One arm: what differs from the recipe, and what it is, by its ``kind``; ``label``: the name tables print.

    ``trained``: ``spec`` is the reducer it trains with (None: none; grid values in braces, ``random(seed={seed})``),
    ``options`` what else differs (:data:`ARM_OPTIONS`; a stem on a reference checkpoint starts with fresh weights).
    ``after``: the same, a second phase from the checkpoint of the trained arm ``reads`` at the same grid point.
    ``evaluated``: trains nothing; ``spec`` is a registered experiment (probes/base.py; the point's training
    settings in braces, ``subset={eval_subset}``) run on that checkpoint, whose result's ``metrics`` are the arm's.
    ``off_the_shelf``: ``spec`` applied untrained to the test bed's reference; its run at the n-th seed scores the
    n-th of as many disjoint folds of the test items, so its claims take the item as their unit.
    ``only``: axis -> the values it runs at (an axis not named: all; a smoke grid without them: its first); a tuple
    of such dicts: where any allows."""

    label: str
    spec: str | None = None
    kind: str = TRAINED
    reads: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    only: dict[str, tuple[Any, ...]] | tuple[dict[str, tuple[Any, ...]], ...] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _refuse(f"arm {self.label!r}", _unknown("options name unknown keys", self.options, ARM_OPTIONS))

    @property
    def task(self) -> str | None:
        return self.options.get("task")

    @property
    def stem(self) -> str | None:
        return self.options.get("stem")

    @property
    def transforms(self) -> tuple[str, ...]:
        return tuple(self.options.get("transforms", ()))


#: What an arm's ``options`` may change from the recipe: its task spec, its model's stem and transforms
ARM_OPTIONS = ("task", "stem", "transforms")
#: what an off-the-shelf arm's record says it evaluates: the test bed's reference
REFERENCE = "@reference"


@dataclass(frozen=True)
class Axis:
    """A grid axis: a TrainConfig field (``seed``) or a parameter of the task spec (``bits``); ``short`` prefixes
    its value in run ids (``s0``). ``sets``: a named setting (the fine-tune length), value -> the TrainConfig fields
    it sets, for every value but one: the recipe as it was, whose runs were made before the axis existed and whose
    ids leave it out (:attr:`implicit`)."""

    name: str
    values: tuple[Any, ...]
    short: str
    sets: dict[Any, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        left = [v for v in self.values if v not in self.sets]
        _refuse(f"axis {self.name}", {
            f"its sets= names every value but one (the one run ids leave out); it leaves out {left}":
                bool(self.sets) and len(left) > 1,
            **_unknown("sets= name unknown training settings", {k for s in self.sets.values() for k in s},
                       field_names())})

    @property
    def implicit(self) -> Any:
        """The value run ids leave out: with ``sets``, the one it sets nothing for; else none."""
        return next((v for v in self.values if v not in self.sets), None) if self.sets else None


@dataclass(frozen=True)
class Col:
    """A column of any table. In an arm table ``metric`` is a run metric (mean ± std over seeds; ``paired``: the
    difference from the baseline, paired by seed); in a measure's or a bench's, the row's key; in a bench table
    (:attr:`Bed.bench_tables`) after the label column, a bench whose speed-ups it shows (``paired``: against its
    matched random pruner, else the unpatched model)."""

    metric: str
    header: str
    paired: bool = False

    def text(self, value: Any) -> str:
        """``value`` as a measure's table writes it: text as it is, a number as :data:`FORMATS` says."""
        return value if isinstance(value, str) else FORMATS.get(self.metric, "{:.2f}").format(value)


#: how a measure's table writes a metric (every other to 2 decimals)
FORMATS = {"gmacs": "{:.4f}", "img_per_s": "{:.0f}", "macs": "{:,}"}
#: The power a claim's plan (:attr:`Expect.power`) asks of its test
POWER = 0.8
#: The margin within which two arms count as "at equal measured speed": a tenth of the speed-up, the order the
#: timing noise of one interleaved run on 2 CPU threads allows with ten rounds; a tighter one could not be shown.
EQUAL_SPEED = 0.1
EXPECT_KINDS = ("superior", "noninferior", "equivalent")
#: Whose claim is confirmatory: tested in the multiplicity families and given a verdict
CONFIRMATORY = "its paper's, its review's or the question the study was built to answer"
#: What a claim's ``source`` says when the contrast is this project's own (its reading of a detail the paper leaves
#: open, a floor the paper has none of), not :data:`CONFIRMATORY`: an exploratory claim
OWN = "this project's"


@dataclass(frozen=True)
class Expect:
    """A claim: one paired contrast and how it is judged (study/stats.py).

    ``arm - baseline`` on ``metric`` at the grid point ``at`` (any axis but the seed), paired by seed (by test item
    for arms evaluated off the shelf), lies beyond ``margin`` in ``direction`` (+1/-1) by the paired t-test at
    :attr:`level` two-sided. ``kind``: "superior"; "noninferior" (the margin is the loss allowed, on the losing
    side); "equivalent" (|Δ| < |margin|, by TOST); these two say ``why`` that margin. ``delta`` (with ``why``): the
    smallest difference that matters. ``reported``: the difference the source reports and its figures as written.
    ``family``: claims of one bed sharing this text are also tested as one (the per-seed mean of their
    differences). ``speed``: (measure, margin): "at equal measured speed" (the text's ``{at_speed}``) only when both
    arms' timings on that measure are shown equivalent within the margin. ``power``: the smallest difference toward
    the claim its test must detect with :data:`POWER`, planned from the same contrast's sd where the grid was first
    run (:meth:`Study.pilot`). ``source``: whose claim it is (:data:`OWN`: exploratory)."""

    claim: str
    source: str
    arm: str
    baseline: str
    metric: str
    direction: int
    at: dict[str, Any] = field(default_factory=dict)
    margin: float = 0.0
    reported: tuple[float, str] | None = None
    kind: str = "superior"
    delta: float | None = None
    why: str = ""
    family: str = ""
    speed: tuple[str, float] | None = None
    power: float | None = None
    #: every claim's level, two-sided (not a field: no claim declares another)
    level = 0.05

    @property
    def confirmatory(self) -> bool:
        """Whether the claim is :data:`CONFIRMATORY` (its ``source`` says whose): tested in the multiplicity families
        and given a verdict; else exploratory: raw p and interval."""
        return OWN not in self.source

    @property
    def effect(self) -> float | None:
        """The difference the source reports (None: it reports none)."""
        return None if self.reported is None else self.reported[0]

    @property
    def published(self) -> str:
        """The source's figures as it writes them ("" where it reports none)."""
        return "" if self.reported is None else self.reported[1]

    def __post_init__(self) -> None:
        _refuse(f"claim {self.claim!r}", {
            f"kind must be {', '.join(EXPECT_KINDS[:-1])} or {EXPECT_KINDS[-1]}, not {self.kind!r}":
                self.kind not in EXPECT_KINDS,
            "it fixes the seed; it may fix grid axes other than seed": "seed" in self.at,
            f"a power plan's effect is positive (toward the claim), not {self.power}":
                self.power is not None and not self.power > 0,
            f"a non-inferiority claim declares its margin on the losing side (direction {self.direction:+d}, margin "
            f"{self.margin:g}) and why that size (why=)":
                self.kind == "noninferior" and not (self.margin * self.direction < 0 and self.why),
            "an equivalence claim declares its bound (margin=) and why=":
                self.kind == "equivalent" and not (self.margin and self.why),
            "delta= is a positive bound, declared with why=":
                self.delta is not None and not (self.delta > 0 and self.why),
            "speed= (measure, tolerance) and '{at_speed}' in its text go together":
                ("{at_speed}" in self.claim) != (self.speed is not None)})


@dataclass(frozen=True)
class Probe:
    """A registered experiment (probes/base.py), given as a spec, run on the test bed's reference checkpoint
    (without one: the baseline arm's first run) or on ``arm``'s run at ``at``. ``fmnist_only``: it reads
    Fashion-MNIST's raw images, so a test bed on other data skips it."""

    name: str
    experiment: str
    title: str = ""
    fmnist_only: bool = False
    arm: str | None = None
    at: dict[str, Any] = field(default_factory=dict)


#: What a timing's ``settings`` may set: the ``eval`` and ``bench`` commands' timing flags, backend, dtype and seed
SETTINGS = (*SPEED, "backend", "compile_mode", "dtype", "seed")
#: a bench's setting: each spec beside its matched random pruner (``bench --match-random``)
MATCH_RANDOM = "match_random"
#: What a bench's ``model`` names: the timm model, its kwargs, a trained recipe's weights, a stem (``--stem``)
BENCH_MODEL = ("name", "kwargs", "checkpoint", "stem")


@dataclass(frozen=True)
class Timing:
    """An interleaved timing of ``specs`` against the unpatched model. On the study's runs (the ``eval``
    command's): ``model`` an arm, whose run at ``at`` it times, or None, the test bed's reference (without one,
    the baseline arm's run), beside every run of the ``finetuned`` arms at ``at`` (without a seed: every seed),
    each with its own final evaluation. On a model off the grid (a bench, the ``bench`` command's,
    bench/compare.py): ``model`` a dict (:data:`BENCH_MODEL`; random weights but for a ``checkpoint``).
    ``settings``: :data:`SETTINGS`, a bench's also :data:`MATCH_RANDOM`; ``columns``: a bench's, empty for the
    command's own; ``title``: default the name."""

    name: str
    model: str | dict[str, Any] | None = None
    specs: tuple[str, ...] = ()
    at: dict[str, Any] = field(default_factory=dict)
    finetuned: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    columns: tuple[Col, ...] = ()
    title: str = ""

    @property
    def bench(self) -> bool:
        """Whether it times a model off the grid (the ``bench`` command's), not the study's runs."""
        return isinstance(self.model, dict)

    def __post_init__(self) -> None:
        model = self.model if self.bench else {}
        _refuse(f"timing {self.name!r}", {
            "a bench (a model off the grid) reads no runs: no at= or finetuned=":
                self.bench and bool(self.at or self.finetuned),
            "a bench's model names its timm 'name'": self.bench and "name" not in model,
            **_unknown("model names unknown keys", model, BENCH_MODEL),
            **_unknown("settings name unknown keys", self.settings,
                       (*SETTINGS, MATCH_RANDOM) if self.bench else SETTINGS)})


#: What a bed's ``smoke`` may set (the one smoke syntax, an experiment's too: what differs, the rest the bed's):
#: ``testbed``, ``recipe`` overrides, a smaller ``grid`` (axis -> values), the ``measure``\ s' speed settings,
#: parameters added to every ``probe``'s spec, every ``bench``'s timing settings and ``model_kwargs`` (merged
#: into its model's: a narrow copy of the same depth and patch grid; a smoke never loads a checkpoint)
SMOKE_KEYS = ("testbed", "recipe", "grid", "measure", "probe", "bench")


@dataclass(frozen=True)
class Bed:
    """What a study declares for one test bed: the :class:`Testbed` its runs start from and are scored on, and the
    rest of its plan. ``arms`` name per-block counts, which depend on the patch grid; ``split``: the axis the arm
    tables are split by, and their heading; ``columns``: the arm tables' (on a bed that trains nothing: title ->
    a table of its benches side by side); ``evaluations``: off the grid, read by type (:attr:`measures`,
    :attr:`probes`, :attr:`benches`); ``budget``: the compute plan, declared before the runs, as (runs, kind of
    run, measured minutes a run) per kind; ``pending``: why runs are missing; ``title``: its page's heading."""

    testbed: Testbed = Testbed()
    title: str = ""
    recipe: dict[str, Any] = field(default_factory=dict)
    arms: dict[str, Arm] = field(default_factory=dict)
    baseline: str = ""
    grid: tuple[Axis, ...] = ()
    split: tuple[str, str] | None = None
    columns: tuple[Col, ...] | dict[str, tuple[Col, ...]] = ()
    evaluations: tuple[Timing | Probe, ...] = ()
    smoke: dict[str, Any] | None = None  #: :data:`SMOKE_KEYS`
    budget: tuple[tuple[int, str, float], ...] = ()
    pending: str = ""

    @property
    def bench_tables(self) -> dict[str, tuple[Col, ...]]:
        """Its tables of benches side by side (``columns`` on a bed that trains nothing): title -> columns."""
        return self.columns if isinstance(self.columns, dict) else {}

    @property
    def measures(self) -> tuple[Timing, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Timing) and not x.bench)

    @property
    def probes(self) -> tuple[Probe, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Probe))

    @property
    def benches(self) -> tuple[Timing, ...]:
        return tuple(x for x in self.evaluations if isinstance(x, Timing) and x.bench)


def tests_claim(bed: Bed, e: Expect) -> bool:
    """Whether ``bed`` tests the claim ``e``: it has both its arms, and they run where ``e`` reads them."""
    axes = {a.name: a.values for a in bed.grid}
    return (e.arm in bed.arms and e.baseline in bed.arms and all(k in axes and v in axes[k] for k, v in e.at.items())
            and all(allows(bed.arms[a].only, e.at) for a in (e.arm, e.baseline)))


class Study(Planned):
    """Base class of every study (module docstring). An instance is the study on one bed: its attributes are
    that bed's declarations, its ``expect`` the claims the bed tests."""

    name: ClassVar[str] = ""
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
        for k in [*(f.name for f in dataclasses.fields(Bed) if f.name != "testbed"), "measures", "probes", "benches",
                  "bench_tables"]:
            setattr(self, k, getattr(decl, k))  # the bed's declarations, its evaluations by type
        self.columns = () if self.bench_tables else decl.columns  # the arm tables' (a bench table is by title)
        self.expect = tuple(e for e in cls.expect if tests_claim(decl, e))
        self.is_smoke = smoke
        if smoke and self.smoke is None:
            raise TokenReduceError(f"study {cls.name} declares no smoke version on the test bed {self.bed_name}")
        default = self.smoke.get("testbed", decl.testbed) if smoke else decl.testbed
        self.bed = testbed or default
        self.default_bed = self.bed == default
        if not (self.arms or self.default_bed):
            raise TokenReduceError(f"study {cls.name} trains nothing (benches only, each on its own model); "
                                   "it takes no test bed (--model, --pretrained, --weights, --data)")
        self.is_default_bed = self.bed_name == next(iter(cls.beds))  # its commands need no --testbed
        self.key = f"{cls.name}/{self.bed_name}"  # where its results live under results/, its run ids' prefix
        self.heading = self.title or cls.name  # its page's section and figures


def check_study(cls: type[Study]) -> None:
    """Refuse a study whose declarations do not fit together (a typo here would surface hours later): each
    bed's, read as the study on that bed, then a claim that no bed tests."""
    _refuse(f"study {cls.name}", {"it declares no test bed (beds = {name: Bed(...)})": not cls.beds})
    studies = [cls(name) for name in cls.beds]
    for study in studies:
        _check_bed(f"study {cls.name} (test bed {study.bed_name})", study)
    untested = [e.claim for e in cls.expect if not any(e in s.expect for s in studies)]
    _refuse(f"study {cls.name}", {f"no test bed has the arms (at the grid point) of the claims {untested}; its "
                                  f"beds' arms: { {b: sorted(d.arms) for b, d in cls.beds.items()} }": bool(untested)})


def _check_bed(where: str, study: Study) -> None:
    """The declarations of ``study``'s bed (``where`` names both, for the message)."""
    names = [x.name for x in study.evaluations]
    smoke, axes, arms = study.smoke or {}, {a.name: a.values for a in study.grid}, study.arms
    _refuse(where, {
        f"its measures, probes and benches need distinct names; they are {names}": len(set(names)) != len(names),
        **_unknown("smoke sets unknown keys", smoke, SMOKE_KEYS),
        **_unknown("smoke grid names axes it lacks", smoke.get("grid", {}), axes),
        **_unknown("smoke bench names unknown settings", smoke.get("bench", {}), {*SETTINGS, "model_kwargs"}),
        **_unknown("recipe names unknown training settings", study.recipe, field_names()),
        **_unknown("smoke recipe names unknown training settings", smoke.get("recipe", {}), field_names()),
        "its columns are its arm tables' (a tuple of Col); a table of benches side by side (title -> columns) goes "
        "on a bed that trains nothing": bool(arms and study.bench_tables)})
    for title, columns in study.bench_tables.items():
        unknown = sorted({c.metric for c in columns[1:]} - {b.name for b in study.benches})
        _refuse(where, {f"bench table {title!r} needs its label column, then columns of the benches it declares "
                        f"(unknown: {unknown})": bool(unknown) or len(columns) < 2})
    if not arms:  # it tests no claim: a claim needs two arms
        extra = [k for k in ("recipe", "baseline", "grid", "split", "measures", "probes", "columns")
                 if getattr(study, k)]
        _refuse(where, {"it has no arms: it trains nothing, so it declares benches only and no recipe, baseline, "
                        "grid, split, measures, probes or columns but its bench tables "
                        f"(it has {', '.join(extra) or 'no benches'})": bool(extra) or not study.benches})
        return
    _refuse(where, {"its grid needs a 'seed' axis (contrasts are paired by seed)": "seed" not in axes})
    trained = sorted(n for n, a in arms.items() if a.kind in (TRAINED, AFTER))
    for name, arm in arms.items():
        outside = {k: v for o in alternatives(arm.only) for k, v in o.items()
                   if k not in axes or k == "seed" or set(v) - set(axes[k])}
        _refuse(where, {
            f"arm {name} is of kind {arm.kind!r}; choose from {', '.join(ARM_KINDS)}": arm.kind not in ARM_KINDS,
            f"arm {name} is {arm.kind} (it trains nothing); it takes a label, its spec (the "
            f"{'experiment' if arm.kind == EVALUATED else 'reducer'} it applies), reads= and only=":
                arm.kind in (EVALUATED, OFF_THE_SHELF) and (not arm.spec or any(arm.options.values())),
            f"arm {name}: reads= (the arm whose checkpoint it reads) goes with the kinds {AFTER!r} and {EVALUATED!r} "
            f"alone (its kind: {arm.kind!r})": (arm.reads is not None) != (arm.kind in (AFTER, EVALUATED)),
            f"arm {name} reads {arm.reads!r}, which is not another of its trained arms {trained}":
                arm.reads is not None and (arm.reads == name or arm.reads not in trained),
            f"arm {name} runs only at {outside}, which is not a set of values of its grid's axes other than the seed "
            f"({ {k: v for k, v in axes.items() if k != 'seed'} })": bool(outside)})
    reads = [("its baseline", study.baseline, [{}])]
    reads += [(f"measure {m.name}", a, [m.at]) for m in study.measures for a in (m.model, *m.finetuned) if a]
    reads += [(f"probe {p.name}", p.arm, [p.at]) for p in study.probes if p.arm]
    reads += [(f"arm {n}", a.reads, [p.values for p in study.points() if p.arm == n])
              for n, a in arms.items() if a.reads]
    for what, arm, ats in reads:  # every arm read runs wherever it is read
        _refuse(where, {f"{what} names unknown arm {arm!r}; choose from {sorted(arms)}": arm not in arms})
        missing = next((at for at in ats if not allows(arms[arm].only, at)), None)
        _refuse(where, {f"{what} reads arm {arm} at {missing}, where it has no runs (only {arms[arm].only})":
                        missing is not None})
    for m in study.measures:  # the evaluation groups checkpoints by model and spec: two such arms make one row
        same = {}
        for name in m.finetuned:
            other = same.setdefault((arms[name].spec, arms[name].stem, arms[name].transforms), name)
            _refuse(where, {f"measure {m.name} reads arms {other} and {name}, which carry the same model and spec: "
                            "their checkpoints would make one row; measure one of them": other != name})
    for e in study.expect:
        _refuse(where, {f"the claim {e.claim!r} declares a power plan, whose pilot is the same contrast where the grid "
                        "was first run (an axis' implicit value); it is there itself":
                        e.power is not None and study.pilot(e) == e.at})


# the built-in studies register themselves on import
_STUDIES: Registry[type[Study]] = Registry("study", load=lambda: importlib.import_module("tokenreduce.studies"))


def register_study(name: str, into: Registry[type[Study]] | None = None) -> Callable[[type[Study]], type[Study]]:
    """Class decorator: register a Study subclass as ``name`` (its runs' ids start ``name/``) into the built-in
    studies' registry, or ``into`` another (the tests' own studies: :func:`reading`)."""
    def wrap(cls: type[Study]) -> type[Study]:
        cls.name = name
        check_study(cls)
        (into or _STUDIES).add(name, cls, NoParams)  # it takes no parameters: its test bed and flags say where it runs
        return cls

    return wrap


def reading(registry: Registry[type[Study]]) -> AbstractContextManager[None]:
    """While inside, :func:`get_study` (the ``study`` command, the report) finds the studies of ``registry``
    as well as the built-in ones (the tests' own studies); :func:`list_studies` lists the built-in ones only."""
    return _STUDIES.reading(registry)


def list_studies() -> list[str]:
    return _STUDIES.names()


def get_study(name: str) -> type[Study]:
    return _STUDIES.get(name)

"""The declaration types: what a study author writes (one module under studies/ per paper).

A study declares its claims once (``expect``: :class:`Expect`) and its test beds (``beds``: name -> :class:`Bed`,
the first the default, ``tokenreduce study NAME --testbed BED`` another). A bed declares what depends on the
test bed: the :class:`Testbed` its runs start from and are scored on, the recipe, the arms (:class:`Arm`), the
grid (:class:`Axis`), the tables' columns (:class:`Col`), its evaluations off the grid (:class:`Timing`,
:class:`Probe`), a smoke version (run by the test suite) and its compute budget. A bed tests each
claim whose two arms it has (:func:`tests_claim`); a user's own test bed (``--model``, ``--data``) runs a declared
bed's plan on it. Every arm x grid point is one run with a stable id (``eet/scenes/d_eet-b16-s0``), planned by
study/grid.py and study/plan.py and run by study/runner.py. :func:`register_study` refuses declarations that do not
fit together.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.errors import SpecError, TokenReduceError
from ..core.registry import NoParams, Registry
from .grid import (
    AFTER,
    ARM_KINDS,
    EVALUATED,
    OFF_THE_SHELF,
    TRAINED,
    Planned,
    allows,
    alternatives,
    config_fields,
)
from .grid import TESTBED_TEACHER as TESTBED_TEACHER  # re-exported: a recipe's value a study writes
from .testbed import Testbed

# ----------------------------------------------------------------------------- declarations

@dataclass(frozen=True)
class Arm:
    """One arm: what differs from the recipe, and what it is, by its ``kind``. ``label``: the name tables print.

    ``trained``: ``spec`` is the reducer it trains with (None: none; it may name grid values in braces,
    ``random(seed={seed})``); ``options``: what else differs from the recipe (:data:`ARM_OPTIONS`): ``task`` a
    task spec, ``stem`` and ``transforms`` model options (models/build.py; on a reference checkpoint a stem is
    swapped in with fresh weights).
    ``after``: the same, started from the checkpoint of the trained arm ``reads`` at the same grid point (a
    second phase). ``evaluated``: trains nothing; ``spec`` is a registered experiment (probes/base.py) run on
    the checkpoint of the arm ``reads`` at the same grid point, whose result's ``metrics`` are the arm's (the
    spec may name the point's training settings in braces, ``subset={eval_subset}``). ``off_the_shelf``: ``spec``
    applied untrained to the test bed's reference, scored per item; its run at the n-th seed is scored on the
    n-th of as many disjoint folds of the test items, so its claims take the item as their unit
    (:meth:`Study.per_item`).

    ``only``: axis name -> the values the arm runs at (an axis not named: all; a smoke grid without a named
    value: its first); a tuple of such dicts: where any of them allows."""

    label: str
    spec: str | None = None
    kind: str = TRAINED
    reads: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    only: dict[str, tuple[Any, ...]] | tuple[dict[str, tuple[Any, ...]], ...] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if _unknown(self.options, ARM_OPTIONS):
            raise SpecError(f"arm {self.label!r}: its options name unknown keys {_unknown(self.options, ARM_OPTIONS)}; "
                            f"choose from {list(ARM_OPTIONS)}")

    @property
    def task(self) -> str | None:
        return self.options.get("task")

    @property
    def stem(self) -> str | None:
        return self.options.get("stem")

    @property
    def transforms(self) -> tuple[str, ...]:
        return tuple(self.options.get("transforms", ()))


#: What an arm's ``options`` may change from the recipe: its task spec, and its model's stem and transforms
ARM_OPTIONS = ("task", "stem", "transforms")


#: what an off-the-shelf arm's record says it evaluates: the test bed's reference
REFERENCE = "@reference"


@dataclass(frozen=True)
class Axis:
    """A grid axis: a TrainConfig field (``seed``) or a parameter of the task spec (``bits``); ``short``
    prefixes its value in run ids (``s0``). With ``sets`` the axis is a named setting: value -> the TrainConfig
    fields it sets (the fine-tune length); the one value it sets nothing for is the recipe as it was, the runs
    made before the axis existed, and their ids leave it out (:attr:`implicit`)."""

    name: str
    values: tuple[Any, ...]
    short: str
    sets: dict[Any, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sets and len([v for v in self.values if v not in self.sets]) > 1:
            raise SpecError(f"axis {self.name}: its sets= names every value but one (the one run ids leave out); "
                            f"it leaves out {[v for v in self.values if v not in self.sets]}")

    @property
    def implicit(self) -> Any:
        """The value run ids leave out: with ``sets``, the one it sets nothing for; else none."""
        return next((v for v in self.values if v not in self.sets), None) if self.sets else None


@dataclass(frozen=True)
class Col:
    """A table column (every table's one column syntax). In an arm table ``metric`` is a run metric (mean ± std
    over seeds; ``paired``: the difference from the baseline, paired by seed); in a measure's, the row's value
    (:meth:`text`); in a bench's, the ``bench`` command's row key; in a bench table
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
#: What a claim's ``source`` says when the contrast is this project's own (its reading of a detail the paper leaves
#: open, a floor the paper has none of), not a claim of the paper, of its review or of the issue that asked for
#: the study: such a claim is exploratory (:attr:`Expect.confirmatory`)
OWN = "this project's"


@dataclass(frozen=True)
class Expect:
    """A claim: one paired contrast and how it is judged (study/stats.py).

    ``arm - baseline`` on ``metric`` at the grid point ``at`` (every axis but the seed may be fixed), paired by
    seed (by test item for arms evaluated off the shelf), lies beyond ``margin`` in ``direction`` (+1/-1) by
    the paired t-test at :attr:`level` two-sided. ``kind``: "superior"; "noninferior" (the margin is the loss
    allowed, on the losing side); "equivalent" (|Δ| < |margin|, by TOST); these two say ``why`` that
    margin. ``delta`` (with ``why``): the smallest difference that matters. ``reported``: the
    difference the source reports and its figures as the source writes them (:attr:`effect`, :attr:`published`).
    ``family``: claims of one bed sharing this text are also tested as one
    (the per-seed mean of their differences). ``speed``: (measure, margin): "at equal measured speed" only when
    both arms' timings on that measure are shown equivalent within the margin (the text's ``{at_speed}``).
    ``power``: the smallest difference toward the claim its test must detect with :data:`POWER`; the report
    gives the seeds needed at the pilot sd of the same contrast where the grid was first run (:meth:`Study.pilot`).
    ``source``: whose claim it is; one that names the contrast as :data:`OWN` makes it exploratory.
    """

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
        """A claim of the paper, of its review or of the issue that asked for the study (its ``source`` says
        whose): tested in the multiplicity families and given a verdict; else exploratory: raw p and interval."""
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
        refusals = {
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
                ("{at_speed}" in self.claim) != (self.speed is not None),
        }
        for refusal, refused in refusals.items():
            if refused:
                raise SpecError(f"claim {self.claim!r}: {refusal}")


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


#: What a timing's ``settings`` may set: the command's timing flags, backend, dtype and seed (``eval``'s and
#: ``bench``'s), and a bench's :data:`MATCH_RANDOM`
SETTINGS = ("batch", "warmup", "repeats", "min_run_s", "backend", "compile_mode", "dtype", "seed")
#: a bench's setting: each spec beside its matched random pruner (``bench --match-random``)
MATCH_RANDOM = "match_random"
#: What a bench's ``model`` names: the timm model, its kwargs, a trained recipe's weights, a stem (``--stem``)
BENCH_MODEL = ("name", "kwargs", "checkpoint", "stem")


@dataclass(frozen=True)
class Timing:
    """An interleaved timing of ``specs`` against the unpatched model, on its ``model``: an arm's run at ``at``
    (the arm's name) or the test bed's reference (None; without one, the baseline arm's run), the ``eval``
    command's, beside every run of the ``finetuned`` arms at ``at`` (leave the seed out to read every seed),
    each with its own final evaluation; or a model off the grid (a dict: a bench, the ``bench`` command's,
    bench/compare.py): the timm ``name`` with ``kwargs`` (random weights), ``checkpoint`` the weights of a
    trained recipe, ``stem`` a stem swapped in. ``settings``: the command's (:data:`SETTINGS`, a bench's also
    :data:`MATCH_RANDOM`); ``columns``: a bench's empty for the command's own; ``title``: default the name."""

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
        valid = (*SETTINGS, MATCH_RANDOM) if self.bench else SETTINGS
        refusals = {
            "a bench (a model off the grid) reads no runs: no at= or finetuned=": self.bench and bool(
                self.at or self.finetuned),
            f"a bench's model names its timm 'name' and only {', '.join(BENCH_MODEL)}":
                self.bench and ("name" not in self.model or bool(_unknown(self.model, BENCH_MODEL))),
            f"its settings name unknown keys {_unknown(self.settings, valid)}; choose from {list(valid)}":
                bool(_unknown(self.settings, valid)),
        }
        for refusal, refused in refusals.items():
            if refused:
                raise SpecError(f"timing {self.name!r}: {refusal}")


#: What a bed's ``smoke`` may set (the one smoke syntax, an experiment's too: what differs, the rest the bed's):
#: ``testbed``, ``recipe`` overrides, a smaller ``grid`` (axis -> values), the ``measure``\ s' speed settings,
#: parameters added to every ``probe``'s spec, every ``bench``'s timing settings and ``model_kwargs`` (merged
#: into its model's: a narrow copy of the same depth and patch grid; a smoke never loads a checkpoint)
SMOKE_KEYS = ("testbed", "recipe", "grid", "measure", "probe", "bench")


@dataclass(frozen=True)
class Bed:
    """What a study declares for one test bed. ``arms`` name per-block counts, which depend on the patch grid;
    ``split``: the axis the arm tables are split by, and their heading; ``columns``: the arm tables' (on a bed
    that trains nothing: title -> the columns of a table of its benches side by side, one backend each, say);
    ``evaluations``: read by type as
    ``measures``, ``probes``, ``benches``; ``budget``: the compute plan, declared before the runs, as (runs, kind
    of run, measured minutes a run) per kind; ``pending``: why runs are missing; ``title``: its page's
    heading (none: the study's name).
    A bed with benches only trains nothing: no arms, recipe, baseline, grid, columns, measures or probes."""

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


# ----------------------------------------------------------------------------- the study


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


def check_study(cls: type[Study]) -> None:
    """Refuse a study whose declarations do not fit together (a typo here would surface hours later):
    each bed's, and a claim that no bed tests."""
    if not cls.beds:
        raise SpecError(f"study {cls.name} declares no test bed (beds = {{name: Bed(...)}})")
    for name, bed in cls.beds.items():
        _check_bed(f"study {cls.name} (test bed {name})", bed, [e for e in cls.expect if tests_claim(bed, e)])
    untested = [e.claim for e in cls.expect if not any(tests_claim(d, e) for d in cls.beds.values())]
    if untested:
        arms = {b: sorted(d.arms) for b, d in cls.beds.items()}
        raise SpecError(f"study {cls.name}: no test bed has the arms (at the grid point) of the claims {untested}; "
                        f"its beds' arms: {arms}")


def _unknown(names: Any, valid: Any) -> list[str]:
    return sorted(set(names) - set(valid))


def _check_bed(where: str, bed: Bed, claims: list[Expect]) -> None:
    """One bed's declarations (``where``: the study and bed, for the message; ``claims``: those it tests)."""
    names = [x.name for x in bed.evaluations]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: its measures, probes and benches need distinct names; they are {names}")
    smoke = bed.smoke or {}
    axes = {a.name: a.values for a in bed.grid}
    named = [("smoke sets unknown keys", smoke, SMOKE_KEYS),
             ("smoke grid names axes it lacks", smoke.get("grid", {}), axes),
             ("smoke bench names unknown settings", smoke.get("bench", {}), {*SETTINGS, "model_kwargs"}),
             ("recipe names unknown training settings", bed.recipe, config_fields()),
             ("smoke recipe names unknown training settings", smoke.get("recipe", {}), config_fields()),
             *((f"axis {a.name} at {v} names unknown training settings", f, config_fields())
               for a in bed.grid for v, f in a.sets.items())]
    for what, given, valid in named:
        if _unknown(given, valid):
            raise SpecError(f"{where}: its {what} {_unknown(given, valid)}; choose from {sorted(valid)}")
    if bed.arms and bed.bench_tables:
        raise SpecError(f"{where}: its columns are its arm tables' (a tuple of Col); a table of benches side by side "
                        "(title -> columns) goes on a bed that trains nothing")
    for title, columns in bed.bench_tables.items():
        unknown = _unknown((c.metric for c in columns[1:]), (b.name for b in bed.benches))
        if unknown or len(columns) < 2:
            raise SpecError(f"{where}: bench table {title!r} needs its label column, then columns of the benches it "
                            f"declares (unknown: {unknown})")
    if not bed.arms:  # it tests no claim: a claim needs two arms
        extra = [k for k in ("recipe", "baseline", "grid", "split", "measures", "probes") if getattr(bed, k)]
        extra += ["columns"] if bed.columns and not bed.bench_tables else []
        if extra or not bed.benches:
            raise SpecError(f"{where} has no arms: it trains nothing, so it declares benches only and no recipe, "
                            "baseline, grid, split, measures, probes or columns but its bench tables "
                            f"(it has {', '.join(extra) or 'no benches'})")
        return
    if "seed" not in axes:
        raise SpecError(f"{where}: its grid needs a 'seed' axis (contrasts are paired by seed)")
    _check_arms(where, bed.arms, axes)
    first = {a.name: a.implicit for a in bed.grid if a.implicit is not None}
    for e in claims:
        if e.power is not None and {**e.at, **first} == e.at:
            raise SpecError(f"{where}: the claim {e.claim!r} declares a power plan, whose pilot is the same contrast "
                            "where the grid was first run (an axis' implicit value); it is there itself")
    reads = [("its baseline", bed.baseline, {})]
    reads += [(f"measure {m.name}", arm, m.at) for m in bed.measures for arm in (m.model, *m.finetuned) if arm]
    reads += [(f"probe {p.name}", p.arm, p.at) for p in bed.probes if p.arm]
    for what, arm, at in reads:
        if arm not in bed.arms:
            raise SpecError(f"{where}: {what} names unknown arm {arm!r}; choose from {sorted(bed.arms)}")
        if not allows(bed.arms[arm].only, at):
            raise SpecError(f"{where}: {what} reads arm {arm} at {at}, where it has no runs "
                            f"(only {bed.arms[arm].only})")
    for m in bed.measures:
        same: dict[tuple, str] = {}
        for arm in m.finetuned:
            a = bed.arms[arm]
            other = same.setdefault((a.spec, a.stem, a.transforms), arm)
            if other != arm:  # the evaluation groups checkpoints by model and spec
                raise SpecError(f"{where}: measure {m.name} reads arms {other} and {arm}, which carry the same model "
                                "and spec: their checkpoints would make one row; measure one of them")


def _check_arms(where: str, arms: dict[str, Arm], axes: dict[str, tuple[Any, ...]]) -> None:
    """What each arm is (its kind and what it reads) and where it runs (``only``, within the grid ``axes``)."""
    trained = sorted(n for n, a in arms.items() if a.kind in (TRAINED, AFTER))
    grid = [dict(zip(axes, v, strict=True)) for v in itertools.product(*axes.values())]
    for name, arm in arms.items():
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
    for name, arm in arms.items():  # where it runs, once every arm's reads= is known to be sound
        bad = {k: v for o in alternatives(arm.only) for k, v in o.items()
               if k not in axes or k == "seed" or set(v) - set(axes[k])}
        if bad:
            raise SpecError(f"{where}: arm {name} runs only at {bad}, which is not a set of values of its grid's "
                            f"axes other than the seed ({ {k: v for k, v in axes.items() if k != 'seed'} })")
        source = arm.reads
        if source and any(allows(arm.only, p) and not allows(arms[source].only, p) for p in grid):
            raise SpecError(f"{where}: arm {name} reads arm {source}'s runs where {source} has none (its only= "
                            f"{arm.only} reaches beyond {source}'s {arms[source].only})")


# ----------------------------------------------------------------------------- registry


# the built-in studies register themselves on import
_STUDIES: Registry[type[Study]] = Registry("study", load=lambda: importlib.import_module("tokenreduce.studies"))
#: registries given for a while (:func:`reading`): :func:`get_study` finds their studies too, never listed
_GIVEN: list[Registry[type[Study]]] = []


def register_study(name: str, into: Registry[type[Study]] | None = None) -> Callable[[type[Study]], type[Study]]:
    """Class decorator: register a Study subclass as ``name`` (its runs' ids start ``name/``) into the built-in
    studies' registry, or ``into`` another (the tests' own studies: :func:`reading`)."""
    def wrap(cls: type[Study]) -> type[Study]:
        cls.name = name
        check_study(cls)
        (into or _STUDIES).add(name, cls, NoParams)  # it takes no parameters: its test bed and flags say where it runs
        return cls

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

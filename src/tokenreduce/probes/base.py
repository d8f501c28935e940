"""The experiment contract and registry: one module per published claim or reviewer's falsifier.

An experiment states a claim in words (``claim``) and where it comes from (``source``), takes its
parameters as a spec string like a method (``'recall_at_kept(spec="...")'``, parsed by
core/registry.py, never eval), runs it (``run``) and prints what it found (``report``). Every
experiment has a smoke mode (``smoke``: parameter overrides that run end to end in seconds on a
tiny model), which the test suite runs for each registered one; ``tokenreduce experiment NAME
--smoke`` runs the same from the command line.

Experiments sit beside bench/ and train/ (they may use both) and take the specs they test as
parameters: no method name is spelled here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..core.errors import SpecError
from ..core.registry import NoParams, Registry, config_spec, format_spec, parse_spec


@dataclass
class RunContext:
    """What an experiment may use while it runs: torch ``threads``, the ``device``, the precision of its
    models' forwards (``amp``: "bf16" or "fp16" autocast, None or "off" float32; an experiment runs its
    forwards under :meth:`autocast`), a folder for the files it writes (``out_dir``: figures, intermediate
    checkpoints), whether it runs in smoke mode and a ``log`` for progress lines (stderr by default)."""

    threads: int = 2
    device: str = "cpu"
    amp: str | None = None
    out_dir: Path = field(default_factory=lambda: Path("runs/experiments"))
    smoke: bool = False
    log: Callable[[str], None] = print

    def autocast(self) -> AbstractContextManager:
        """The forwards' autocast on this context's device (nothing for float32)."""
        from ..models.precision import autocast

        return autocast(self.device, self.amp)


class Experiment:
    """Base class of every experiment. Subclasses set ``Config``, ``claim``, ``source`` and
    ``smoke`` and implement ``run`` and ``report``."""

    name: ClassVar[str] = ""
    #: the claim (or the reviewer's objection) the experiment tests, in one or two sentences
    claim: ClassVar[str] = ""
    #: where the claim comes from: paper (arXiv id, table), review, official code
    source: ClassVar[str] = ""
    Config: ClassVar[type] = NoParams
    #: Config overrides that make the experiment run end to end in seconds (tests, CI)
    smoke: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = self.Config() if cfg is None else cfg

    def spec(self) -> str:
        return config_spec(self.name, self.cfg)

    def run(self, ctx: RunContext) -> dict[str, Any]:
        """Run the experiment; return JSON-able results (the command adds provenance)."""
        raise NotImplementedError

    def report(self, result: dict[str, Any]) -> str:
        """What ``run`` found, as text (plain or markdown tables) for the terminal and READMEs."""
        raise NotImplementedError


def _builtins() -> None:
    importlib.import_module(__package__)  # registers the built-in experiments


_EXPERIMENTS: Registry[type[Experiment]] = Registry("experiment", load=_builtins)


def register_experiment(name: str, into: Registry[type[Experiment]] | None = None,
                        ) -> Callable[[type[Experiment]], type[Experiment]]:
    """Class decorator: make an Experiment subclass addressable as ``name(...)``, in the built-in registry or
    ``into`` another (the tests' own experiments: :func:`reading`)."""
    return (into or _EXPERIMENTS).register_class(name)


def reading(registry: Registry[type[Experiment]]) -> AbstractContextManager[None]:
    """While inside, the experiments of ``registry`` are found by name as well as the built-in ones;
    :func:`list_experiments` lists the built-in ones only."""
    return _EXPERIMENTS.reading(registry)


def list_experiments() -> list[str]:
    """Names of the built-in experiments."""
    return _EXPERIMENTS.names()


def get_experiment(name: str) -> type[Experiment]:
    return _EXPERIMENTS.get(name)


def record_report(doc: dict[str, Any]) -> str:
    """A probe record's result as its experiment reports it, the checkpoint it read named by the last two parts
    of its path (the rest says where it was on the machine that ran it)."""
    result = dict(doc["result"])
    if result.get("checkpoint"):
        p = Path(result["checkpoint"])
        result["checkpoint"] = f"{p.parent.name}/{p.name}"
    return build_experiment(doc["experiment"]).report(result)


def build_experiment(spec: str, *, smoke: bool = False) -> Experiment:
    """An Experiment from ``spec``; with ``smoke=True`` its ``smoke`` overrides are applied first
    and the parameters given in ``spec`` win over them."""
    name, params = parse_spec(spec)
    cls = get_experiment(name)
    if smoke:
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        bad = sorted(set(cls.smoke) - fields)
        if bad:
            raise SpecError(f"experiment {name}: its smoke overrides name unknown parameters {bad}")
        spec = format_spec(name, {**cls.smoke, **params})
    _, cls, cfg = _EXPERIMENTS.resolve(spec)
    return cls(cfg)


@dataclass(frozen=True)
class ProbeRequest:
    """``tokenreduce experiment SPEC [--smoke]`` as its arguments give it, and a study's probe or evaluated arm as
    the runner makes it (the checkpoint it reads among the spec's parameters)."""

    spec: str
    smoke: bool = False

    def experiment(self) -> Experiment:
        return build_experiment(self.spec, smoke=self.smoke)

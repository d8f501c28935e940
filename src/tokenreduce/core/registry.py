"""Spec strings and the one registry behind everything addressed by them: methods, tasks, stems
and model transforms.

A spec is ``name(key=value, ...)`` or a bare ``name`` (all defaults). :func:`parse_spec` reads it
with the ast module's literal parsing (never eval); :func:`format_spec` writes it back. A
:class:`Registry` maps names to entries (a class or a function) and their frozen dataclass
``Config``; :meth:`Registry.resolve` turns a spec into (name, entry, Config instance), with errors
that name the problem and the valid choices.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import SpecError, TokenReduceError

T = TypeVar("T")


@dataclass(frozen=True)
class NoParams:
    """The Config of an entry that takes no parameters."""


def _literal(node: ast.expr, spec: str) -> Any:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        raise SpecError(
            f"in spec {spec!r}: {ast.unparse(node)!r} is not a literal (numbers, strings, "
            "booleans, None, tuples or lists)"
        ) from None
    return tuple(value) if isinstance(value, list) else value


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Parse ``'evit(keep=0.7, locs=(3, 6, 9))'`` into ``('evit', {'keep': 0.7, 'locs': (3, 6, 9)})``.

    Uses the ast module's literal parsing, never eval. A bare name (``'tome'``) means defaults.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"a spec must be a non-empty string like 'tome(r=13)', got {spec!r}")
    try:
        node = ast.parse(spec.strip(), mode="eval").body
    except SyntaxError as e:
        raise SpecError(f"malformed spec {spec!r}: {e.msg}; expected e.g. 'evit(keep=0.7, locs=(3, 6, 9))'") from None
    if isinstance(node, ast.Name):
        return node.id, {}
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        raise SpecError(f"malformed spec {spec!r}: expected name(key=value, ...), e.g. 'tome(r=13)'")
    if node.args or any(kw.arg is None for kw in node.keywords):
        raise SpecError(f"malformed spec {spec!r}: parameters must be named, e.g. 'tome(r=13)'")
    return node.func.id, {kw.arg: _literal(kw.value, spec) for kw in node.keywords}


def format_spec(name: str, params: Mapping[str, Any] | None = None) -> str:
    """The spec string ``name(key=value, ...)`` of a registered entry and its parameters.

    The one place a spec is written from parts; the inverse of :func:`parse_spec` for literal values
    (``parse_spec(format_spec(n, p)) == (n, p)``, lists read back as tuples). Values are written
    with ``repr``; no parameters give the bare name (the defaults).
    """
    if not name.isidentifier():
        raise SpecError(f"a spec name must be an identifier (a registered name), got {name!r}")
    if not params:
        return name
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


def config_spec(name: str, cfg: Any) -> str:
    """The canonical spec of ``name`` with Config instance ``cfg``: every field spelled out."""
    return format_spec(name, {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


class Registry(Generic[T]):
    """Named entries of one kind (``'method'``, ``'task'``, ``'stem'``, ``'transform'``), each with
    a frozen dataclass Config. ``load`` (optional) is called before every lookup, to import the
    built-in entries of a package lazily."""

    def __init__(self, kind: str, load: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._load = load
        self._entries: dict[str, tuple[T, type]] = {}

    def add(self, name: str, entry: T, config: type) -> None:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"{self.kind} {name!r}: its Config must be a dataclass, got {config!r}")
        if name in self._entries and self._entries[name][0] is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered by {self._entries[name][0]!r}")
        self._entries[name] = (entry, config)

    def register(self, name: str, config: type = NoParams) -> Callable[[T], T]:
        """Decorator: register the decorated entry under ``name`` with Config ``config``."""

        def deco(entry: T) -> T:
            self.add(name, entry, config)
            return entry

        return deco

    def register_class(self, name: str) -> Callable[[type], type]:
        """Class decorator for classes that carry their ``Config``: registers the class under
        ``name`` and sets its ``name`` attribute."""

        def deco(cls: type) -> type:
            self.add(name, cls, cls.Config)
            cls.name = name
            return cls

        return deco

    def names(self) -> list[str]:
        if self._load is not None:
            self._load()
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry registered under ``name``; SpecError naming the valid ones otherwise."""
        names = self.names()
        if name not in self._entries:
            raise SpecError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(names)}")
        return self._entries[name][0]

    def resolve(self, spec: str) -> tuple[str, T, Any]:
        """(name, entry, Config instance) of ``spec``, the parameters checked against the Config."""
        name, params = parse_spec(spec)
        entry = self.get(name)
        config = self._entries[name][1]
        fields = [f.name for f in dataclasses.fields(config)]
        valid = ", ".join(fields) or "none"
        unknown = sorted(set(params) - set(fields))
        if unknown:
            raise SpecError(f"{self.kind} {name}: unknown parameter {unknown[0]!r}; valid parameters: {valid}")
        try:
            return name, entry, config(**params)
        except TokenReduceError:
            raise
        except (TypeError, ValueError) as e:  # a required field left out, or a check of the Config
            raise SpecError(f"{self.kind} {name}: {e}; valid parameters: {valid}") from None

    def canonical(self, spec: str) -> str:
        """``spec`` with every parameter spelled out, e.g. ``'conv'`` -> ``"conv(norm='bn')"``."""
        name, _, cfg = self.resolve(spec)
        return config_spec(name, cfg)

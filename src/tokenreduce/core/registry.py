"""Spec strings and the one registry behind everything addressed by them: methods, tasks, stems
and model transforms.

A spec is ``name(key=value, ...)`` or a bare ``name`` (all defaults). :func:`parse_spec` reads it
with the ast module's literal parsing (never eval); :func:`format_spec` writes it back. A
:class:`Registry` maps names to entries (a class or a function) and their frozen dataclass
``Config``; :meth:`Registry.resolve` turns a spec into (name, entry, Config instance), with errors
that name the problem and the valid choices.

Every parameter is checked against the annotation of its Config field (:func:`check_params`), so a
value is never read in a way the user did not mean: ``fuse='False'`` is not true, ``locs='39'`` is
not blocks 3 and 9, ``r=1.5`` is not an int. The annotations are the declaration: ``bool``,
``int`` (never a bool), ``float`` (an int is accepted and stored as a float), ``str``,
``Literal[...]`` (the choices), ``tuple[X, ...]`` / ``Sequence[X]`` (a tuple or list of X, never a
string; stored as a tuple), unions (``int | Sequence[int] | None``: whichever member fits first)
and ``Any``. A field that takes several shapes says so in its annotation.
"""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import dataclasses
import functools
import importlib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, Union, get_args, get_origin

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
    names = [kw.arg for kw in node.keywords]
    twice = sorted({k for k in names if names.count(k) > 1})
    if twice:
        raise SpecError(f"malformed spec {spec!r}: parameter {twice[0]!r} is given more than once; give it once")
    return node.func.id, {kw.arg: _literal(kw.value, spec) for kw in node.keywords}


# ----------------------------------------------------------------------------- declared types


class _Mismatch(Exception):
    """A value that does not fit an annotation (internal to :func:`check_params`)."""


_SEQUENCES = (tuple, list, collections.abc.Sequence)


def _fit(value: Any, hint: Any) -> Any:
    """``value`` as ``hint`` declares it (an int as a float, a list as a tuple), or _Mismatch."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if origin is Union or origin is types.UnionType:
        for member in args:
            try:
                return _fit(value, member)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if origin in _SEQUENCES:
        if not isinstance(value, (tuple, list)):  # a string is never a tuple
            raise _Mismatch
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_fit(v, a) for v, a in zip(value, args, strict=True))
        item = args[0] if args else Any
        return tuple(_fit(v, item) for v in value)
    if isinstance(hint, type) and hint in (str, bytes):
        if isinstance(value, hint):
            return value
        raise _Mismatch
    raise TypeError(f"spec parameters cannot be declared as {hint!r}; use bool, int, float, str, Literal, "
                    "tuple[X, ...], Sequence[X], None or a union of them")


_NAMES = {bool: ("True or False", "booleans"), int: ("an int", "ints"), float: ("a number", "numbers"),
          str: ("a string", "strings"), type(None): ("None", "None")}


def _either(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} or {parts[-1]}"


def describe(hint: Any, plural: bool = False) -> str:
    """What ``hint`` accepts, in words: ``'an int or a tuple of ints'``, ``"'attn' or 'block'"``."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is None or hint is type(None):
        return "None"
    if origin is Union or origin is types.UnionType:
        return _either([describe(a, plural) for a in args])
    if origin is Literal:
        return _either([repr(a) for a in args])
    if origin in _SEQUENCES:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a tuple of {len(args)} ({', '.join(describe(a) for a in args)})"
        item = describe(args[0], plural=True) if args else "values"
        return f"tuples of {item}" if plural else f"a tuple of {item}"
    if hint is Any:
        return "any literal"
    singular, many = _NAMES.get(hint, (getattr(hint, "__name__", str(hint)), str(hint)))
    return many if plural else singular


def _takes_strings(hint: Any) -> bool:
    if get_origin(hint) in (Union, types.UnionType):
        return any(_takes_strings(a) for a in get_args(hint))
    return hint is str or hint is Any or get_origin(hint) is Literal


@functools.cache
def field_types(config: type) -> dict[str, Any]:
    """The resolved annotation of each field of the dataclass ``config`` (``from __future__ import
    annotations`` leaves them as strings: resolved once with typing.get_type_hints)."""
    hints = typing.get_type_hints(config)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(config)}


def check_params(what: str, config: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` checked against the field annotations of ``config``, converted as they declare (an
    int given for a float, a list for a tuple); SpecError naming the parameter, the value and what
    it takes. ``what`` names the entry in the message (``'method tome'``)."""
    types_ = field_types(config)
    out = {}
    for key, value in params.items():
        hint = types_.get(key, Any)
        try:
            out[key] = _fit(value, hint)
        except _Mismatch:
            hint_text = describe(hint)
            if isinstance(value, str) and not _takes_strings(hint):
                hint_text += ", unquoted" if "True or False" in hint_text else ""
                hint_text += " (a string is not a tuple: write e.g. (3, 6, 9))" if "tuple" in hint_text else ""
            raise SpecError(f"{what}: {key}={value!r} is invalid; {key} takes {hint_text}") from None
    return out


def split_stages(spec: str) -> list[str]:
    """The stages of ``spec`` at its top-level ``+`` (outside parentheses and quotes), as written.

    ``'imagepiece() + evit(keep=0.7)'`` -> ``['imagepiece()', 'evit(keep=0.7)']``; a spec without a
    top-level ``+`` (or one that does not parse: the spec parser reports it) -> ``[spec]``.
    """
    if not isinstance(spec, str):
        return [spec]
    text = spec.strip()
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return [spec]
    parts: list[str] = []

    def walk(n: ast.expr) -> None:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            walk(n.left)
            walk(n.right)
        else:
            parts.append(ast.get_source_segment(text, n) or ast.unparse(n))

    walk(node)
    return parts


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


#: Every registry made (methods, tasks, stems, transforms, experiments): the tests check them all.
REGISTRIES: list[Registry] = []
#: kind -> the module that registers that kind's built-in entries, imported on a registry's first lookup.
#: Set by a higher layer that owns those entries (the package ``__init__`` names ``tokenreduce.methods``),
#: so that core names no module above it and importing the package stays light (no torch for ``--help``).
BUILTINS: dict[str, str] = {}


class Registry(Generic[T]):
    """Named entries of one kind (``'method'``, ``'task'``, ``'stem'``, ``'transform'``), each with
    a frozen dataclass Config. ``load`` (optional) is called before every lookup, to import the
    built-in entries of a package lazily."""

    def __init__(self, kind: str, load: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._load = load
        self._entries: dict[str, tuple[T, type]] = {}
        self._given: list[Registry[T]] = []
        REGISTRIES.append(self)

    @property
    def plural(self) -> str:
        """The kind's plural, for messages: 'methods', 'studies'."""
        consonant_y = self.kind.endswith("y") and self.kind[-2:-1] not in "aeiou"
        return self.kind[:-1] + "ies" if consonant_y else self.kind + "s"

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
        if self.kind in BUILTINS:
            importlib.import_module(BUILTINS[self.kind])  # a no-op once imported
        return sorted(self._entries)

    @contextlib.contextmanager
    def reading(self, other: Registry[T]) -> Iterator[None]:
        """While inside, a lookup by name here (:meth:`get`, :meth:`config`, :meth:`resolve`) finds the entries
        of ``other`` too (the tests' own studies and experiments); :meth:`names` lists this registry's only."""
        self._given.append(other)
        try:
            yield
        finally:
            self._given.remove(other)

    def config(self, name: str) -> type:
        """The Config dataclass of the entry registered under ``name``."""
        return self._entry(name)[1]

    def get(self, name: str) -> T:
        """The entry registered under ``name``; SpecError naming the valid ones otherwise."""
        return self._entry(name)[0]

    def _entry(self, name: str) -> tuple[T, type]:
        """(entry, Config) of ``name``, registered here or in a registry given (:meth:`reading`)."""
        given = next((r for r in self._given if name in r.names()), None)
        if given is not None:
            return given._entry(name)
        names = self.names()
        if name not in self._entries:
            raise SpecError(f"unknown {self.kind} {name!r}; valid {self.plural}: {', '.join(names)}")
        return self._entries[name]

    def resolve(self, spec: str) -> tuple[str, T, Any]:
        """(name, entry, Config instance) of ``spec``, the parameters checked against the Config."""
        name, params = parse_spec(spec)
        entry, config = self._entry(name)
        fields = [f.name for f in dataclasses.fields(config)]
        valid = ", ".join(fields) or "none"
        unknown = sorted(set(params) - set(fields))
        if unknown:
            raise SpecError(f"{self.kind} {name}: unknown parameter {unknown[0]!r}; valid parameters: {valid}")
        params = check_params(f"{self.kind} {name}", config, params)
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

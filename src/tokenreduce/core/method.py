"""The method contract, the registry and spec parsing.

A method is a small ``nn.Module`` (a *reducer*) built from a frozen dataclass config. It declares
what it needs from attention (``needs``) and where it runs (``where``), compiles its schedule for
a host (``bind``) and implements ``reduce(x, state, info, count) -> x``.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from .errors import SpecError
from .schedule import Schedule
from .state import TokenState

#: Side products a method may ask of the attention: the CLS attention row (B, H, N), the keys
#: (B, H, N, d), the per-head output norms ||A_h V_h||_2 (B, H, N).
NEEDS = frozenset({"cls_attn", "keys", "head_norms"})


@dataclass
class AttnInfo:
    """What the adapter computed in the attention of the current block (only what was asked)."""

    cls_attn: Tensor | None = None
    keys: Tensor | None = None
    head_norms: Tensor | None = None


@dataclass(frozen=True)
class Host:
    """What a method may know about the model it is applied to."""

    depth: int
    dim: int
    num_heads: int
    num_prefix: int
    num_patches: int
    grid: tuple[int, int]
    has_class_token: bool


class Reducer(nn.Module):
    """Base class of every method. Subclasses set ``Config``, ``needs`` and ``zero``.

    ``zero`` holds spec parameters that make the method reduce nothing (the contract tests check
    that the patched model then equals the unpatched one); ``example`` holds parameters that
    reduce tokens on a 4-block model (the contract tests run them on tiny hosts).
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type]
    needs: ClassVar[frozenset[str]] = frozenset()
    needs_class_token: ClassVar[bool] = False
    #: keep pruned tokens aside in the TokenState (for methods that bring them back, e.g. LLF)
    keep_pruned: ClassVar[bool] = False
    zero: ClassVar[dict[str, Any]] = {}
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg

    @property
    def where(self) -> str:
        return getattr(self.cfg, "where", "attn")

    @property
    def proportional(self) -> bool:
        """Add log(size) to the attention logits (methods that merge tokens)."""
        return False

    def bind(self, host: Host) -> Schedule:
        """Compile the schedule for ``host`` (and build any learned parts). Raises SpecError."""
        raise NotImplementedError

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        """Reduce x (B, N, C) to ``count`` non-prefix tokens, keeping ``state`` aligned."""
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical spec string of this reducer."""
        args = ", ".join(f"{f.name}={getattr(self.cfg, f.name)!r}" for f in dataclasses.fields(self.cfg))
        return f"{self.name}({args})"

    def extra_repr(self) -> str:
        return self.spec()


_REGISTRY: dict[str, type[Reducer]] = {}


def register_method(name: str) -> Callable[[type[Reducer]], type[Reducer]]:
    """Class decorator: make a Reducer subclass addressable as ``name(...)`` in specs."""

    def deco(cls: type[Reducer]) -> type[Reducer]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"method {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def list_methods() -> list[str]:
    """Names of all registered methods."""
    return sorted(_REGISTRY)


def get_method(name: str) -> type[Reducer]:
    """The Reducer class registered under ``name``."""
    if name not in _REGISTRY:
        raise SpecError(f"unknown method {name!r}; valid methods: {', '.join(list_methods())}")
    return _REGISTRY[name]


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
        raise SpecError(f"a method spec must be a non-empty string like 'tome(r=13)', got {spec!r}")
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


def build_reducer(spec: str | Reducer) -> Reducer:
    """A Reducer from a spec string (or the Reducer itself)."""
    if isinstance(spec, Reducer):
        return spec
    name, params = parse_spec(spec)
    cls = get_method(name)
    fields = [f.name for f in dataclasses.fields(cls.Config)]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise SpecError(
            f"{name}: unknown parameter {unknown[0]!r}; valid parameters: {', '.join(fields)}"
        )
    try:
        cfg = cls.Config(**params)
    except TypeError as e:  # a required field left out
        raise SpecError(f"{name}: {e}; valid parameters: {', '.join(fields)}") from None
    return cls(cfg)

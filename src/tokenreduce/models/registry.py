"""A registry of model parts addressed by spec strings, shared by stems and transforms.

An entry is a function ``fn(model, cfg) -> None`` that changes a timm model in place, and a
frozen dataclass ``Config`` holding its parameters with their defaults. A spec string
(``'conv(norm="bn")'``, a bare ``'tie_qk'``) is parsed with :func:`core.method.parse_spec`, its
parameters checked against the Config, and written back in one canonical form (every parameter,
defaults included, so a checkpoint records what was built even if a default changes later).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from torch import nn

from ..core.errors import SpecError
from ..core.method import format_spec, parse_spec


@dataclasses.dataclass(frozen=True)
class NoParams:
    """The Config of an entry that takes no parameters."""


Fn = TypeVar("Fn", bound=Callable[[nn.Module, Any], None])


class SpecRegistry(Generic[Fn]):
    """Named ``fn(model, cfg)`` entries of one kind (``'stem'``, ``'transform'``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, tuple[type, Fn]] = {}

    def register(self, name: str, config: type = NoParams) -> Callable[[Fn], Fn]:
        """Decorator: make ``fn`` addressable as ``name(...)``; ``config`` is its frozen dataclass."""
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"{self.kind} {name!r}: config must be a dataclass, got {config!r}")

        def deco(fn: Fn) -> Fn:
            if name in self._entries and self._entries[name][1] is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = (config, fn)
            return fn

        return deco

    def names(self) -> list[str]:
        return sorted(self._entries)

    def resolve(self, spec: str) -> tuple[str, Any, Fn]:
        """(name, Config instance, fn) of ``spec``; SpecError naming the valid choices otherwise."""
        name, params = parse_spec(spec)
        if name not in self._entries:
            raise SpecError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}")
        config, fn = self._entries[name]
        fields = [f.name for f in dataclasses.fields(config)]
        unknown = sorted(set(params) - set(fields))
        if unknown:
            valid = ", ".join(fields) if fields else "none"
            raise SpecError(f"{self.kind} {name}: unknown parameter {unknown[0]!r}; valid parameters: {valid}")
        try:
            cfg = config(**params)
        except TypeError as e:
            raise SpecError(f"{self.kind} {name}: {e}") from None
        return name, cfg, fn

    def canonical(self, spec: str) -> str:
        """``spec`` with every parameter spelled out, e.g. ``'conv'`` -> ``"conv(norm='bn')"``."""
        name, cfg, _ = self.resolve(spec)
        return format_spec(name, {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})

    def apply(self, spec: str, model: nn.Module) -> nn.Module:
        """Run ``spec``'s entry on ``model`` (in place); returns ``model``."""
        _, cfg, fn = self.resolve(spec)
        fn(model, cfg)
        return model

"""Lazy package attributes (PEP 562): a package names what it exports and the module defining each, and a
name's module is imported on its first use, so that importing the package stays light."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, api: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` whose public names ``api`` maps to their (relative) modules;
    ``namespace``: the package's globals, where a loaded name is kept so that later look-ups skip this."""

    def __getattr__(name: str) -> Any:
        if name not in api:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(api[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *api})

    return __getattr__, __dir__

"""tokenreduce: token reduction (pruning and merging) for timm Vision Transformers.

    import timm, tokenreduce
    model = timm.create_model("deit_small_patch16_224")
    tokenreduce.apply(model, "tome(r=13)")

Importing the package is light: the public names below are loaded on first use (PEP 562), so that
``import tokenreduce.cli`` and ``tokenreduce --help`` do not pay for torch and every method. The
built-in methods register themselves on the method registry's first lookup.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .core.registry import BUILTINS

BUILTINS["method"] = "tokenreduce.methods"

#: public name -> the module that defines it.
_API = {
    "Capture": "api", "Info": "api", "apply": "api", "capture": "api", "find_info": "api", "get_info": "api",
    "is_patched": "api", "patched": "api", "reapply": "api", "reducer_of": "api", "remove": "api",
    "SpecError": "core.errors", "TokenReduceError": "core.errors", "UnsupportedModelError": "core.errors",
    "Reducer": "core.method", "build_reducer": "core.method", "get_method": "core.method",
    "list_methods": "core.method", "parse_spec": "core.method", "register_method": "core.method",
}

__all__ = [
    "Capture", "Info", "Reducer", "SpecError", "TokenReduceError", "UnsupportedModelError", "apply",
    "build_reducer", "capture", "find_info", "get_info", "get_method", "is_patched", "list_methods",
    "parse_spec", "patched", "reapply", "reducer_of", "register_method", "remove",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .api import (
        Capture,
        Info,
        apply,
        capture,
        find_info,
        get_info,
        is_patched,
        patched,
        reapply,
        reducer_of,
        remove,
    )
    from .core.errors import SpecError, TokenReduceError, UnsupportedModelError
    from .core.method import Reducer, build_reducer, get_method, list_methods, parse_spec, register_method


def __getattr__(name: str) -> Any:
    if name not in _API:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return importlib.import_module(f".{name}", __name__)  # a sub-package, e.g. tokenreduce.methods
    value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})

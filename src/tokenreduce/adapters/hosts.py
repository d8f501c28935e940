"""The registry of hosts: which adapter patches a given model, and the interface the rest of the
library talks to a host through (``apply``, ``remove``, ``get_patch``, ``check_host``, ``parts``).

Each host is one module of adapters/ with the same functions: ``accepts(model)`` (cheap, and
without importing its library unless the model comes from it: transformers is optional),
``check_host(model) -> Host``, ``apply``, ``remove``, ``parts(model) -> HostParts``, and its
``DESCRIPTION``. The first host that accepts a model drives it; a model no host accepts is
refused with every host's description. Adding a host is adding its module to :data:`HOSTS`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from torch import nn

from ..core.errors import UnsupportedModelError
from ..core.method import Host, Reducer
from .common import ATTR, HostParts, Patch
from .common import get_patch as get_patch

#: host name -> its adapter module, asked in this order.
HOSTS = {"timm": "tokenreduce.adapters.timm_vit", "transformers": "tokenreduce.adapters.hf_vit"}


def adapter(model: nn.Module) -> ModuleType:
    """The adapter module that drives ``model``; UnsupportedModelError naming every host if none."""
    modules = [importlib.import_module(path) for path in HOSTS.values()]
    for module in modules:
        if module.accepts(model):
            return module
    raise UnsupportedModelError(
        f"tokenreduce patches {' and '.join(m.DESCRIPTION for m in modules)}; got {type(model).__name__}"
    )


def check_host(model: nn.Module) -> Host:
    """What a method may know about ``model``; raises UnsupportedModelError if no host drives it."""
    return adapter(model).check_host(model)


def parts(model: nn.Module) -> HostParts:
    """``model``'s sub-modules under host-neutral names (what bench/macs.py counts)."""
    return adapter(model).parts(model)


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch ``model`` in place with its host's adapter (``tokenreduce.apply``)."""
    return adapter(model).apply(model, spec, trace=trace, dense=dense)


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply`` with the model's host adapter (``tokenreduce.remove``)."""
    return adapter(model).remove(model)


def is_patched(model: nn.Module) -> bool:
    return hasattr(model, ATTR)


__all__ = ["HOSTS", "Patch", "adapter", "apply", "check_host", "get_patch", "is_patched", "parts", "remove"]

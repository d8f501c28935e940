"""Whether a method exports to ONNX correctly by a given exporter at a given opset, checked before a
wrong file is written.

torch has two ONNX exporters: the dynamo-based one (``torch.onnx.export(dynamo=True)``, which
``tokenreduce export`` uses) and the classic one, which traces the forward with torch.jit
(``dynamo=False``). A method declares what an export needs (``Reducer.min_onnx_opset``,
``Reducer.classic_onnx``) and :func:`check_onnx` turns those declarations into a TokenReduceError.

The classic exporter is checked where users meet it: the patched forward calls
:func:`check_onnx` when it runs under that exporter (:func:`classic_export_opset`), so a direct
``torch.onnx.export(model, x, dynamo=False, opset_version=14)`` of ToMe raises instead of writing a
graph in which, of several tokens merged into one, only one survives.
"""

from __future__ import annotations

import importlib

import torch

from .errors import TokenReduceError
from .method import Reducer

#: What works for a method the classic exporter cannot export: the dynamo path with the package's
#: operator translations.
DYNAMO_ROUTE = ("the dynamo exporter: tokenreduce export, tokenreduce.bench.export.export_onnx(model, path), or "
                "torch.onnx.export(model, (x,), dynamo=True, "
                "custom_translation_table=tokenreduce.bench.export.translations())")


def check_onnx(reducer: Reducer, *, exporter: str, opset: int | None) -> None:
    """Raise TokenReduceError unless ``exporter`` (one of ``bench.settings.EXPORTERS``) exports ``reducer``'s
    forward correctly at ``opset`` (None: the exporter's default, at least 17 in every torch the
    package supports, so only a method needing more is checked against it)."""
    if exporter == "classic" and not reducer.classic_onnx:
        raise TokenReduceError(
            f"{reducer.spec()} cannot be exported by torch's classic ONNX exporter (torch.onnx.export(dynamo=False)): "
            f"its forward uses what that exporter cannot translate (Reducer.classic_onnx is False); use {DYNAMO_ROUTE}"
        )
    if opset is not None and opset < reducer.min_onnx_opset:
        raise TokenReduceError(
            f"{reducer.spec()} needs ONNX opset >= {reducer.min_onnx_opset} (Reducer.min_onnx_opset: below it an "
            f"operator of its forward has no exact ONNX form, e.g. a scatter that sums tokens); got opset {opset}: "
            f"export at opset {reducer.min_onnx_opset} or higher, or leave the opset to the exporter"
        )


def classic_export_opset() -> int | None:
    """The opset of the classic ONNX export running now, or None when none is (plain torch.jit.trace
    included). Cheap outside a trace: the first test is ``torch.jit.is_tracing()``, which
    torch.compile folds to False."""
    if not torch.jit.is_tracing():
        return None
    for name in ("torch.onnx._internal.torchscript_exporter._globals", "torch.onnx._globals"):  # torch >= 2.9, older
        try:
            state = importlib.import_module(name).GLOBALS
        except (ImportError, AttributeError):
            continue
        return int(state.export_onnx_opset_version) if state.in_onnx_export else None
    return None

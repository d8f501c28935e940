"""ONNX export of a timm ViT, patched or not, with static token counts, checked with onnxruntime.

A fixed schedule gives every tensor of the forward a static shape: the exported graph holds the
reduced token counts as constants (``graph_token_counts`` reads them back), for one batch size.
The export goes through ``torch.onnx.export(dynamo=True)`` (torch.export, then ONNX Script):

    model (eval) --torch.export--> ExportedProgram --onnxscript--> model.onnx
    check: onnxruntime(model.onnx)(x) vs model(x) on the same inputs -> max |difference|

What cannot be exported raises a TokenReduceError naming it: a model in training mode (a learned
reducer's soft policy keeps every token and draws noise there), ``apply(..., trace=True)`` (a
(B, N, N0) membership map per block, a Python-side record), a method that declares
``exportable = False`` or ``dynamic_schedule = True`` (``core.method.Reducer``).

One operator needs a translation of its own: a *stable* sort (``torch.sort(stable=True)``, which
keeps equal keys in their order; subset matching and fusion use it) has no ONNX function in
torch's exporter. ONNX TopK over the whole axis is that sort: the ONNX spec breaks ties by the
lower index, which is what stability means (``translations``).

onnx, onnxruntime and onnxscript are optional: ``pip install 'tokenreduce[export]'``.
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..adapters import timm_vit
from ..core.errors import TokenReduceError
from .macs import input_shape

INSTALL_HINT = "pip install 'tokenreduce[export]' (onnx, onnxruntime, onnxscript)"


def require(module: str) -> Any:
    """Import an optional export dependency, or fail with the install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TokenReduceError(f"{module} is not installed; {INSTALL_HINT}") from None


@dataclass
class ExportResult:
    """What :func:`export_onnx` wrote and how it compared with the eager model."""

    path: Path
    input_shape: tuple[int, ...]
    spec: str | None
    tokens_per_block: list[int]
    graph_tokens: list[int]
    max_abs_diff: float | None
    opset: int | None
    size_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path), "input_shape": list(self.input_shape)}


def check_exportable(model: nn.Module) -> None:
    """Raise TokenReduceError, naming the reason, if ``model`` cannot be exported as it is set up."""
    patch = getattr(model, timm_vit._ATTR, None)
    reducer = patch.reducer if patch is not None else None
    if model.training:
        why = ""
        if reducer is not None and reducer.learned:
            why = (f"; {reducer.spec()} is a learned reducer whose training-mode soft policy keeps every token "
                   "(and samples noise), so there are no reduced token counts to export")
        raise TokenReduceError(f"the model is in training mode{why}; call model.eval() before exporting")
    if patch is None:
        return
    if patch.trace:
        raise TokenReduceError("a model patched with trace=True records token sources in Python on every forward; "
                               "apply the method without trace=True to export it")
    if reducer.dynamic_schedule:
        raise TokenReduceError(f"{reducer.spec()} declares a dynamic schedule (token counts follow the input): "
                               "ONNX export needs static token counts")
    if not reducer.exportable:
        raise TokenReduceError(f"{reducer.spec()} declares that it cannot be exported to ONNX "
                               "(Reducer.exportable is False)")


def _sort_stable(self: Any, stable: bool | None = None, dim: int = -1, descending: bool = False) -> Any:
    """aten.sort.stable -> ONNX TopK over the whole axis (ties: lower index first = stable)."""
    from onnxscript import opset18 as op

    size = op.Reshape(op.Gather(op.Shape(self), dim, axis=0), op.Constant(value_ints=[1]))
    return op.TopK(self, size, axis=dim, largest=descending, sorted=True)


def translations() -> dict[Any, Any]:
    """The exporter's ``custom_translation_table``: operators torch's ONNX exporter has no function for."""
    return {torch.ops.aten.sort.stable: _sort_stable}


def session(path: str | os.PathLike, threads: int | None = None) -> Any:
    """An onnxruntime CPU InferenceSession for ``path``; ``threads`` intra-op threads (None: ORT's).

    Its threads do not spin-wait for work: each session owns a thread pool, and in an interleaved
    timing run the pools of the sessions not being timed would otherwise spin on the cores the
    timed one needs (measured here: single forwards 40x slower on 2 cores)."""
    ort = require("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # errors only: ORT warns about every constant it cannot fold
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def run_session(sess: Any, x: Tensor) -> Tensor:
    """The first output of ``sess`` on the images ``x`` (B, C, H, W), as a tensor."""
    out = sess.run(None, {sess.get_inputs()[0].name: x.detach().cpu().numpy()})[0]
    return torch.from_numpy(out)


def graph_token_counts(path: str | os.PathLike, batch: int, width: int) -> list[int]:
    """Distinct token counts N of the (batch, N, width) values in the ONNX graph at ``path``
    (shapes inferred by onnx): the token counts the exported forward runs with, ascending."""
    onnx = require("onnx")
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    counts = set()
    for value in (*graph.value_info, *graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) == 3 and dims[0].dim_value == batch and dims[2].dim_value == width:
            counts.add(dims[1].dim_value)
    return sorted(counts)


def export_onnx(model: nn.Module, path: str | os.PathLike, *, batch: int = 1, img_size: int | None = None,
                seed: int = 0, check: bool = True) -> ExportResult:
    """Export ``model`` (a timm ViT, patched or not, in eval mode) to ONNX at ``path``.

    Args:
        model: the model as it will run; the graph is traced at ``batch`` images of its input
            size (``img_size`` overrides it), so every shape in it is static.
        path: the .onnx file to write (weights inside it).
        seed: seed of the random images used to trace and to check.
        check: run the file with onnxruntime on the same images and report max |ORT - eager|.
    Returns:
        ExportResult: the path, the input shape, the per-block token counts of the eager forward,
        the token counts found in the graph, the max abs difference (None without ``check``).
    Raises:
        TokenReduceError: for what cannot be exported (:func:`check_exportable`), or when the
        exporter fails (its first line), or an export dependency is missing.
    """
    require("onnxscript")
    if "custom_translation_table" not in inspect.signature(torch.onnx.export).parameters:
        raise TokenReduceError(f"torch {torch.__version__} has no dynamo-based ONNX exporter with custom "
                               "translations (torch.onnx.export(dynamo=True, custom_translation_table=...)); "
                               "upgrade torch to export")
    check_exportable(model)
    patch = getattr(model, timm_vit._ATTR, None)
    ref = next(model.parameters())
    shape = (batch, *input_shape(model, img_size))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(ref.device, ref.dtype)
    with torch.no_grad():
        want = model(x)
    tokens = list(patch.last.tokens_per_block) if patch is not None else None
    last = patch.last if patch is not None else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation and tracing chatter
            program = torch.onnx.export(model, (x,), dynamo=True, verbose=False,
                                        custom_translation_table=translations())
    except TokenReduceError:
        raise
    except Exception as e:  # the exporter raises many kinds; its first line names the operator
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenReduceError(f"ONNX export failed: {type(e).__name__}: {first}") from e
    finally:
        if patch is not None:
            patch.last = last  # tracing ran the forward on fake tensors; keep the eager record
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    program.save(str(out))
    if tokens is None:
        n = model.patch_embed.num_patches + model.num_prefix_tokens
        tokens = [n] * len(model.blocks)
    diff = None
    if check:
        diff = float((run_session(session(out), x).to(torch.float64) - want.detach().cpu().to(torch.float64))
                     .abs().max())
    opsets = {o.domain: o.version for o in program.model_proto.opset_import} if hasattr(program, "model_proto") else {}
    return ExportResult(
        path=out, input_shape=shape, spec=patch.reducer.spec() if patch is not None else None,
        tokens_per_block=tokens, graph_tokens=graph_token_counts(out, batch, model.embed_dim),
        max_abs_diff=diff, opset=opsets.get(""),
        size_bytes=out.stat().st_size,
    )


def load_for_export(*, model: str | None = None, checkpoint: str | None = None, spec: str | None = None,
                    img_size: int | None = None, pretrained: bool = False) -> tuple[nn.Module, str]:
    """The model ``tokenreduce export`` exports, in eval mode, and a description of it.

    ``checkpoint``: a tokenreduce checkpoint (a file or a training output directory): its model,
    stem, transforms and method are rebuilt (``models.load_model``) and deployed without what only
    training needs (``models.deploy``). Otherwise the timm model ``model`` (random weights unless
    ``pretrained``). ``spec``, if given, is applied last (replacing a checkpoint's method).
    """
    from ..api import apply
    from ..models import deploy, load_model
    from .model import create_model

    if checkpoint is not None:
        if model is not None or img_size is not None or pretrained:
            raise TokenReduceError("--checkpoint rebuilds the model it was saved from; leave out --model, "
                                   "--img-size and --pretrained")
        net, meta = load_model(checkpoint)
        deploy(net)
        what = f"{checkpoint} ({meta['model']['name']}{', ' + meta['spec'] if meta.get('spec') else ''})"
    else:
        name = model or "deit_small_patch16_224"
        net = create_model(name, img_size=img_size, pretrained=pretrained)
        what = f"{name} ({'pretrained weights' if pretrained else 'randomly initialised'})"
    if spec is not None:
        apply(net, spec)
        what += f" + {spec}"
    return net.eval(), what


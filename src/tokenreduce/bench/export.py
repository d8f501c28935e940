"""ONNX export of a timm ViT, patched or not, with static token counts, checked with onnxruntime.

A fixed schedule gives every token count of the forward a static value: the exported graph holds
the reduced token counts as constants (``graph_token_counts`` reads them back), for one batch size
or, with ``dynamic_batch=True``, one file for every batch size (the batch axis symbolic).
The export goes through ``torch.onnx.export(dynamo=True)`` (torch.export, then ONNX Script):

    model (eval) --torch.export--> ExportedProgram --onnxscript--> model.onnx
    check: onnxruntime(model.onnx)(x) vs model(x) on the same inputs -> max |difference|

``exporter='classic'`` uses torch's older TorchScript-tracing exporter (``dynamo=False``) instead,
for tools that need it. A method declares what either needs (core/onnx.py): below
``Reducer.min_onnx_opset`` (16 for a merge, a scatter that sums tokens) the export is refused,
since the classic exporter would write a graph in which of several merged tokens only one
survives; a method that declares ``classic_onnx = False`` (ImagePiece's stable sort) is refused
by the classic exporter with the dynamo path named.

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

import importlib
import inspect
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..adapters import hosts
from ..api import apply
from ..core.errors import TokenReduceError
from ..core.onnx import check_onnx
from ..models import ModelSource, deploy, load_model, make_model
from .macs import input_shape
from .settings import EXPORTERS

INSTALL_HINT = "pip install 'tokenreduce[export]' (onnx, onnxruntime, onnxscript)"


def require(module: str) -> Any:
    """Import an optional export dependency, or fail with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise TokenReduceError(f"{module} is not installed; {INSTALL_HINT}") from None


def _exporter_errors() -> tuple[type[BaseException], ...]:
    """The exception types by which torch's exporters say a graph is beyond them (an operator without
    an ONNX translation, a construct torch.export cannot capture). A Python error of another kind
    raised while exporting is a bug in the traced code and keeps its traceback."""
    found: list[type[BaseException]] = []
    for module, names in (("torch.onnx.errors", ("OnnxExporterError", "UnsupportedOperatorError",
                                                 "SymbolicValueError")),
                          ("torch._dynamo.exc", ("Unsupported", "UserError", "TorchRuntimeError")),
                          ("torch._export.error", ("ExportError",))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        found += [t for t in (getattr(mod, n, None) for n in names) if isinstance(t, type)]
    return tuple(found)


def _runtime_errors() -> tuple[type[BaseException], ...]:
    """The exception types by which onnxruntime refuses a graph it cannot load or run (an invalid model, an
    operator or type without a kernel)."""
    state = require("onnxruntime.capi.onnxruntime_pybind11_state")
    names = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NotImplemented", "RuntimeException",
             "EPFail")
    return tuple(t for t in (getattr(state, n, None) for n in names) if isinstance(t, type))


def _first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when it has none)."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


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
    dynamic_batch: bool = False
    exporter: str = "dynamo"

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "path": str(self.path), "input_shape": list(self.input_shape)}


def check_exportable(model: nn.Module) -> None:
    """Raise TokenReduceError, naming the reason, if ``model`` cannot be exported as it is set up."""
    info = hosts.find_info(model)
    reducer = hosts.reducer_of(model) if info is not None else None
    if model.training:
        why = ""
        if reducer is not None and reducer.learned:
            why = (f"; {reducer.spec()} is a learned reducer whose training-mode soft policy keeps every token "
                   "(and samples noise), so there are no reduced token counts to export")
        raise TokenReduceError(f"the model is in training mode{why}; call model.eval() before exporting")
    if info is None:
        return
    if info.trace:
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
    timed one needs."""
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


def graph_token_counts(path: str | os.PathLike, batch: int | None, width: int) -> list[int]:
    """Distinct token counts N of the (batch, N, width) values in the ONNX graph at ``path``
    (shapes inferred by onnx): the token counts the exported forward runs with, ascending.
    ``batch=None``: a graph with a symbolic batch axis (``dynamic_batch``): the values batched by it."""
    onnx = require("onnx")
    graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
    counts = set()
    for value in (*graph.value_info, *graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 3 or dims[2].dim_value != width:
            continue
        if (dims[0].dim_param != "") if batch is None else (dims[0].dim_value == batch):
            counts.add(dims[1].dim_value)
    counts.discard(0)  # a symbolic token axis (none in a reduced forward: its counts are static)
    return sorted(counts)


def export_onnx(model: nn.Module, path: str | os.PathLike, *, batch: int = 1, img_size: int | None = None,
                seed: int = 0, check: bool = True, dynamic_batch: bool = False, exporter: str = "dynamo",
                opset: int | None = None) -> ExportResult:
    """Export ``model`` (a timm ViT, patched or not, in eval mode) to ONNX at ``path``.

    Args:
        model: the model as it will run; the graph is traced at ``batch`` images of its input
            size (``img_size`` overrides it), so every shape in it is static.
        path: the .onnx file to write (weights inside it).
        seed: seed of the random images used to trace and to check.
        check: run the file with onnxruntime on the same images and report max |ORT - eager|.
        dynamic_batch: a symbolic batch axis, one file for every batch size (the token counts stay
            static). torch.export specialises a size of 1, so the graph is traced at
            max(batch, 2) images; the check runs it at that batch and at batch 1.
        exporter: 'dynamo' (``torch.onnx.export(dynamo=True)`` with :func:`translations`; every
            method) or 'classic' (``dynamo=False``, the TorchScript-tracing exporter; refused for a
            method that declares ``classic_onnx = False``, e.g. ImagePiece: use 'dynamo').
        opset: the ONNX opset (None: the exporter's default, which every method's
            ``min_onnx_opset`` allows); one below the method's ``min_onnx_opset`` is refused, not
            moved. The dynamo exporter writes at least opset 18 (torch converts older opsets
            only where it can): ``ExportResult.opset`` is the one written.
    Returns:
        ExportResult: the path, the input shape traced, the per-block token counts of the eager
        forward, the token counts found in the graph, the max abs difference (None without ``check``).
    Raises:
        TokenReduceError: for what cannot be exported (:func:`check_exportable`,
        ``core.onnx.check_onnx``), or when the exporter fails (its first line), or an export
        dependency is missing.
    """
    if exporter not in EXPORTERS:
        raise TokenReduceError(f"unknown ONNX exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int) or opset < 1):
        raise TokenReduceError(f"opset must be a positive integer (an ONNX opset version), got {opset!r}")
    require("onnxscript" if exporter == "dynamo" else "onnx")
    if exporter == "dynamo" and "custom_translation_table" not in inspect.signature(torch.onnx.export).parameters:
        raise TokenReduceError(f"torch {torch.__version__} has no dynamo-based ONNX exporter with custom "
                               "translations (torch.onnx.export(dynamo=True, custom_translation_table=...)); "
                               "upgrade torch to export")
    check_exportable(model)
    reducer = hosts.reducer_of(model) if hosts.is_patched(model) else None
    if reducer is not None:
        check_onnx(reducer, exporter=exporter, opset=opset)
    ref = next(model.parameters())
    shape = (max(batch, 2) if dynamic_batch else batch, *input_shape(model, img_size))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(ref.device, ref.dtype)
    checks = [x, x[:1]] if dynamic_batch else [x]  # a dynamic batch is checked at a second size
    with torch.no_grad():
        wants = [model(c) for c in reversed(checks)][::-1]  # x last: its record is the one kept
    tokens = hosts.info(model).tokens_per_block if reducer is not None else None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # written under a temporary name and moved into place once onnxruntime has loaded (and run) it: a failed
    # export or a graph onnxruntime refuses leaves no file behind, an earlier one at ``path`` stays as it was
    fd, name = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".tmp.onnx", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        written = _export_to(model, x, tmp, exporter, dynamic_batch, opset, reducer)
        if tokens is None:
            n = model.patch_embed.num_patches + model.num_prefix_tokens
            tokens = [n] * len(model.blocks)
        diff = None
        if check:
            try:
                sess = session(tmp)
                got = [run_session(sess, c) for c in checks]
            except _runtime_errors() as e:
                raise TokenReduceError(f"onnxruntime cannot run the exported graph ({type(e).__name__}: "
                                       f"{_first_line(e).replace(str(tmp), str(out))}); nothing was written to {out}"
                                       ) from None
            diff = max(float((g.to(torch.float64) - w.detach().cpu().to(torch.float64)).abs().max())
                       for g, w in zip(got, wants, strict=True))
        graph_tokens = graph_token_counts(tmp, None if dynamic_batch else shape[0], model.embed_dim)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    opsets = {o.domain: o.version for o in written.opset_import}
    return ExportResult(
        path=out, input_shape=shape, spec=reducer.spec() if reducer is not None else None,
        tokens_per_block=tokens, graph_tokens=graph_tokens, max_abs_diff=diff, opset=opsets.get(""),
        size_bytes=out.stat().st_size, dynamic_batch=dynamic_batch, exporter=exporter,
    )


def _export_to(model: nn.Module, x: Tensor, out: Path, exporter: str, dynamic_batch: bool, opset: int | None,
               reducer: Any) -> Any:
    """Run ``exporter`` on ``model`` at the images ``x`` into ``out``; its ModelProto. What the exporter cannot
    translate is a TokenReduceError naming its first line; any other error is a bug and keeps its traceback."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation and tracing chatter
            return _EXPORT[exporter](model, x, out, dynamic_batch, opset)
    except TokenReduceError:
        raise
    except _exporter_errors() as e:
        hint = "; the dynamo exporter (exporter='dynamo') may export it" if exporter == "classic" else ""
        raise TokenReduceError(f"ONNX export failed ({exporter} exporter): {type(e).__name__}: {_first_line(e)}{hint}"
                               ) from e
    finally:
        if reducer is not None:  # tracing recorded its forward on fake tensors: record the eager one again
            with torch.no_grad():
                model(x)


def _export_dynamo(model: nn.Module, x: Tensor, out: Path, dynamic_batch: bool, opset: int | None) -> Any:
    """torch.onnx.export(dynamo=True) with the package's translations; returns the ModelProto written."""
    kwargs: dict[str, Any] = {} if opset is None else {"opset_version": opset}
    if dynamic_batch:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch")},)
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False, custom_translation_table=translations(),
                                **kwargs)
    program.save(str(out))
    return program.model_proto


def _export_classic(model: nn.Module, x: Tensor, out: Path, dynamic_batch: bool, opset: int | None) -> Any:
    """torch.onnx.export(dynamo=False), the TorchScript-tracing exporter; returns the ModelProto written.
    The patched forward checks the method against the opset while it is traced (core/onnx.py)."""
    axes = {"images": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    torch.onnx.export(model, (x,), str(out), dynamo=False, opset_version=opset, input_names=["images"],
                      output_names=["logits"], dynamic_axes=axes)
    return require("onnx").load(str(out), load_external_data=False)


#: The exporters by name (``settings.EXPORTERS``, in that order).
_EXPORT = dict(zip(EXPORTERS, (_export_dynamo, _export_classic), strict=True))


def load_for_export(*, model: str | None = None, checkpoint: str | None = None, spec: str | None = None,
                    img_size: int | None = None, pretrained: bool = False) -> tuple[nn.Module, str]:
    """The model ``tokenreduce export`` exports, in eval mode, and a description of it.

    ``checkpoint``: a tokenreduce checkpoint (a file or a training output directory): its model,
    stem, transforms and method are rebuilt (``models.load_model``) and deployed without what only
    training needs (``models.deploy``). Otherwise the timm model ``model`` (random weights unless
    ``pretrained``). ``spec``, if given, is applied last (replacing a checkpoint's method).
    """
    if checkpoint is not None:
        if model is not None or img_size is not None or pretrained:
            raise TokenReduceError("--checkpoint rebuilds the model it was saved from; leave out --model, "
                                   "--img-size and --pretrained")
        net, meta = load_model(checkpoint)
        deploy(net)
        what = f"{checkpoint} ({meta['model']['name']}{', ' + meta['spec'] if meta.get('spec') else ''})"
    else:
        name = model or "deit_small_patch16_224"
        kwargs = {} if img_size is None else {"img_size": img_size}
        net = make_model(ModelSource(config={"name": name, "kwargs": kwargs, "pretrained": pretrained})).model
        what = f"{name} ({'pretrained weights' if pretrained else 'randomly initialised'})"
    if spec is not None:
        apply(net, spec)
        what += f" + {spec}"
    return net.eval(), what


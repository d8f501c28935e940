"""How a timed case runs: the backends of ``measure_speed(..., backend=...)``, one registry.

    eager        the model itself, patched in place for the case's turn in a round and unpatched
                 after it (every case on the very same weights in the same memory)
    compile      torch.compile of a patched copy of the model (dynamic=False: one graph per batch
                 size, both compiled before the first round, so compilation is never timed), in
                 one of torch.compile's modes (``settings.COMPILE_MODES``; reduce-overhead: CUDA
                 graphs, each call begun as a new step so a replay may reuse the last one's memory)
    onnxruntime  an ONNX export of a patched copy (bench/export.py; static token counts, one file
                 per batch size) run by an onnxruntime CPU session with the run's thread count

The unpatched model goes through the same backend as the specs, so every ratio compares a
reduced and an unreduced model compiled or exported the same way.
A backend is a context manager holding what the whole run needs (a temporary directory for the
ONNX files; dynamo's recompile limit raised, since every compiled copy adds entries for the same
code objects) and builds one :class:`Runner` per case.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..adapters import hosts
from ..core.errors import TokenReduceError
from ..core.method import Reducer
from . import settings
from .export import export_onnx, require, session


class Runner:
    """One case on one backend: ``enter()`` before its turn in a round, ``runner(x)``, ``exit()`` after."""

    def enter(self) -> None:
        pass

    def exit(self) -> None:
        pass

    def __call__(self, x: Tensor) -> Any:
        raise NotImplementedError


def _patched_copy(model: nn.Module, reducer: Reducer | None) -> nn.Module:
    """A copy of ``model`` with ``reducer`` applied, in eval mode (compiled code and exported files
    hold the module they were made from, so each case gets its own)."""
    out = copy.deepcopy(model)
    if reducer is not None:
        hosts.apply(out, reducer)
        reducer.to(dtype=next(model.parameters()).dtype)
    return out.eval()


def _one_per_shape(inputs: Sequence[Tensor]) -> list[Tensor]:
    """The first input of each distinct shape (batch B = 1 needs one graph, not two)."""
    return list({tuple(x.shape): x for x in reversed(inputs)}.values())


class Backend:
    """A way to run the cases of one timing run; subclasses register in ``BACKENDS``."""

    def __init__(self, threads: int | None = None, compile_mode: str = "default") -> None:
        if compile_mode not in settings.COMPILE_MODES:
            raise TokenReduceError(f"unknown compile mode {compile_mode!r}; choose one of "
                                   f"{', '.join(settings.COMPILE_MODES)}")
        self.threads, self.compile_mode = threads, compile_mode

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def check(self, model: nn.Module) -> None:
        """Raise TokenReduceError if ``model`` (device, dtype) cannot run on this backend."""

    def versions(self) -> dict[str, str]:
        """Versions of what the backend runs on beyond torch, for results' provenance."""
        return {}

    def runner(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor], label: str) -> Runner:
        raise NotImplementedError


def _feeds(model: nn.Module, inputs: Sequence[Tensor]) -> dict[tuple[int, ...], hosts.Feed]:
    """Each input's images as ``model``'s forward takes them (``hosts.feed``), made once, outside the timer, by
    the images' shape."""
    return {tuple(x.shape): hosts.feed(model, x) for x in _one_per_shape(inputs)}


class _EagerRunner(Runner):
    def __init__(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor]) -> None:
        self.model, self.reducer, self.feeds = model, reducer, _feeds(model, inputs)

    def enter(self) -> None:
        if self.reducer is not None:
            hosts.apply(self.model, self.reducer)
            # apply moves a learned reducer to the device only; timing is eval
            self.reducer.to(dtype=next(self.model.parameters()).dtype).eval()

    def exit(self) -> None:
        if self.reducer is not None:
            hosts.remove(self.model)

    def __call__(self, x: Tensor) -> Any:
        return self.feeds[tuple(x.shape)](self.model)


class Eager(Backend):
    """'eager': the model itself, patched in place for the case's turn."""

    def runner(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor], label: str) -> Runner:
        return _EagerRunner(model, reducer, inputs)


class _CompiledRunner(Runner):
    def __init__(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor], mode: str) -> None:
        self.fn = torch.compile(_patched_copy(model, reducer), dynamic=False, mode=mode)
        self.feeds = _feeds(model, inputs)
        self.graphs = mode == "reduce-overhead"
        with torch.inference_mode():  # the mode of the timed rounds: the same guards, no recompile there
            for x in _one_per_shape(inputs):
                for _ in range(3 if self.graphs else 1):  # CUDA graphs: warm-up, record, first replay
                    self(x)

    def __call__(self, x: Tensor) -> Any:
        if self.graphs:  # the previous output is not read again: its memory may be reused
            torch.compiler.cudagraph_mark_step_begin()
        return self.feeds[tuple(x.shape)](self.fn)


class Compiled(Backend):
    """'compile': torch.compile of a patched copy."""

    def __enter__(self) -> Compiled:
        import torch._dynamo.config as config  # only when compiling: importing dynamo takes seconds

        # every case compiles the same code objects (timm's forward, the adapter's) once per batch
        # size; past the default limit (8) dynamo would silently run the rest eagerly
        key = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        self._patch = config.patch(**{key: 1024})
        self._patch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._patch.__exit__(*exc)

    def runner(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor], label: str) -> Runner:
        return _CompiledRunner(model, reducer, inputs, self.compile_mode)


class _OnnxRunner(Runner):
    def __init__(self, sessions: dict[tuple[int, ...], Any]) -> None:
        self.sessions = {shape: (s, s.get_inputs()[0].name) for shape, s in sessions.items()}

    def __call__(self, x: Tensor) -> Any:
        sess, name = self.sessions[tuple(x.shape)]
        return sess.run(None, {name: x.numpy()})


class OnnxRuntime(Backend):
    """'onnxruntime': an ONNX export of a patched copy, run by an onnxruntime CPU session."""

    def __enter__(self) -> OnnxRuntime:
        self._dir = tempfile.TemporaryDirectory(prefix="tokenreduce-onnx-")
        self._files = 0
        return self

    def __exit__(self, *exc: Any) -> None:
        self._dir.cleanup()

    def check(self, model: nn.Module) -> None:
        require("onnxruntime")
        if hosts.check_host(model).family != "timm":
            raise TokenReduceError("the onnxruntime backend exports timm models only (bench/export.py); time a "
                                   "transformers model with --backend eager or compile")
        ref = next(model.parameters())
        if ref.device.type != "cpu" or ref.dtype != torch.float32:
            raise TokenReduceError(f"the onnxruntime backend runs float32 on the CPU (CPUExecutionProvider); "
                                   f"the model is {ref.dtype} on {ref.device}: use --device cpu --dtype float32")

    def versions(self) -> dict[str, str]:
        return {name: require(name).__version__ for name in ("onnx", "onnxruntime", "onnxscript")}

    def runner(self, model: nn.Module, reducer: Reducer | None, inputs: Sequence[Tensor], label: str) -> Runner:
        patched = _patched_copy(model, reducer)
        name = "".join(c if c.isalnum() else "_" for c in label)[:60]
        sessions = {}
        for x in _one_per_shape(inputs):
            self._files += 1
            path = f"{self._dir.name}/{self._files}-{name}-b{x.shape[0]}.onnx"
            export_onnx(patched, path, batch=x.shape[0], img_size=tuple(x.shape[2:]), check=False)
            sessions[tuple(x.shape)] = session(path, self.threads)
        return _OnnxRunner(sessions)


#: The backends by name (``settings.BACKENDS``, in that order).
BACKENDS: dict[str, type[Backend]] = dict(zip(settings.BACKENDS, (Eager, Compiled, OnnxRuntime), strict=True))


def get_backend(name: str, threads: int | None = None, compile_mode: str = "default") -> Backend:
    """The backend ``name`` (one of ``BACKENDS``) for a run with ``threads`` threads (``compile_mode``: the
    'compile' backend's torch.compile mode)."""
    if name not in BACKENDS:
        raise TokenReduceError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if compile_mode != "default" and name != "compile":
        raise TokenReduceError(f"--compile-mode {compile_mode} needs --backend compile (got {name})")
    return BACKENDS[name](threads, compile_mode)

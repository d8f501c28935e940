"""The registry of hosts: which adapter patches a given model, and the interface the rest of the
library talks to a host through: ``apply``, ``remove``, ``patched`` (apply for a ``with`` block, then
undo), ``reapply`` (the patch again with an option or the reducer changed), ``is_patched``,
``reducer_of``, ``info`` (what the patch is set to do and the last forward's detached record),
``capture`` (the live record, for a loss), ``check_host``, ``parts`` and ``feed`` (a batch of images as
the model's forward takes it). Nothing outside adapters/ reads the patch record itself.

Each host is one module of adapters/ with the same functions: ``accepts(model)`` (cheap, and
without importing its library unless the model comes from it: transformers is optional),
``check_host(model) -> Host``, ``apply``, ``remove``, ``parts(model) -> HostParts``,
``feed(model, images) -> Feed`` and its ``DESCRIPTION``. The first host that accepts a model drives it;
a model no host accepts is refused with every host's description. Adding a host is adding its module to :data:`HOSTS`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType

import torch
from torch import Tensor, nn

from ..core.errors import UnsupportedModelError
from ..core.method import Host, Reducer
from ..core.schedule import Schedule
from .common import ATTR, Capture, Feed, Forward, HostParts, get_patch

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


def feed(model: nn.Module, images: Tensor) -> Feed:
    """Images (B, C, H, W) as ``model``'s forward takes them, patched or not: ``feed(model, x)(model)`` runs
    it (one home for what a host's input is: every command that feeds images to a model goes through it)."""
    return adapter(model).feed(model, images)


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch ``model`` in place with its host's adapter (``tokenreduce.apply``)."""
    return adapter(model).apply(model, spec, trace=trace, dense=dense)


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply`` with the model's host adapter (``tokenreduce.remove``)."""
    return adapter(model).remove(model)


def is_patched(model: nn.Module) -> bool:
    """Whether tokenreduce's patch is on ``model``."""
    return hasattr(model, ATTR)


def reducer_of(model: nn.Module) -> Reducer:
    """The reducer ``model`` runs (the object itself: a learned one with its weights); raises
    TokenReduceError if the model is not patched."""
    return get_patch(model).reducer


def reapply(model: nn.Module, spec: str | Reducer | None = None, *, trace: bool | None = None,
            dense: bool | None = None) -> nn.Module:
    """Patch ``model`` again with what is given changed: ``spec`` (default: its reducer, the same
    object, so the same weights), ``trace``, ``dense`` (default: as they are). Raises TokenReduceError
    if the model is not patched. Returns the model."""
    patch = get_patch(model)
    return apply(model, patch.reducer if spec is None else spec,
                 trace=patch.trace if trace is None else trace, dense=patch.dense if dense is None else dense)


@contextmanager
def patched(model: nn.Module, spec: str | Reducer | None, *, trace: bool = False,
            dense: bool = False) -> Iterator[nn.Module]:
    """``with patched(model, spec):`` runs the block on ``model`` patched with ``spec`` (None: the
    unpatched model) and always puts the model back as it was, on success or error: unpatched, or
    with the patch it had before (the same reducer and options)."""
    before = getattr(model, ATTR, None)
    if spec is not None:
        apply(model, spec, trace=trace, dense=dense)
    elif before is not None:
        remove(model)
    try:
        yield model
    finally:
        if is_patched(model):
            remove(model)
        if before is not None:
            apply(model, before.reducer, trace=before.trace, dense=before.dense)


@contextmanager
def capture(model: nn.Module) -> Iterator[Capture]:
    """``with capture(model) as seen: y = model(x)``: ``seen.last`` is the record of the latest forward
    inside the block with its tensors live (a learned reducer's auxiliary losses and predictions keep
    their autograd graph, for the task's loss), None for an unpatched model. Only ``seen`` holds them:
    the model keeps the detached record (:func:`info`)."""
    seen = Capture()
    patch = getattr(model, ATTR, None)
    if patch is None:
        yield seen
        return
    patch.captures.append(seen)
    try:
        yield seen
    finally:
        patch.captures.remove(seen)


@dataclass(frozen=True)
class Info:
    """What a patched model is set to do, and what its last forward did.

    Every tensor is detached (the model keeps no autograd graph between calls): a loss on a learned
    reducer's auxiliary outputs reads them live from ``capture``.

    Attributes:
        spec: canonical spec string of the applied method.
        host: what the method knows about the model (depth, prefix tokens, patch grid, ...), at the
            patch grid of the last forward's input (the model's own before any forward).
        schedule: the compiled schedule (non-prefix tokens after each block) at that grid.
        tokens_per_block: total tokens (prefix included) leaving each block in the last forward,
            or the compiled counts before any forward.
        sizes: (B, N) patches each final token stands for (last forward), or None.
        index: (B, N) original sequence position of each final token (last forward), or None.
        snapshots: block -> (B, N_block, N0) membership map after that block's reduction;
            only with ``apply(..., trace=True)``.
        aux_losses: named auxiliary losses emitted by a learned reducer in the last forward.
        keep_mask: (B, N) keep policy of the final tokens in the last forward, aligned with
            ``index`` (prefix entries 1), when a learned pruner trained with a soft policy instead
            of dropping tokens (DynamicViT in training); None when every final token is kept.
        aux_outputs: named auxiliary predictions (B, Q, K) a learned reducer emitted in the last
            training forward, for the task to score with its own criterion (``TokenState.aux_outputs``).
        trace, dense: the options the model was patched with (``apply``).
    """

    spec: str
    host: Host
    schedule: Schedule
    tokens_per_block: list[int]
    sizes: Tensor | None
    index: Tensor | None
    snapshots: dict[int, Tensor]
    aux_losses: dict[str, Tensor]
    keep_mask: Tensor | None = None
    aux_outputs: dict[str, Tensor] = field(default_factory=dict)
    trace: bool = False
    dense: bool = False


def _sizes(last: Forward | None) -> Tensor | None:
    """(B, N) patches each final token holds: ones where the forward merged nothing (made here, on
    request, so that an inference forward pays nothing for its record)."""
    if last is None:
        return None
    return last.sizes if last.sizes is not None else torch.ones_like(last.index, dtype=torch.float)


def _own(t: Tensor | None) -> Tensor | None:
    """A copy of a record's tensor: under CUDA graphs (``torch.compile(mode="reduce-overhead")``) the
    forward's outputs live in the graph's memory pool, which the next replay overwrites; an Info read
    after its forward holds copies, so a later call cannot change it."""
    return None if t is None else t.clone()


def info(model: nn.Module) -> Info:
    """Schedule, options and last-forward record of a patched model (``tokenreduce.get_info``), its
    tensors copies of the record's (:func:`_own`); raises TokenReduceError if the model is not patched."""
    patch = get_patch(model)
    last: Forward | None = patch.last
    compiled = patch.schedule.tokens_per_block(patch.host.num_prefix)
    if last is None:
        return Info(spec=patch.reducer.spec(), host=patch.host, schedule=patch.schedule, tokens_per_block=compiled,
                    sizes=None, index=None, snapshots={}, aux_losses={}, keep_mask=None, aux_outputs={},
                    trace=patch.trace, dense=patch.dense)
    return Info(
        spec=patch.reducer.spec(), host=patch.host, schedule=patch.schedule,
        tokens_per_block=list(last.tokens_per_block), sizes=_own(_sizes(last)), index=_own(last.index),
        snapshots={k: _own(v) for k, v in last.snapshots.items()},
        aux_losses={k: _own(v) for k, v in last.aux_losses.items()}, keep_mask=_own(last.keep_mask),
        aux_outputs={k: _own(v) for k, v in last.aux_outputs.items()}, trace=patch.trace, dense=patch.dense,
    )


def find_info(model: nn.Module) -> Info | None:
    """``info(model)``, or None for a model tokenreduce has not patched."""
    return info(model) if is_patched(model) else None


__all__ = ["HOSTS", "Capture", "Feed", "Info", "adapter", "apply", "capture", "check_host", "feed", "find_info",
           "info", "is_patched", "parts", "patched", "reapply", "reducer_of", "remove"]

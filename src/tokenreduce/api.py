"""The public API: apply / remove a method, list methods, read what the last forward did."""

from __future__ import annotations

from contextlib import AbstractContextManager

from torch import nn

from .adapters import hosts
from .adapters.hosts import Capture, Info
from .core.method import Reducer

__all__ = ["Capture", "Info", "apply", "capture", "find_info", "get_info", "is_patched", "patched", "reapply",
           "reducer_of", "remove"]


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch a timm VisionTransformer or a transformers ViT, DeiT, DINOv2 or CLIP vision model in
    place to run ``spec``, e.g. ``'tome(r=13)'``; the adapter is chosen by the model (adapters/hosts.py).

    Reversible with :func:`remove`; state_dict keys stay the host's (a learned reducer adds
    its own under ``tokenreduce.``). Returns the model.

    Args:
        trace: record which original patches each token holds after every reduction
            (``get_info(model).snapshots``), for visualisation.
        dense: ``model.forward_features(x)`` returns (B, p + N0, C), one token per original
            position in the original order (pruned tokens restored, merged tokens copied to every
            position they stand for), for dense tasks; ``model(x)`` pools those tokens as timm does.
            On a transformers model the base model's ``last_hidden_state`` holds them.
    """
    return hosts.apply(model, spec, trace=trace, dense=dense)


def remove(model: nn.Module) -> nn.Module:
    """Restore the unpatched model."""
    return hosts.remove(model)


def is_patched(model: nn.Module) -> bool:
    """Whether ``model`` is patched by tokenreduce."""
    return hosts.is_patched(model)


def reducer_of(model: nn.Module) -> Reducer:
    """The reducer a patched model runs (the object itself: a trained one with its weights); its
    compiled schedule is ``get_info(model).schedule``. Raises TokenReduceError if not patched."""
    return hosts.reducer_of(model)


def patched(model: nn.Module, spec: str | Reducer | None, *, trace: bool = False,
            dense: bool = False) -> AbstractContextManager[nn.Module]:
    """``with patched(model, spec): ...`` runs the block with ``spec`` applied (None: unpatched) and
    always puts the model back as it was (unpatched, or with its previous patch), even on error."""
    return hosts.patched(model, spec, trace=trace, dense=dense)


def reapply(model: nn.Module, spec: str | Reducer | None = None, *, trace: bool | None = None,
            dense: bool | None = None) -> nn.Module:
    """Patch a patched model again with what is given changed (``spec``, ``trace``, ``dense``); what
    is not given stays, the reducer the same object (its weights). E.g. ``reapply(model, dense=True)``."""
    return hosts.reapply(model, spec, trace=trace, dense=dense)


def get_info(model: nn.Module) -> Info:
    """Schedule, options and last-forward record of a patched model, every tensor detached (the
    model keeps no autograd graph between calls; a training loss reads the live one: :func:`capture`)."""
    return hosts.info(model)


def find_info(model: nn.Module) -> Info | None:
    """``get_info(model)``, or None for a model tokenreduce has not patched."""
    return hosts.find_info(model)


def capture(model: nn.Module) -> AbstractContextManager[Capture]:
    """``with capture(model) as seen: y = model(x)``: ``seen.last`` is the latest forward's record
    inside the block with live tensors (auxiliary losses and predictions keep their graph, for a
    loss), None for an unpatched model. Nothing live stays on the model after the block."""
    return hosts.capture(model)

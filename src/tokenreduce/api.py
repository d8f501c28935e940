"""The public API: apply / remove a method, list methods, read what the last forward did."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .adapters import hosts
from .core.errors import TokenReduceError
from .core.method import Host, Reducer
from .core.schedule import Schedule


@dataclass(frozen=True)
class Info:
    """What a patched model is set to do, and what its last forward did.

    Attributes:
        spec: canonical spec string of the applied method.
        schedule: the compiled schedule (non-prefix tokens after each block).
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
            Not detached: a token-distillation loss that only weights tokens by it should detach it.
        aux_outputs: named auxiliary predictions (B, Q, K) a learned reducer emitted in the last
            training forward, for the task to score with its own criterion (``TokenState.aux_outputs``).
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


def get_info(model: nn.Module) -> Info:
    """Schedule and last-forward record of a patched model."""
    patch = hosts.get_patch(model)
    last = patch.last
    counts = patch.schedule.tokens_per_block(patch.host.num_prefix)
    return Info(
        spec=patch.reducer.spec(),
        host=patch.host,
        schedule=patch.schedule,
        tokens_per_block=list(last.tokens_per_block) if last else counts,
        sizes=_sizes(last),
        index=last.index if last else None,
        snapshots=dict(last.snapshots) if last else {},
        aux_losses=dict(last.aux_losses) if last else {},
        keep_mask=last.keep_mask if last else None,
        aux_outputs=dict(last.aux_outputs) if last else {},
    )


def find_info(model: nn.Module) -> Info | None:
    """``get_info(model)``, or None for a model tokenreduce has not patched."""
    try:
        return get_info(model)
    except TokenReduceError:
        return None


def _sizes(last) -> Tensor | None:
    if last is None:
        return None
    return last.size if last.size is not None else torch.ones_like(last.index, dtype=torch.float)

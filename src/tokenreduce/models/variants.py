"""Checkpoint variants: the same trained network rebuilt as another architecture, its weights carried over.

:func:`without_class_token` turns a timm ViT checkpoint with a class token into the same network without it,
pooled instead: timm kwargs ``class_token=False, global_pool='avg', fc_norm=False``, so the final ``norm`` keeps
its weights and the head (its weights kept too) reads the mean of the normed patch tokens,

    logits = head(mean_i norm(x_L)_i),    x_0 = patches + pos_embed[1:]       (i over the N patches)

where the class-token model reads ``head(norm(x_L)_cls)``. ``cls_token`` is dropped, and row 0 of ``pos_embed``
(the class token's). The result is a starting point to fine-tune (the class token's row is what the head was
trained on; the pooled patches are not), not a network of the same accuracy.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import Tensor

from .build import build_model, model_config
from .checkpoint import Checkpoint, CheckpointError, load_weights, read_checkpoint, save_checkpoint

#: the timm kwargs that make a class-token ViT class-token free with a pooled head (module docstring)
FREE_KWARGS = {"class_token": False, "global_pool": "avg", "fc_norm": False}


def free_weights(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A class-token ViT's state dict without its class token: ``cls_token`` dropped, ``pos_embed`` without row 0."""
    if "cls_token" not in weights or "pos_embed" not in weights:
        raise CheckpointError("not a timm ViT with a class token: its weights hold no 'cls_token' and 'pos_embed' "
                              f"(keys: {', '.join(sorted(weights)[:5])}, ...)")
    out = {k: v for k, v in weights.items() if k != "cls_token"}
    out["pos_embed"] = weights["pos_embed"][:, 1:].clone()
    return out


def without_class_token(source: str | os.PathLike | Checkpoint, out: str | os.PathLike) -> Path:
    """Write ``source`` (a class-token timm ViT checkpoint, no reducer) as the same network without the class
    token and with an average-pooled head (module docstring) to ``out`` (``*.safetensors``); returns ``out``.

    The new checkpoint's meta keeps the source's data and classes and names the source in ``converted_from``.
    """
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source)
    if ckpt.meta.get("spec"):
        raise CheckpointError(f"{ckpt.path} carries the reducer {ckpt.meta['spec']!r}; convert its unreduced model")
    config = ckpt.meta.get("model") or {}
    kwargs = config.get("kwargs") or {}
    if kwargs.get("class_token") is False:
        raise CheckpointError(f"{ckpt.path} has no class token already (class_token=False)")
    free = model_config({**config, "kwargs": {**kwargs, **FREE_KWARGS}})
    model = build_model(free)
    load_weights(model, Checkpoint(ckpt.path, ckpt.meta, free_weights(ckpt.weights), {}, ckpt.header))
    meta: dict[str, Any] = {
        "model": free, "spec": None, "task": ckpt.meta.get("task"), "epoch": 0, "step": 0,
        "data": ckpt.meta.get("data"), "classes": ckpt.meta.get("classes"),
        "converted_from": {"checkpoint": ckpt.path.name, "sha256": ckpt.header.get("sha256"),
                           "change": "class token dropped, pos_embed row 0 dropped, head on the mean of the normed "
                                     "tokens (" + ", ".join(f"{k}={v!r}" for k, v in FREE_KWARGS.items()) + ")"},
    }
    save_checkpoint(out, model, meta=meta)
    return Path(out)


__all__ = ["FREE_KWARGS", "free_weights", "without_class_token"]

"""Build, load and unwrap models: the one place that turns a model config into a module.

A model config (``meta['model']`` in every checkpoint) is a JSON dict:

    {'name': timm model name, 'kwargs': {create_model kwargs}, 'pretrained'?: bool,
     'stem'?: stem spec (default 'patch'), 'transforms'?: [transform spec, ...] (default none)}

``build_model`` creates the timm model, installs the stem (models/stems.py), then applies the
transforms in order (models/transforms.py). :func:`model_config` writes the stem and transforms
canonically (every parameter spelled out) and leaves them out at their defaults, so a plain
model's config is exactly what it was before stems existed: old checkpoints, caches keyed by the
config and comparisons between configs keep working.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.errors import TokenReduceError
from .checkpoint import CheckpointError, load_weights, read_checkpoint, unwrap
from .stems import build_stem, canonical_stem
from .transforms import apply_transform, canonical_transform

__all__ = ["build_model", "load_model", "model_config", "unwrap"]

DEFAULT_STEM = "patch"


def _checked(config: Any) -> tuple[dict[str, Any], str, list[str]]:
    """(kwargs, stem spec, transform specs) of a model config, its shape checked."""
    if not isinstance(config, dict) or not isinstance(config.get("name"), str):
        raise CheckpointError(f"model config must be {{'name': str, 'kwargs': dict}}, got {config!r}")
    kwargs = config.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"model config 'kwargs' must be a dict, got {kwargs!r}")
    stem = config.get("stem", DEFAULT_STEM)
    transforms = config.get("transforms", [])
    if not isinstance(stem, str):
        raise TokenReduceError(f"model config 'stem' must be a spec string like 'conv', got {stem!r}")
    if isinstance(transforms, str) or not all(isinstance(t, str) for t in transforms):
        raise TokenReduceError(f"model config 'transforms' must be a list of spec strings like ['tie_qk'], "
                               f"got {transforms!r}")
    return kwargs, stem, list(transforms)


def model_config(model_cfg: dict[str, Any], stem: str | None = None,
                 transforms: Sequence[str] | None = None) -> dict[str, Any]:
    """The canonical model config: ``model_cfg`` with ``stem`` / ``transforms`` set when given.

    Stem and transforms are written in canonical form (``'conv'`` -> ``"conv(norm='bn')"``); the
    default stem and an empty transform list are left out. Other keys are kept as they are.
    Raises SpecError for an unknown stem or transform (naming the valid ones).
    """
    cfg = json.loads(json.dumps(model_cfg))
    if stem is not None:
        cfg["stem"] = stem
    if transforms is not None:
        cfg["transforms"] = list(transforms)
    _, stem_spec, transform_specs = _checked(cfg)
    cfg.pop("stem", None)
    cfg.pop("transforms", None)
    stem_spec = canonical_stem(stem_spec)
    if stem_spec != canonical_stem(DEFAULT_STEM):
        cfg["stem"] = stem_spec
    if transform_specs:
        cfg["transforms"] = [canonical_transform(t) for t in transform_specs]
    return cfg


def build_model(config: dict[str, Any]) -> nn.Module:
    """A timm model from a model config, with its stem and transforms (see the module docstring).

    ``config.get('pretrained')`` (default False) asks timm for pretrained weights (network); a
    stem other than 'patch' is freshly initialised on top of them.
    """
    kwargs, stem, transforms = _checked(config)
    import timm

    try:
        model = timm.create_model(config["name"], pretrained=bool(config.get("pretrained", False)), **kwargs)
    except (RuntimeError, TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot build timm model {config['name']!r} with {kwargs}: {e}") from e
    build_stem(stem, model)
    for t in transforms:
        apply_transform(t, model)
    return model


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model a checkpoint was saved from: ``build_model(meta['model'])`` (timm model,
    stem, transforms), the reducer from ``meta['spec']`` (``tokenreduce.apply``), the weights
    loaded strictly (the task's ``task.*`` tensors are not the model's and are left out).

    Returns ``(model in eval mode on device, meta)``. Raises CheckpointError, never returns a
    half-loaded model.
    """
    from ..api import apply

    ckpt = read_checkpoint(path)
    try:
        model = build_model(ckpt.meta.get("model"))
    except CheckpointError:
        raise
    except TokenReduceError as e:
        raise CheckpointError(f"{ckpt.path}: cannot rebuild its model {ckpt.meta.get('model')}: {e}") from e
    if ckpt.meta.get("spec"):
        try:
            apply(model, ckpt.meta["spec"])
        except TokenReduceError as e:
            raise CheckpointError(f"{ckpt.path}: cannot apply its spec {ckpt.meta['spec']!r}: {e}") from e
    load_weights(model, ckpt)
    return model.to(device).eval(), ckpt.meta

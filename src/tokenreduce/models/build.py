"""Build, load and unwrap models: the one place that turns a description of a model into a module.

Every command, the training loop and the studies get their model from :func:`make_model`, given a
:class:`ModelSource`: a timm model config, a tokenreduce checkpoint (a path, or one read already:
a run reads each file once), or a transformers config (``models/hf.py``); optionally a local
weights file loaded strictly on top and a reducer spec (the checkpoint's own by default, None for
the unpatched model). :func:`build_model` (a model config) and :func:`load_model` (a checkpoint)
are its two common cases.

A model config (``meta['model']`` in every checkpoint) is a JSON dict:

    {'name': timm model name, 'kwargs': {create_model kwargs}, 'pretrained'?: bool,
     'stem'?: stem spec (default 'patch'), 'transforms'?: [transform spec, ...] (default none)}

The timm model is created, the stem installed (models/stems.py), then the transforms applied in
order (models/transforms.py). :func:`model_config` writes the stem and transforms canonically
(every parameter spelled out) and leaves them out at their defaults, so a plain model's config is
exactly what it was before stems existed: old checkpoints, caches keyed by the config and
comparisons between configs keep working.
"""

from __future__ import annotations

import difflib
import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..api import apply, get_info, remove
from ..core.errors import TokenReduceError
from ..core.method import build_reducer
from .checkpoint import Checkpoint, CheckpointError, load_weights, read_checkpoint, unwrap
from .hf import build_hf_model
from .stems import build_stem, canonical_stem
from .transforms import apply_transform, canonical_transform

__all__ = ["KEEP", "BuiltModel", "ModelSource", "changes_on_top", "build_model", "load_model", "load_weights_file",
           "make_model", "model_config", "unwrap"]

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


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


#: ``ModelSource.spec``'s default: the checkpoint's own reducer (none without a checkpoint).
KEEP: Any = _Keep()
#: A learned reducer's own keys in a patched model's state_dict: they change neither the token
#: counts nor the speed, so a state_dict saved from a patched model loads into the plain one.
REDUCER_PREFIX = "tokenreduce."


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from (one of ``config``, ``checkpoint``, ``hf_config``) and what goes on top.

    Attributes:
        config: a model config (module docstring): a timm model by name, its kwargs, timm's
            pretrained weights (network), stem and transforms. With ``checkpoint`` it must describe
            the checkpoint's model, or that model with another stem (installed with fresh weights
            in place of the checkpoint's; every other weight is the checkpoint's) and/or transforms
            added, which are applied on top of the checkpoint's weights (a transform starts from
            them, e.g. tie_qk's init).
        checkpoint: a tokenreduce checkpoint: a file, a training output directory, or a
            :class:`Checkpoint` already read (a run that needs one file twice reads it once).
        hf_config: a transformers model of a config folder or built-in config (``models/hf.py``),
            at ``img_size`` if given, with its folder's weights if ``pretrained``.
        weights: a local state_dict (.safetensors, .pth, .pt) loaded strictly (:func:`load_weights_file`).
        spec: the reducer the model carries: :data:`KEEP` the checkpoint's own, None none (a
            checkpoint's is removed: its unpatched model), a spec string that one (replacing the
            checkpoint's when it differs).
    """

    config: dict[str, Any] | None = None
    checkpoint: str | os.PathLike | Checkpoint | None = None
    hf_config: str | None = None
    img_size: int | None = None
    pretrained: bool = False
    weights: str | os.PathLike | None = None
    spec: Any = field(default=KEEP)


@dataclass
class BuiltModel:
    """A model :func:`make_model` built: the module (eval mode, on its device), its canonical model
    config (None for a transformers model, which has none), the canonical spec of the reducer it
    carries (or None) and its checkpoint's metadata ({} without a checkpoint)."""

    model: nn.Module
    config: dict[str, Any] | None
    spec: str | None
    meta: dict[str, Any]


def make_model(source: ModelSource, device: str | torch.device = "cpu") -> BuiltModel:
    """The model ``source`` describes (see :class:`ModelSource`), in eval mode on ``device``.

    Raises the project's errors for what the user gave (an unknown timm name, with the closest
    ones; missing pretrained weights; a checkpoint that does not rebuild: CheckpointError), never
    returns a half-loaded model.
    """
    if source.hf_config is not None and (source.config is not None or source.checkpoint is not None):
        raise TokenReduceError("a model comes from a transformers config or from a timm model config / tokenreduce "
                               "checkpoint, not both")
    if (source.config, source.checkpoint, source.hf_config) == (None, None, None):
        raise TokenReduceError("no model: give a timm model config, a tokenreduce checkpoint or a transformers config")
    meta: dict[str, Any] = {}
    if source.checkpoint is not None:
        model, config, meta = _from_checkpoint(source.checkpoint, source.config)
    elif source.hf_config is not None:
        model, config = build_hf_model(source.hf_config, img_size=source.img_size, pretrained=source.pretrained), None
    else:
        model, config = build_model(source.config), source.config
    if source.weights is not None:
        load_weights_file(model, source.weights)
    current = meta.get("spec") or None
    wanted = current if source.spec is KEEP else source.spec
    if current is not None and (wanted is None or _canonical(wanted) != _canonical(current)):
        remove(model)
        current = None
    if wanted is not None and current is None:
        apply(model, wanted)
    spec = get_info(model).spec if wanted is not None else None
    return BuiltModel(model.to(device).eval(), model_config(config) if config is not None else None, spec, meta)


def build_model(config: dict[str, Any]) -> nn.Module:
    """:func:`make_model`'s timm step: the model of a model config with its stem and transforms, in
    training mode as timm creates it (see the module docstring).

    ``config.get('pretrained')`` (default False) asks timm for pretrained weights (network); a
    stem other than 'patch' is freshly initialised on top of them. An unknown name fails with the
    closest known ones.
    """
    kwargs, stem, transforms = _checked(config)

    name, pretrained = config["name"], bool(config.get("pretrained", False))
    if not timm.is_model(name):
        close = timm.list_models(f"*{name}*")[:5] or difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; close names: {', '.join(close)}" if close else "; see timm.list_models('*vit*')"
        raise TokenReduceError(f"cannot build timm model {name!r}: unknown timm model{hint}")
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    # the hub's errors (OSError: offline, not found, gated) and timm's RuntimeError for missing weights
    except (OSError, RuntimeError) as e:
        if not pretrained:
            raise CheckpointError(f"cannot build timm model {name!r} with {kwargs}: {e}") from e
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenReduceError(f"could not get pretrained weights for {name} ({type(e).__name__}: {first}); give a "
                               "local weights file instead, or leave out --pretrained for random weights") from None
    # kwargs the model does not take or cannot build with
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"cannot build timm model {name!r} with {kwargs}: {e}") from e
    _check_whole_patches(model, name)
    build_stem(stem, model)
    for t in transforms:
        apply_transform(t, model)
    return model


def _check_whole_patches(model: nn.Module, name: str) -> None:
    """Refuse a timm model whose input size is not a whole number of its patches, at least one per side: timm
    builds it (its grid floors the size), then its patch embedding refuses every input of that size (with
    ``dynamic_img_size`` too). One that pads its input to whole patches (``dynamic_img_pad``) passes."""
    pe = getattr(model, "patch_embed", None)
    if getattr(pe, "dynamic_img_pad", False) or getattr(pe, "img_size", None) is None \
            or getattr(pe, "patch_size", None) is None:
        return
    (h, w), (ph, pw) = pe.img_size, pe.patch_size
    if h < ph or w < pw or h % ph or w % pw:
        sizes = sorted({max(1, h // ph) * ph, max(1, -(-h // ph)) * ph})
        raise TokenReduceError(f"timm model {name!r} cannot take {h}x{w} images: its patches are {ph}x{pw}, so the "
                               f"input size (--img-size) must be a multiple of {ph}, from {ph} up (nearest: "
                               f"{' or '.join(map(str, sizes))})")


def load_model(path: str | os.PathLike | Checkpoint,
               device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The model a checkpoint was saved from (:func:`make_model` of the checkpoint): its timm model,
    stem, transforms, the reducer of ``meta['spec']`` and the weights loaded strictly (the task's
    ``task.*`` tensors are not the model's and are left out).

    Returns ``(model in eval mode on device, meta)``. Raises CheckpointError, never returns a
    half-loaded model.
    """
    built = make_model(ModelSource(checkpoint=path), device)
    return built.model, built.meta


def changes_on_top(base: dict[str, Any], requested: dict[str, Any]) -> tuple[str | None, list[str]] | None:
    """What the model config ``requested`` changes on top of ``base`` when it is otherwise the same model
    (``--init CKPT --stem S --transform T``): ``(stem, transforms)``, the canonical stem it installs
    instead of base's (None: the same stem) and the transforms it adds after base's; None when it is
    another model (other kwargs, or transforms that do not extend base's)."""
    have, want = model_config(base), model_config(requested)
    old, new = have.pop("transforms", []), want.pop("transforms", [])
    old_stem = have.pop("stem", canonical_stem(DEFAULT_STEM))
    new_stem = want.pop("stem", canonical_stem(DEFAULT_STEM))
    if have != want or new[:len(old)] != old:
        return None
    return (new_stem if new_stem != old_stem else None), new[len(old):]


def _canonical(spec: str) -> str:
    return build_reducer(spec).spec()


def _from_checkpoint(source: str | os.PathLike | Checkpoint,
                     requested: dict[str, Any] | None) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """(model with its spec and weights, its model config, meta) of a checkpoint; ``requested`` may swap
    the stem and add transforms on top (:class:`ModelSource`)."""
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source)
    config = ckpt.meta.get("model")
    try:
        model = build_model(config)
    except CheckpointError:
        raise
    except TokenReduceError as e:
        raise CheckpointError(f"{ckpt.path}: cannot rebuild its model {config}: {e}") from e
    if ckpt.meta.get("spec"):
        try:
            apply(model, ckpt.meta["spec"])
        except TokenReduceError as e:
            raise CheckpointError(f"{ckpt.path}: cannot apply its spec {ckpt.meta['spec']!r}: {e}") from e
    load_weights(model, ckpt)
    if requested is not None and model_config(requested) != model_config(config):
        on_top = changes_on_top(config, requested)
        if on_top is None:
            raise TokenReduceError(f"--init {ckpt.path} holds model {config}, which differs from the model "
                                   f"requested {requested}; drop one of them")
        stem, extra = on_top
        if stem is not None:
            build_stem(stem, model)  # a fresh stem in place of the checkpoint's; every other weight kept
        for t in extra:
            apply_transform(t, model)
        config = requested
    return model, config, ckpt.meta


def load_weights_file(model: nn.Module, path: str | os.PathLike) -> None:
    """Load a local state_dict (``.safetensors``, ``.pth``, ``.pt``) into ``model``; every key and
    shape must match (:func:`load_weights`).

    Accepts a bare state_dict or one under 'state_dict' / 'model', with or without a 'module.'
    (DDP) prefix; a learned reducer's own keys (``tokenreduce.*``) are skipped.
    """
    file = Path(path)
    if not file.is_file():
        raise TokenReduceError(f"checkpoint {path} does not exist")
    try:
        if file.suffix == ".safetensors":
            sd = load_file(str(file))
        else:
            sd = torch.load(file, map_location="cpu", weights_only=True)
    # a corrupt or truncated file, pickled objects weights_only refuses, another format
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError, SafetensorError) as e:
        raise TokenReduceError(f"could not read checkpoint {path}: {type(e).__name__}: {e}") from None
    for key in ("state_dict", "model"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise TokenReduceError(f"checkpoint {path} holds a {type(sd).__name__}, not a state_dict")
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    load_weights(unwrap(model), Checkpoint(file, {}, sd, {}, {}), prefix_ignore=(REDUCER_PREFIX,))

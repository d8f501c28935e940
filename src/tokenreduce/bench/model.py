"""The model a benchmark measures: a timm model by name (``models.build_model``) or a transformers
one by config (``models.hf``), with random or pretrained weights, or with a local state_dict loaded
strictly (``models.load_weights``)."""

from __future__ import annotations

import difflib
import pickle
from pathlib import Path

from torch import nn

from ..core.errors import TokenReduceError

#: A learned reducer's own keys in a patched model's state_dict: they change neither the token
#: counts nor the speed, so a state_dict saved from a patched model loads into the plain one.
REDUCER_PREFIX = "tokenreduce."


def create_model(name: str, *, img_size: int | None = None, pretrained: bool = False,
                 checkpoint: str | None = None) -> nn.Module:
    """A timm model by name in eval mode, random weights unless ``pretrained`` or a ``checkpoint``
    (:func:`load_state_dict_file`) is given. An unknown name fails with the closest known ones."""
    import timm

    from ..models import build_model

    if not timm.is_model(name):
        close = timm.list_models(f"*{name}*")[:5] or difflib.get_close_matches(name, timm.list_models(), n=5)
        hint = f"; close names: {', '.join(close)}" if close else "; see timm.list_models('*vit*')"
        raise TokenReduceError(f"unknown timm model {name!r}{hint}")
    config = {"name": name, "kwargs": {} if img_size is None else {"img_size": img_size}, "pretrained": pretrained}
    try:
        model = build_model(config)
    # what the user's name and network cause: build_model's own error for a model timm cannot build, the hub's
    # (OSError: offline, not found, gated) and timm's RuntimeError for missing pretrained weights; a bug of
    # ours raises anything else, with its traceback
    except (TokenReduceError, OSError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if pretrained:
            raise TokenReduceError(
                f"could not get pretrained weights for {name} ({type(e).__name__}: {first}); "
                "use --checkpoint PATH with a local file, or leave out --pretrained for random weights"
            ) from None
        raise TokenReduceError(f"could not create {name}: {type(e).__name__}: {first}") from None
    if checkpoint:
        load_state_dict_file(model, checkpoint)
    return model.eval()


def create_hf_model(source: str, *, img_size: int | None = None, pretrained: bool = False,
                    checkpoint: str | None = None) -> nn.Module:
    """A transformers model of a config folder or built-in config name (``models.hf.build_hf_model``)
    in eval mode, random weights unless ``pretrained`` (the folder's) or a ``checkpoint``."""
    from ..models.hf import build_hf_model

    model = build_hf_model(source, img_size=img_size, pretrained=pretrained)
    if checkpoint:
        load_state_dict_file(model, checkpoint)
    return model.eval()


def load_state_dict_file(model: nn.Module, path: str) -> None:
    """Load a local state_dict (``.safetensors``, ``.pth``, ``.pt``) into ``model``; every key and
    shape must match (``models.load_weights``).

    Accepts a bare state_dict or one under 'state_dict' / 'model', with or without a 'module.'
    (DDP) prefix; a learned reducer's own keys (``tokenreduce.*``) are skipped.
    """
    import torch

    from ..models import Checkpoint, load_weights

    file = Path(path)
    if not file.is_file():
        raise TokenReduceError(f"checkpoint {path} does not exist")
    from safetensors import SafetensorError

    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

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
    load_weights(model, Checkpoint(file, {}, sd, {}, {}), prefix_ignore=(REDUCER_PREFIX,))

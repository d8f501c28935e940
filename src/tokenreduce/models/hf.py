"""transformers vision encoders by config, for the commands that take ``--hf-config``.

A source is a local folder holding ``config.json`` (as ``save_pretrained`` writes it, and its
weights if ``pretrained``) or the name of a built-in config (:data:`BUILTIN`: tiny ones for smoke
runs and one of DeiT-S's size for timing). Nothing is fetched from the hub. The model class built
for a config is the first one it names in ``architectures`` that the adapter drives (a config that
names only others is refused, naming the classes driven), else :data:`MODEL_CLASSES` by
``model_type``. transformers is optional: without it this fails naming the extra that installs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..adapters.hf_vit import FAMILIES, WRAPPERS, require_transformers
from ..core.errors import TokenReduceError

_TINY = dict(image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=2)

#: built-in configs: name -> (transformers config class, its fields)
BUILTIN: dict[str, tuple[str, dict[str, Any]]] = {
    "vit-tiny": ("ViTConfig", {**_TINY, "intermediate_size": 256, "num_labels": 10}),
    "deit-tiny": ("DeiTConfig", {**_TINY, "intermediate_size": 256, "num_labels": 10}),
    "dinov2-tiny": ("Dinov2Config", {**_TINY, "mlp_ratio": 4, "num_labels": 10}),
    "clip-tiny": ("CLIPVisionConfig", {**_TINY, "intermediate_size": 256}),
    # SigLIP 2's tower takes patchified images of any grid; num_patches is its position-embedding grid (8x8)
    "siglip2-tiny": ("Siglip2VisionConfig", {**{k: v for k, v in _TINY.items() if k != "image_size"},
                                             "num_patches": 64, "intermediate_size": 256}),
    # timm's deit_small_patch16_224 / vit_small_patch16_224 in transformers' ViT: 12 layers, width 384,
    # 6 heads, 224 px, patch 16, exact GELU, LayerNorm eps 1e-6 (transformers' default is 1e-12)
    "vit-small": ("ViTConfig", {"image_size": 224, "patch_size": 16, "hidden_size": 384, "num_hidden_layers": 12,
                                "num_attention_heads": 6, "intermediate_size": 1536, "layer_norm_eps": 1e-6,
                                "num_labels": 1000}),
}
#: config model_type -> the model class built for it
MODEL_CLASSES = {
    "vit": "ViTForImageClassification",
    "deit": "DeiTForImageClassificationWithTeacher",
    "dinov2": "Dinov2ForImageClassification",
    "dinov2_with_registers": "Dinov2WithRegistersForImageClassification",
    "clip_vision_model": "CLIPVisionModel",
    "clip": "CLIPForImageClassification",
    "siglip2_vision_model": "Siglip2VisionModel",
}


def _strict_errors() -> tuple[type[BaseException], ...]:
    """huggingface_hub's error for a config field of the wrong type (transformers 5 checks them), if it has one."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _config(source: str) -> tuple[Any, Path | None]:
    transformers = require_transformers()
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TokenReduceError(f"{source} holds no config.json (save_pretrained writes one)")
        try:
            return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True), path
        except (ValueError, KeyError, OSError, TypeError, *_strict_errors()) as e:  # a field of the wrong type too
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TokenReduceError(f"could not read {path / 'config.json'}: {first}") from None
    if source in BUILTIN:
        name, fields = BUILTIN[source]
        return getattr(transformers, name)(**fields), None
    raise TokenReduceError(f"--hf-config {source!r} is neither a folder holding config.json nor a built-in config; "
                           f"built-in: {', '.join(BUILTIN)}")


def build_hf_model(source: str, *, img_size: int | None = None, pretrained: bool = False) -> nn.Module:
    """The transformers model of ``source`` (module docstring) in eval mode, random weights unless
    ``pretrained`` (the folder's own weights)."""
    transformers = require_transformers()
    config, path = _config(source)
    architectures = getattr(config, "architectures", None) or []
    named = [a for a in architectures if a in FAMILIES or a in WRAPPERS]
    if architectures and not named:  # e.g. a masked-image-modelling head: not a model to build silently otherwise
        raise TokenReduceError(f"config architectures {', '.join(architectures)}: not a class tokenreduce drives; "
                               f"supported: {', '.join([*FAMILIES, *WRAPPERS])} (or leave architectures out: "
                               f"{config.model_type!r} builds {MODEL_CLASSES.get(config.model_type, 'nothing')})")
    cls_name = named[0] if named else MODEL_CLASSES.get(config.model_type)
    if cls_name is None:
        raise TokenReduceError(f"config model_type {config.model_type!r} is not one tokenreduce drives; "
                               f"supported: {', '.join(MODEL_CLASSES)}")
    if img_size is not None:
        vision = getattr(config, "vision_config", config)
        if not hasattr(vision, "image_size"):  # SigLIP 2: bench and inspect feed it the grid of num_patches
            raise TokenReduceError(f"--img-size: a {type(vision).__name__} has no image size (its grid is "
                                   "num_patches); leave --img-size out, or set num_patches in its config.json")
        vision.image_size = img_size
    cls = getattr(transformers, cls_name)
    if not pretrained:
        return cls(config).eval()
    if path is None:
        raise TokenReduceError(f"the built-in config {source!r} has no weights; give a folder saved with "
                               "save_pretrained, or leave out --pretrained")
    try:
        return cls.from_pretrained(str(path), config=config, local_files_only=True).eval()
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TokenReduceError(f"could not load weights from {path}: {first}") from None

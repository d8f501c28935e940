"""Image transforms, from a model's data config (timm's ``resolve_model_data_config``).

A :class:`DataConfig` says what the model eats: channels, size, normalisation, resize policy.
``data_config_from_model(model)`` reads it from a timm model (its pretrained_cfg, corrected to
the size and channels the model was actually built with), so a checkpoint evaluates with the
normalisation it was trained with.

Train-time augmentations draw from the global torch / python RNGs; the loaders make them
reproducible per sample (see ``data.sampler``), whatever the worker or process layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import create_transform, resolve_model_data_config
from torch import Tensor
from torchvision import transforms as T

from ..core.errors import TokenReduceError
from ..models import unwrap

Transform = Callable[[Any], Tensor]

#: Augmentation names; each dataset picks a default that suits it.
AUGMENTS = ("none", "crop_flip", "crop_flip_erase", "rrc_flip")


@dataclass(frozen=True)
class DataConfig:
    """What the model expects. img_size (H, W); mean/std have ``in_chans`` entries."""

    img_size: tuple[int, int]
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    crop_pct: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def make_data_config(
    img_size: int | tuple[int, int] | list[int], in_chans: int, mean: Any = None, std: Any = None,
    interpolation: str = "bilinear", crop_pct: float = 1.0,
) -> DataConfig:
    """A DataConfig, checked; mean/std default to 0.5 (timm's ViT default) and are fitted to
    ``in_chans`` (a 3-entry mean for a 1-channel model becomes its average)."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
    if len(size) != 2 or min(size) < 1:
        raise TokenReduceError(f"img_size must be a positive int or (H, W), got {img_size!r}")
    if in_chans not in (1, 3):
        raise TokenReduceError(f"in_chans must be 1 or 3, got {in_chans}")
    return DataConfig(size, in_chans, _fit(mean, in_chans, 0.5), _fit(std, in_chans, 0.5), interpolation,
                      float(crop_pct))


def _fit(values: Any, chans: int, default: float) -> tuple[float, ...]:
    if values is None:
        return (default,) * chans
    values = (float(values),) if isinstance(values, (int, float)) else tuple(float(v) for v in values)
    if len(values) == chans:
        return values
    if chans == 1:
        return (sum(values) / len(values),)
    if len(values) == 1:
        return values * chans
    raise TokenReduceError(f"normalisation has {len(values)} entries for a {chans}-channel model")


def data_config_from_model(model: torch.nn.Module) -> dict[str, Any]:
    """Keyword arguments for ``build_dataset`` from a timm model (size and channels as built)."""
    model = unwrap(model)
    cfg = resolve_model_data_config(model)
    in_chans, size = cfg["input_size"][0], cfg["input_size"][1:]
    pe = getattr(model, "patch_embed", None)
    if pe is not None:
        in_chans = pe.proj.in_channels  # a Conv2d, or a stem that exposes in_channels (models.stems)
        size = tuple(pe.img_size) if pe.img_size is not None else size
    return make_data_config(size, in_chans, cfg.get("mean"), cfg.get("std"), cfg.get("interpolation", "bilinear"),
                            cfg.get("crop_pct", 1.0)).to_dict()


# ----------------------------------------------------------------------------- tensor ops


def to_channels(x: Tensor, chans: int) -> Tensor:
    """(C, H, W) float image with ``chans`` channels (gray replicated, or RGB to luminance)."""
    if x.shape[0] == chans:
        return x
    if x.shape[0] == 1 and chans == 3:
        return x.expand(3, -1, -1)
    if x.shape[0] == 3 and chans == 1:
        return (0.299 * x[0] + 0.587 * x[1] + 0.114 * x[2])[None]
    raise TokenReduceError(f"cannot turn a {x.shape[0]}-channel image into {chans} channels")


def resize(x: Tensor, size: tuple[int, int], mode: str) -> Tensor:
    """(C, H, W) -> (C, *size)."""
    if tuple(x.shape[-2:]) == size:
        return x
    mode = mode if mode in ("bilinear", "bicubic", "nearest") else "bilinear"
    kw = {"antialias": True, "align_corners": False} if mode != "nearest" else {}
    return F.interpolate(x[None], size=size, mode=mode, **kw)[0]


def random_crop(x: Tensor, pad: int) -> Tensor:
    """Zero-pad by ``pad`` (background after normalisation is applied later, so 0 = black) and
    crop back to the input size at a random offset. x (C, H, W)."""
    if pad <= 0:
        return x
    H, W = x.shape[-2:]
    padded = F.pad(x, (pad, pad, pad, pad))
    i, j = torch.randint(0, 2 * pad + 1, (2,)).tolist()
    return padded[:, i : i + H, j : j + W]


def random_flip(x: Tensor, p: float = 0.5) -> Tensor:
    return x.flip(-1) if torch.rand(()) < p else x


def random_erase(x: Tensor, p: float = 0.25, area: tuple[float, float] = (0.02, 0.2)) -> Tensor:
    """Zero a random rectangle (on the normalised image, i.e. fill with the mean). x (C, H, W)."""
    if torch.rand(()) >= p:
        return x
    H, W = x.shape[-2:]
    a = float(torch.empty(()).uniform_(*area)) * H * W
    r = math.exp(float(torch.empty(()).uniform_(math.log(0.3), math.log(3.3))))
    h, w = min(H, max(1, round(math.sqrt(a * r)))), min(W, max(1, round(math.sqrt(a / r))))
    i, j = int(torch.randint(0, H - h + 1, ())), int(torch.randint(0, W - w + 1, ()))
    x = x.clone()
    x[:, i : i + h, j : j + w] = 0
    return x


class TensorTransform:
    """Image tensor (C, H, W), uint8 or float in [0, 1] -> normalised float (in_chans, H', W').

    For small centred images (Fashion-MNIST): resize straight to the model size (no crop_pct
    crop; the object already has a border), random crop with ``pad`` pixels of padding, flip,
    optional random erasing.
    """

    def __init__(self, cfg: DataConfig, augment: str = "none", pad: int = 2) -> None:
        if augment not in ("none", "crop_flip", "crop_flip_erase"):
            raise TokenReduceError(f"augment {augment!r} does not apply to tensor images; use none, crop_flip "
                                   "or crop_flip_erase")
        self.cfg, self.augment, self.pad = cfg, augment, pad
        self.mean = torch.tensor(cfg.mean).view(-1, 1, 1)
        self.std = torch.tensor(cfg.std).view(-1, 1, 1)

    def __call__(self, img: Tensor) -> Tensor:
        x = img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()
        if x.dim() == 2:
            x = x[None]
        x = resize(x, self.cfg.img_size, self.cfg.interpolation)
        if self.augment != "none":
            x = random_flip(random_crop(x, self.pad))
        x = (to_channels(x, self.cfg.in_chans) - self.mean) / self.std
        if self.augment == "crop_flip_erase":
            x = random_erase(x)
        return x.contiguous()

    def __repr__(self) -> str:
        return f"TensorTransform(size={self.cfg.img_size}, chans={self.cfg.in_chans}, augment={self.augment})"


def pil_transform(cfg: DataConfig, *, train: bool, augment: str = "rrc_flip") -> Transform:
    """PIL image -> normalised tensor, built by timm's ``create_transform`` (photos, ImageFolder).

    Eval: resize by ``crop_pct`` and centre crop. Train ``rrc_flip``: random-resized crop and
    flip (no colour jitter); ``crop_flip``: the eval resize plus padded crop and flip;
    ``none``: the eval transform.
    """
    if augment not in AUGMENTS:
        raise TokenReduceError(f"unknown augment {augment!r}; choose from {', '.join(AUGMENTS)}")
    c = cfg.in_chans
    common = dict(input_size=(c, *cfg.img_size), interpolation=cfg.interpolation, mean=(0.0,) * c, std=(1.0,) * c,
                  crop_pct=cfg.crop_pct)
    if train and augment == "rrc_flip":
        base = create_transform(**common, is_training=True, color_jitter=0.0, hflip=0.5)
    else:
        base = create_transform(**common, is_training=False)
    tail_aug = augment if train and augment != "rrc_flip" else "none"
    tail = TensorTransform(cfg, tail_aug, pad=max(1, cfg.img_size[0] // 14))
    return T.Compose([base, tail])

"""Fashion-MNIST mosaics: a dense (per-pixel) task on real images, for the ``segment`` task.

Item ``i`` of a split tiles four images of the same Fashion-MNIST split into one 2x2 image
(56x56 from 28x28 tiles; tiles in row-major order: top-left, top-right, bottom-left,
bottom-right). The four source images are ``perm[4i : 4i + 4]`` of a seeded permutation of the
split (``torch.randperm(len(split))`` with a ``torch.Generator`` seeded by ``seed``, default
:data:`SEED` = 0), so every run and every process sees the same mosaics and no source image
appears twice in one mosaic dataset. Length: ``len(split) // 4`` by default (15000 train, 2500
test), or ``size`` mosaics (at most that).

Per-pixel label (``mask``, long (56, 56)): the tile's class on its foreground pixels, the
background class elsewhere. Foreground is decided on the raw uint8 image, before any
normalisation: raw value ``> threshold`` with ``threshold`` = :data:`THRESHOLD` = 51, i.e.
``> 0.2`` of full scale (255). Background index = number of classes (10): the labels are
``0..9`` for the garments and ``10`` for background.

Transforms: the image is turned into the model's input by the data config (resize to the model
size with its interpolation, channels, mean/std normalisation; ``TensorTransform`` with no
augmentation); when the model size is not 56x56 the mask is resized with nearest-neighbour.
Training augmentation (``augment='crop_flip'``, the default for training; ``'none'`` switches it
off) is geometric only and applied jointly to image and mask, so labels stay exact: a random
crop of the zero-padded mosaic (``pad`` = 4 pixels = 1/14 of the side, as for the 28x28
classifier's 2; padded pixels are raw 0, hence background) and a horizontal flip with p = 0.5.
No photometric augmentation and no random erasing (the mask would no longer describe the pixels).
The random draws use torch's global RNG, so :class:`tokenreduce.data.Seeded` makes them per-item
reproducible.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from ..core.errors import TokenReduceError
from .build import build_dataset, register_dataset
from .fashion_mnist import DataError
from .transforms import DataConfig, TensorTransform, make_data_config

#: Seed of the permutation that picks each mosaic's four source images.
SEED = 0
#: Foreground iff the raw uint8 pixel value is > THRESHOLD (51 = 0.2 * 255).
THRESHOLD = 51
#: Joint (image and mask) augmentations of the mosaics.
MOSAIC_AUGMENTS = ("none", "crop_flip")
#: Names under which the Fashion-MNIST mosaics are registered with ``build_dataset``.
NAMES = ("fmnist_mosaic", "fashion_mnist_mosaic", "fashion-mnist-mosaic")


class Mosaic(Dataset):
    """2x2 mosaics of a grayscale classification dataset with per-pixel labels.

    ``base`` must expose ``images`` uint8 (N, h, w), ``targets`` long (N,) and ``classes``
    (Fashion-MNIST does). Items: ``(image float (C, H, W) normalised, mask long (H, W))`` with
    (H, W) = ``cfg.img_size``; mask values in ``0..len(classes)``, ``len(classes)`` = background.

    Attributes: ``classes`` (the base's names; background is not one of them), ``background``
    (its index), ``sources`` long (n, 4) source indices of each mosaic, ``tile_labels`` long (n, 4).
    """

    def __init__(self, base: Dataset, cfg: DataConfig, *, augment: str = "none", size: int | None = None,
                 seed: int = SEED, threshold: int = THRESHOLD) -> None:
        images, targets = getattr(base, "images", None), getattr(base, "targets", None)
        if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.dim() != 3 or targets is None:
            raise DataError(f"mosaics need a base dataset with uint8 images (N, h, w) and targets (Fashion-MNIST); "
                            f"got {type(base).__name__}")
        if augment not in MOSAIC_AUGMENTS:
            raise TokenReduceError(f"augment {augment!r} does not apply to mosaics (image and mask move together); "
                                   f"choose from {', '.join(MOSAIC_AUGMENTS)}")
        if not 0 <= threshold < 255:
            raise TokenReduceError(f"foreground threshold must be a raw uint8 value in 0..254, got {threshold}")
        most = len(images) // 4
        if most == 0:
            raise DataError(f"a mosaic needs 4 images; the base split holds {len(images)}")
        size = most if size is None else int(size)
        if not 1 <= size <= most:
            raise TokenReduceError(f"mosaic count must be in 1..{most} (len(split) // 4), got {size}")
        g = torch.Generator().manual_seed(seed)
        self.sources = torch.randperm(len(images), generator=g)[: 4 * size].view(size, 4)  # (n, 4)
        self.images, self.tile_labels = images, torch.as_tensor(targets)[self.sources]  # (n, 4)
        self.classes = list(base.classes)
        self.background = len(self.classes)
        self.cfg, self.augment, self.seed, self.threshold = cfg, augment, seed, threshold
        h, w = images.shape[1:]
        self.pad = max(1, 2 * h // 14)
        self.transform = TensorTransform(cfg, "none")

    def __len__(self) -> int:
        return len(self.sources)

    def raw(self, i: int) -> tuple[Tensor, Tensor]:
        """Mosaic ``i`` before augmentation and transforms: (uint8 (2h, 2w), mask long (2h, 2w))."""
        tiles = self.images[self.sources[i]]  # (4, h, w)
        labels = self.tile_labels[i].view(4, 1, 1).expand_as(tiles)
        masks = torch.where(tiles > self.threshold, labels, torch.full_like(labels, self.background))
        return _tile(tiles), _tile(masks)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        img, mask = self.raw(i)
        if self.augment == "crop_flip":
            img, mask = joint_crop_flip(img, mask, self.pad, self.background)
        x = self.transform(img[None])  # (C, H, W)
        if tuple(mask.shape) != tuple(x.shape[-2:]):
            mask = F.interpolate(mask[None, None].float(), size=x.shape[-2:], mode="nearest")[0, 0].long()
        return x, mask.contiguous()

    def __repr__(self) -> str:
        return (f"Mosaic(n={len(self)}, size={tuple(self.cfg.img_size)}, augment={self.augment}, seed={self.seed}, "
                f"threshold={self.threshold})")


def _tile(t: Tensor) -> Tensor:
    """(4, h, w) tiles in row-major order -> (2h, 2w)."""
    return torch.cat([torch.cat([t[0], t[1]], 1), torch.cat([t[2], t[3]], 1)], 0)


def joint_crop_flip(img: Tensor, mask: Tensor, pad: int, background: int) -> tuple[Tensor, Tensor]:
    """The same random padded crop and horizontal flip for img (H, W) uint8 and mask (H, W)."""
    H, W = img.shape
    img = F.pad(img, (pad, pad, pad, pad))  # raw 0: black, which the threshold calls background
    mask = F.pad(mask, (pad, pad, pad, pad), value=background)
    i, j = torch.randint(0, 2 * pad + 1, (2,)).tolist()
    img, mask = img[i : i + H, j : j + W], mask[i : i + H, j : j + W]
    if torch.rand(()) < 0.5:
        img, mask = img.flip(-1), mask.flip(-1)
    return img, mask


def build_mosaic(
    name_or_dir: str = "fashion_mnist",
    split: str = "train",
    *,
    train: bool = False,
    augment: str | None = None,
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
    img_size: int | tuple[int, int] | None = None,
    in_chans: int | None = None,
    mean: Any = None,
    std: Any = None,
    interpolation: str = "bilinear",
    crop_pct: float = 1.0,
    size: int | None = None,
    seed: int = SEED,
    threshold: int = THRESHOLD,
    classes: Sequence[str] | None = None,
) -> Mosaic:
    """Mosaics of the ``split`` of dataset ``name_or_dir`` (as ``build_dataset`` finds it; a mosaic
    name is accepted too and means Fashion-MNIST). Model settings (``img_size`` default 2x the
    tile side, ``in_chans`` default 1, mean/std, interpolation) as in ``build_dataset``;
    ``train=True`` turns on ``augment`` (default ``'crop_flip'``); ``classes``: the model's class list
    (as ``build_dataset``'s, checked against the base dataset's). A missing base dataset raises
    the base's DataError (which says how to get the files)."""
    base_name = "fashion_mnist" if str(name_or_dir) in NAMES else name_or_dir
    base = build_dataset(base_name, split, data_dir=data_dir, download=download, classes=classes)
    images = getattr(base, "images", None)
    if not isinstance(images, Tensor):
        raise DataError(f"mosaics are built from Fashion-MNIST-like idx datasets; {name_or_dir!r} is a "
                        f"{type(base).__name__}")
    native = (2 * images.shape[1], 2 * images.shape[2])
    cfg = make_data_config(img_size or native, in_chans or 1, mean, std, interpolation, crop_pct)
    aug = (augment or "crop_flip") if train else "none"
    return Mosaic(base, cfg, augment=aug, size=size, seed=seed, threshold=threshold)


@register_dataset(*NAMES, in_chans=1, img_size=56, augment="crop_flip")
def _fmnist_mosaic(split: str, cfg: DataConfig, *, train: bool, augment: str, data_dir: Any, download: bool) -> Dataset:
    base = build_dataset("fashion_mnist", split, data_dir=data_dir, download=download)
    return Mosaic(base, cfg, augment=augment if train else "none")


__all__ = ["MOSAIC_AUGMENTS", "Mosaic", "NAMES", "SEED", "THRESHOLD", "build_mosaic"]

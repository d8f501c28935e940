"""``build_dataset``: one entry for every dataset, by registered name or by directory.

Registered names (``register_dataset``) map to a builder. A directory is read as a registered
dataset whose ``detect(dir)`` recognises its files (e.g. a folder of Fashion-MNIST idx files),
else as an image folder in the ImageNet layout. Train-time augmentation is made reproducible per sample by
:class:`Seeded`: a sampler may pass ``(index, seed)`` keys and the item's random draws then
depend only on that seed (not on worker, process count or what ran before), which is what
makes resumed and multi-process runs equal to a single uninterrupted one.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..core.errors import TokenReduceError
from .fashion_mnist import DataError, FashionMNIST
from .folder import ImageFolder, check_classes, load_image
from .transforms import AUGMENTS, DataConfig, TensorTransform, make_data_config, pil_transform

Builder = Callable[..., Dataset]
_REGISTRY: dict[str, tuple[Builder, dict[str, Any]]] = {}
_DETECT: list[tuple[Callable[[str], bool], str]] = []


def register_dataset(*names: str, detect: Callable[[str], bool] | None = None,
                     **defaults: Any) -> Callable[[Builder], Builder]:
    """Register ``builder(split, cfg: DataConfig, *, train, augment, data_dir, download)`` under
    ``names``; ``defaults`` are the dataset's native ``in_chans`` / ``img_size`` / ``augment``, and
    ``dense=True`` for one whose items are already (image, pixel labels) (:func:`is_dense`);
    ``detect(dir)`` says whether a directory holds this dataset's files."""

    def deco(fn: Builder) -> Builder:
        for n in names:
            _REGISTRY[n] = (fn, defaults)
        if detect is not None:
            _DETECT.append((detect, names[0]))
        return fn

    return deco


def list_datasets() -> list[str]:
    return sorted(_REGISTRY)


def is_dense(name: str) -> bool:
    """Whether ``name`` is a registered dataset of (image, pixel labels) items (``dense=True``), which a
    dense task reads as it is (the scene masks), rather than building mosaics of it."""
    return bool(_REGISTRY.get(str(name), (None, {}))[1].get("dense"))


def detect(folder: str) -> str | None:
    """The registered dataset whose files ``folder`` holds (its first name; ``detect=`` of
    :func:`register_dataset`), None where it is no such folder."""
    return next((name for holds, name in _DETECT if holds(folder)), None) if os.path.isdir(folder) else None


def cache_dir() -> Path:
    """``$TOKENREDUCE_CACHE`` or ``cache/`` (git-ignored): downloads, trained references, demo runs."""
    return Path(os.environ.get("TOKENREDUCE_CACHE", "cache"))


def _has_fashion_mnist(d: str) -> bool:
    return any(os.path.isfile(os.path.join(d, "train-images-idx3-ubyte" + ext)) for ext in (".gz", ""))


@register_dataset("fashion_mnist", "fashion-mnist", "fmnist", detect=_has_fashion_mnist, in_chans=1, img_size=28,
                  augment="crop_flip")
def _fashion_mnist(split: str, cfg: DataConfig, *, train: bool, augment: str, data_dir: Any, download: bool) -> Dataset:
    dl = (data_dir or str(cache_dir() / "data")) if download else None
    return FashionMNIST(split, TensorTransform(cfg, augment if train else "none"), data_dir=data_dir, download_to=dl)


def _folder(root: str, split: str, cfg: DataConfig, *, train: bool, augment: str,
            classes: Sequence[str] | None) -> Dataset:
    return ImageFolder(root, split, pil_transform(cfg, train=train, augment=augment), in_chans=cfg.in_chans,
                       classes=classes)


def _same_classes(ds: Dataset, classes: Sequence[str] | None, what: str) -> Dataset:
    """``ds`` (a registered dataset, whose class list is fixed) if its classes are ``classes``."""
    have = list(getattr(ds, "classes", []))
    if classes is None or have == list(classes):
        return ds
    check_classes(have, classes, what)
    raise DataError(f"{what} has the model's classes in another order ({', '.join(have)}); only an image folder "
                    "is mapped by class name")


def build_dataset(
    name_or_dir: str = "fashion_mnist",
    split: str = "train",
    *,
    img_size: int | tuple[int, int] | None = None,
    train: bool = False,
    data_dir: str | os.PathLike | None = None,
    in_chans: int | None = None,
    mean: Any = None,
    std: Any = None,
    interpolation: str = "bilinear",
    crop_pct: float = 1.0,
    augment: str | None = None,
    download: bool = False,
    classes: Sequence[str] | None = None,
) -> Dataset:
    """The ``split`` ('train', 'val'/'test') of a registered dataset or of an image folder.

    Items are ``(image (in_chans, H, W) float normalised, label int)``; the dataset has
    ``.classes``. ``img_size``/``in_chans``/``mean``/``std``/``interpolation``/``crop_pct`` describe
    the model (``data_config_from_model(model)`` gives them); unset size/channels fall back to the
    dataset's native ones. ``train=True`` adds the augmentation ``augment`` (default: the
    dataset's own; see ``transforms.AUGMENTS``). ``data_dir`` points a registered dataset at its
    files; ``download`` lets it fetch them (torchvision, network). ``classes``: the model's class
    list (its training split's, a checkpoint's ``meta['classes']``): labels index it, an image folder
    is mapped by class name (``folder.ImageFolder``), and a split with classes it lacks is a DataError
    naming them; None: the split's own classes (the training split).
    """
    if augment is not None and augment not in AUGMENTS:
        raise TokenReduceError(f"unknown augment {augment!r}; choose from {', '.join(AUGMENTS)}")
    name_or_dir = str(name_or_dir)
    if name_or_dir not in _REGISTRY and (found := detect(name_or_dir)):
        name_or_dir, data_dir = found, name_or_dir
    if name_or_dir in _REGISTRY:
        builder, native = _REGISTRY[name_or_dir]
        cfg = make_data_config(img_size or native["img_size"], in_chans or native["in_chans"], mean, std,
                               interpolation, crop_pct)
        ds = builder(split, cfg, train=train, augment=augment or native["augment"], data_dir=data_dir,
                     download=download)
        return _same_classes(ds, classes, f"dataset {name_or_dir!r}")
    if not os.path.exists(name_or_dir) and os.sep not in name_or_dir and not name_or_dir.startswith("."):
        raise DataError(f"unknown dataset {name_or_dir!r}: not a registered name ({', '.join(list_datasets())}) "
                        "and not an existing directory")
    cfg = make_data_config(img_size or 224, in_chans or 3, mean, std, interpolation, crop_pct)
    return _folder(name_or_dir, split, cfg, train=train, augment=augment or "rrc_flip", classes=classes)


class Subset(Dataset):
    """``indices`` of ``base``, keeping ``classes``."""

    def __init__(self, base: Dataset, indices: list[int]) -> None:
        self.base, self.indices = base, list(indices)
        self.classes = base.classes

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.base[self.indices[i]]


def subset(ds: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """A fixed random ``n`` items of ``ds`` (all when n is None or >= len); same for every run."""
    if n is None or n >= len(ds):
        return ds
    if n < 1:
        raise TokenReduceError(f"subset size must be positive, got {n}")
    g = torch.Generator().manual_seed(seed)
    return Subset(ds, sorted(torch.randperm(len(ds), generator=g)[:n].tolist()))


class Seeded(Dataset):
    """Wraps a dataset so that key ``(i, seed)`` runs ``base[i]`` with the torch and python RNGs
    seeded by ``seed`` (the caller's RNG states are restored afterwards); a plain ``i`` passes."""

    def __init__(self, base: Dataset) -> None:
        self.base = base
        self.classes = base.classes

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            return self.base[key]
        i, seed = key
        py_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)  # not torch.manual_seed: that also seeds CUDA, slowly
            random.seed(seed)
            try:
                return self.base[i]
            finally:
                random.setstate(py_state)



class OnDemand(Dataset):
    """A dataset made by ``build()`` on first use (its length, an item, ``base`` or ``classes``).

    The evaluation database (the training split) is one: only a task that retrieves against it
    reads it. ``base`` is the built dataset, so label readers that follow ``base`` (like
    ``tasks.dataset_labels``) get its labels without loading images.
    """

    def __init__(self, build: Callable[[], Dataset]) -> None:
        self._build, self._ds = build, None

    @property
    def base(self) -> Dataset:
        if self._ds is None:
            self._ds = self._build()
        return self._ds

    @property
    def classes(self) -> list[str]:
        return list(getattr(self.base, "classes", []))

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: Any) -> Any:
        return self.base[i]


__all__ = ["DataError", "ImageFolder", "FashionMNIST", "OnDemand", "Seeded", "build_dataset", "list_datasets",
           "load_image", "register_dataset", "subset"]

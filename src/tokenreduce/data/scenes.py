"""Fashion-MNIST scenes: one garment on a cluttered 56x56 canvas, the papers' regime in miniature.

Why this test bed exists: on 28x28 Fashion-MNIST the garment fills the frame, so there is no
background to remove and a random pruner is as good as any scorer. Token reduction's premise is that
most of an image's patches do not matter for its label. A scene puts one *target* garment (its
class is the label) at a random position and scale on a 56x56 canvas (patch 4 -> a 14x14 grid,
DeiT-S's grid) among *clutter*: fragments cut from other garments of the same split, as bright as
the target, so the object is not simply the brightest region. The target covers about 10-40% of
the patches; the rest is black background or clutter.

Scene ``i`` of a split, drawn with ``numpy.random.default_rng((seed, split code, i))`` (so it
depends on nothing but ``(split, i, seed)``: not on the process, the order of access or what
ran before):

1. target = item ``i`` of the split (train scenes come from training items, test scenes from test
   items), resized (bilinear, antialiased) to a side ``s`` in ``TARGET_SIDE`` = 24..40 pixels; its
   foreground (resized value > ``THRESHOLD`` = 51, the mosaics' rule) fixed, then its intensity
   scaled by a factor in ``INTENSITY`` = 0.6..1.0;
2. ``n`` in ``CLUTTER_COUNT`` = 3..6 fragments: each a random window of side 10..16 of another
   item of the same split (a window holding at least ``MIN_FRAGMENT_INK`` of foreground, redrawn
   up to 8 times), resized to a side in ``FRAGMENT_SIDE`` = 8..18, intensity scaled like the
   target, pasted anywhere on the canvas (pixel-wise maximum with what is there);
3. the target pasted last and opaque: on its foreground pixels the canvas takes the target's
   pixel, elsewhere the clutter stays.

The mask of scene ``i`` is exactly the target's pasted foreground (bool (56, 56)); clutter is not
part of it. For the dense task (:class:`SceneMasks`) the pixel label is the target's class on
the mask and the background class (10) everywhere else, clutter included: a segmenter must find
*the* object, not every garment-like pixel.

A scene is generated when it is first read (about 1 ms), so a run that reads a few hundred scenes
makes only those; the whole split, once generated, is cached (``$TOKENREDUCE_CACHE/data/
scenes-...npz``, written atomically, keyed by the split, seed, generator version and the source
file's size) and later runs load it. All 60 000 training scenes take about a minute to generate.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from ..core.errors import TokenReduceError
from .build import build_dataset, cache_dir, register_dataset
from .fashion_mnist import DataError
from .mosaic import THRESHOLD, joint_crop_flip
from .transforms import DataConfig, TensorTransform

#: Seed of the scene generator (the default of every scene dataset).
SEED = 0
#: Canvas side in pixels (patch 4 -> 14 x 14 patches).
CANVAS = 56
TARGET_SIDE = (24, 40)
FRAGMENT_WINDOW = (10, 16)
FRAGMENT_SIDE = (8, 18)
CLUTTER_COUNT = (3, 6)
INTENSITY = (0.6, 1.0)
#: A clutter window must hold at least this fraction of foreground pixels.
MIN_FRAGMENT_INK = 0.25
#: Bump when the generator changes: cached scenes of another version are not reused.
VERSION = 2
#: The fixed random subset of test scenes the scene test bed scores a run on (its references' recipes, the
#: studies' shortened schedule, a probe's default): the same scenes for every run.
EVAL_SUBSET = 2000
#: Names under which the scenes are registered with ``build_dataset``: classification, segmentation.
NAMES = ("fmnist_scenes", "fashion_mnist_scenes", "scenes")
SEG_NAMES = ("fmnist_scenes_seg", "scenes_seg")
_SPLIT_CODE = {"train": 0, "test": 1}


def _resize(img: np.ndarray, side: int) -> np.ndarray:
    """uint8 (h, w) -> float32 (side, side), bilinear with antialiasing (deterministic on CPU)."""
    t = torch.from_numpy(img.astype(np.float32))[None, None]
    return F.interpolate(t, size=(side, side), mode="bilinear", align_corners=False, antialias=True)[0, 0].numpy()


def _paste_max(canvas: np.ndarray, patch: np.ndarray, top: int, left: int) -> None:
    """canvas[top:, left:] = max(canvas, patch), clipped to the canvas."""
    h, w = patch.shape
    t0, l0 = max(top, 0), max(left, 0)
    t1, l1 = min(top + h, canvas.shape[0]), min(left + w, canvas.shape[1])
    if t1 <= t0 or l1 <= l0:
        return
    region = canvas[t0:t1, l0:l1]
    np.maximum(region, patch[t0 - top : t1 - top, l0 - left : l1 - left], out=region)


def make_scene(images: np.ndarray, i: int, rng: np.random.Generator,
               threshold: int = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Scene of target ``images[i]`` among fragments of other ``images``: (uint8 (56, 56), bool mask).

    ``images`` uint8 (N, 28, 28) is the split; ``rng`` the scene's generator (see the module
    docstring for the steps and their ranges).
    """
    n_items = len(images)
    canvas = np.zeros((CANVAS, CANVAS), np.float32)
    for _ in range(int(rng.integers(CLUTTER_COUNT[0], CLUTTER_COUNT[1] + 1))):
        j = int(rng.integers(n_items - 1))
        j += j >= i  # never the target itself
        src = images[j]
        for _attempt in range(8):
            win = int(rng.integers(FRAGMENT_WINDOW[0], FRAGMENT_WINDOW[1] + 1))
            r, c = (int(v) for v in rng.integers(0, src.shape[0] - win + 1, 2))
            window = src[r : r + win, c : c + win]
            if (window > threshold).mean() >= MIN_FRAGMENT_INK:
                break
        side = int(rng.integers(FRAGMENT_SIDE[0], FRAGMENT_SIDE[1] + 1))
        frag = _resize(window, side) * rng.uniform(*INTENSITY)
        top, left = (int(v) for v in rng.integers(-side // 4, CANVAS - 3 * side // 4, 2))
        _paste_max(canvas, frag, top, left)
    side = int(rng.integers(TARGET_SIDE[0], TARGET_SIDE[1] + 1))
    target = _resize(images[i], side)
    fg = target > threshold  # the garment's shape, decided before its intensity is scaled
    target *= rng.uniform(*INTENSITY)
    top, left = (int(v) for v in rng.integers(0, CANVAS - side + 1, 2))
    region = canvas[top : top + side, left : left + side]
    region[fg] = target[fg]
    mask = np.zeros((CANVAS, CANVAS), bool)
    mask[top : top + side, left : left + side] = fg
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8), mask


def generate(images: np.ndarray, split: str, seed: int = SEED, count: int | None = None,
             threshold: int = THRESHOLD) -> tuple[np.ndarray, np.ndarray]:
    """Scenes ``0..count-1`` of a split: (uint8 (n, 56, 56), bool (n, 56, 56) masks)."""
    n = len(images) if count is None else min(int(count), len(images))
    out = np.zeros((n, CANVAS, CANVAS), np.uint8)
    masks = np.zeros((n, CANVAS, CANVAS), bool)
    code = _SPLIT_CODE[split]
    for i in range(n):
        out[i], masks[i] = make_scene(images, i, np.random.default_rng((seed, code, i)), threshold)
    return out, masks


def _cache_path(split: str, seed: int, source: Path | None, n_items: int) -> Path:
    size = source.stat().st_size if source is not None and source.is_file() else 0
    key = hashlib.sha256(f"{VERSION}|{split}|{seed}|{n_items}|{size}|{THRESHOLD}".encode()).hexdigest()[:12]
    return cache_dir() / "data" / f"scenes-{split}-s{seed}-{key}.npz"


def read_cache(path: Path, n_items: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scenes, masks) from a cache file, or None when it is absent, damaged or of another size."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            scenes, packed = z["scenes"], z["masks"]
        masks = np.unpackbits(packed, axis=-1, count=CANVAS).astype(bool)
    except (OSError, ValueError, KeyError, EOFError):
        return None  # a damaged cache file is regenerated
    if scenes.shape != (n_items, CANVAS, CANVAS) or masks.shape != scenes.shape:
        return None
    return scenes, masks


def write_cache(path: Path, scenes: np.ndarray, masks: np.ndarray) -> None:
    """Write the cache atomically (a temporary file in the same folder, then ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, scenes=scenes, masks=np.packbits(masks, axis=-1))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class Scenes(Dataset):
    """Scenes of a Fashion-MNIST-like split; items ``(image float (C, 56, 56) normalised, label)``.

    ``base`` must expose ``images`` uint8 (N, 28, 28), ``targets`` and ``classes``. A scene is made
    when it is first read (about 1 ms) unless the split's cache file exists; :attr:`scenes` /
    :attr:`masks` (every scene of the split at once) generate the rest and write the cache, which
    later datasets of the same split load. ``object_mask(i)``: the target's pixels (bool (56, 56)).
    ``augment='crop_flip'`` (training) pads by 4 and crops back, with a horizontal flip; it moves
    the mask with the image (``item_with_mask``).
    """

    def __init__(self, base: Dataset, cfg: DataConfig, *, split: str, augment: str = "none", seed: int = SEED,
                 cache: bool = True) -> None:
        images = getattr(base, "images", None)
        if not isinstance(images, Tensor) or images.dtype != torch.uint8 or images.dim() != 3:
            raise DataError(f"scenes need a base dataset with uint8 images (N, h, w) (Fashion-MNIST); "
                            f"got {type(base).__name__}")
        if len(images) < 2:
            raise DataError(f"a scene needs clutter from other items; the {split} split holds {len(images)}")
        if augment not in ("none", "crop_flip"):
            raise TokenReduceError(f"augment {augment!r} does not apply to scenes; choose from none, crop_flip")
        if tuple(cfg.img_size) != (CANVAS, CANVAS):
            raise TokenReduceError(f"scenes are {CANVAS}x{CANVAS}; the model expects {tuple(cfg.img_size)}")
        root = getattr(base, "root", None)
        source = Path(root) / ("train-images-idx3-ubyte.gz" if split == "train" else "t10k-images-idx3-ubyte.gz") \
            if root is not None else None
        self._items = images.numpy()
        self._cache = _cache_path(split, seed, source, len(images)) if cache else None
        cached = read_cache(self._cache, len(images)) if self._cache is not None else None
        self._all = tuple(torch.from_numpy(a) for a in cached) if cached is not None else None
        self.targets = torch.as_tensor(base.targets)
        self.classes = list(base.classes)
        self.background = len(self.classes)
        self.cfg, self.augment, self.seed, self.split = cfg, augment, seed, split
        self.transform = TensorTransform(cfg, "none")

    def _full(self) -> tuple[Tensor, Tensor]:
        if self._all is None:
            scenes, masks = generate(self._items, self.split, self.seed)
            if self._cache is not None:
                write_cache(self._cache, scenes, masks)
            self._all = torch.from_numpy(scenes), torch.from_numpy(masks)
        return self._all

    @property
    def scenes(self) -> Tensor:
        """Every scene of the split, uint8 (N, 56, 56) (generated and cached on first use)."""
        return self._full()[0]

    @property
    def masks(self) -> Tensor:
        """Every scene's object mask, bool (N, 56, 56) (generated and cached on first use)."""
        return self._full()[1]

    def __len__(self) -> int:
        return len(self.targets)

    def raw(self, i: int) -> tuple[Tensor, Tensor]:
        """Scene ``i`` before augmentation and normalisation: (uint8 (56, 56), bool mask (56, 56))."""
        if self._all is not None:
            return self._all[0][i], self._all[1][i]
        scene, mask = make_scene(self._items, i, np.random.default_rng((self.seed, _SPLIT_CODE[self.split], i)))
        return torch.from_numpy(scene), torch.from_numpy(mask)

    def object_mask(self, i: int) -> Tensor:
        """The target garment's pixels in scene ``i``, bool (56, 56) (clutter excluded)."""
        return self.raw(i)[1]

    def item_with_mask(self, i: int) -> tuple[Tensor, Tensor, int]:
        """(image (C, 56, 56) normalised, pixel labels long (56, 56), class): the augmentation
        (if any) applied to image and labels together; labels = class on the target, background
        elsewhere."""
        img, mask = self.raw(i)
        label = int(self.targets[i])
        pixels = torch.where(mask, torch.tensor(label), torch.tensor(self.background))
        if self.augment == "crop_flip":
            img, pixels = joint_crop_flip(img, pixels, 4, self.background)
        return self.transform(img[None]), pixels.contiguous(), label

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        if self.augment == "none":
            return self.transform(self.raw(i)[0][None]), int(self.targets[i])
        x, _, label = self.item_with_mask(i)
        return x, label

    def __repr__(self) -> str:
        return f"Scenes(split={self.split}, n={len(self)}, augment={self.augment}, seed={self.seed})"


class SceneMasks(Dataset):
    """The same scenes for the dense task: items ``(image (C, 56, 56), pixel labels long (56, 56))``."""

    def __init__(self, scenes: Scenes) -> None:
        self.base = scenes
        self.classes, self.background = scenes.classes, scenes.background

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x, pixels, _ = self.base.item_with_mask(i)
        return x, pixels


def _scenes(split: str, cfg: DataConfig, *, train: bool, augment: str, data_dir: Any, download: bool) -> Scenes:
    base = build_dataset("fashion_mnist", split, data_dir=data_dir, download=download)
    name = "train" if split == "train" else "test"
    return Scenes(base, cfg, split=name, augment=augment if train else "none")


@register_dataset(*NAMES, in_chans=1, img_size=CANVAS, augment="crop_flip")
def _fmnist_scenes(split: str, cfg: DataConfig, *, train: bool, augment: str, data_dir: Any,
                   download: bool) -> Dataset:
    return _scenes(split, cfg, train=train, augment=augment, data_dir=data_dir, download=download)


@register_dataset(*SEG_NAMES, in_chans=1, img_size=CANVAS, augment="crop_flip", dense=True)
def _fmnist_scenes_seg(split: str, cfg: DataConfig, *, train: bool, augment: str, data_dir: Any,
                       download: bool) -> Dataset:
    return SceneMasks(_scenes(split, cfg, train=train, augment=augment, data_dir=data_dir, download=download))


__all__ = ["CANVAS", "EVAL_SUBSET", "NAMES", "SEED", "SEG_NAMES", "SceneMasks", "Scenes", "generate", "make_scene"]

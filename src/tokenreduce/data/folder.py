"""Images in class folders (the ImageNet layout): ``ROOT/<split>/<class>/<image>``.

``ROOT/train`` and ``ROOT/val`` (``test`` is looked for as ``test``, then ``val``). A label is an
index into ONE class list: the sorted sub-directory names of the training split, recorded in every
checkpoint (``meta['classes']``) and passed as ``classes`` for every other split and every
evaluation, which are mapped by class name: a split that lacks a class, or lists its folders in
another order, gets the training indices; a folder the list does not hold is refused, named
(its labels would mean nothing to the model). Without ``classes`` the split's own sorted folders
are the list (the training split). Images are read with PIL; 8-bit modes (RGB, L, P,
RGBA, CMYK, ...) are converted to what the model takes, 16-/32-bit and float modes are refused
with an error naming the file (converting them would silently clip values).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from .fashion_mnist import DataError
from .transforms import Transform

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: PIL modes that convert to 8-bit RGB / L without losing range.
EIGHT_BIT_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr"})
_SPLIT_DIRS = {"train": ("train",), "val": ("val", "validation", "test"), "test": ("test", "val", "validation")}


def split_dir(root: str | os.PathLike, split: str) -> Path:
    """The directory holding ``split``'s class folders."""
    root = Path(root)
    if not root.exists():
        raise DataError(f"image folder {root} does not exist")
    if not root.is_dir():
        raise DataError(f"{root} is not a directory (expected ROOT/train/<class>/*.jpg, ROOT/val/<class>/*.jpg)")
    if split not in _SPLIT_DIRS:
        raise DataError(f"split must be one of {', '.join(_SPLIT_DIRS)}, got {split!r}")
    for name in _SPLIT_DIRS[split]:
        if (root / name).is_dir():
            return root / name
    names = " or ".join(repr(n) for n in _SPLIT_DIRS[split])
    raise DataError(f"{root} has no {names} directory; expected the ImageNet layout "
                    f"ROOT/train/<class>/<image>, ROOT/val/<class>/<image>")


def check_classes(found: Sequence[str], known: Sequence[str], what: str) -> None:
    """DataError naming the classes of ``what`` (a split, a dataset) that ``known`` (the model's class
    list, its training split's) does not hold."""
    known_set = set(known)
    unknown = [c for c in found if c not in known_set]
    if unknown:
        shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
        raise DataError(f"{what} has {len(unknown)} class{'es' if len(unknown) > 1 else ''} the model does not know: "
                        f"{', '.join(unknown)}; it was trained on {len(known)} classes ({shown}); remove them or "
                        "evaluate a model trained with them")


def load_image(path: Path, mode: str) -> Image.Image:
    """PIL image converted to ``mode`` ('RGB' or 'L'); DataError for unreadable files or wide modes."""
    try:
        img = Image.open(path)
        img.load()
    except (OSError, UnidentifiedImageError) as e:
        raise DataError(f"cannot read image {path}: {e}") from e
    # PIL refuses an image of over twice Image.MAX_IMAGE_PIXELS, and warns above it (an error under -W error)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise DataError(f"cannot read image {path}: {e}; shrink it or remove it from the folder") from None
    if img.mode not in EIGHT_BIT_MODES:
        raise DataError(f"image {path} has mode {img.mode!r} (16-/32-bit or float); convert it to 8-bit RGB or "
                        "grayscale (e.g. PIL: img.convert('RGB') after scaling) before training")
    if img.mode in ("P", "PA") and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert(mode)


class ImageFolder(Dataset):
    """Items ``(transform(PIL image), class index)``: the index of the folder's name in ``classes``
    (the model's class list, e.g. a checkpoint's ``meta['classes']``; default: the split's own sorted
    folder names). A folder ``classes`` does not hold is a DataError naming it."""

    def __init__(self, root: str | os.PathLike, split: str, transform: Transform | None = None,
                 in_chans: int = 3, classes: Sequence[str] | None = None) -> None:
        self.root = split_dir(root, split)
        found = sorted(d.name for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("."))
        if not found:
            raise DataError(f"{self.root} holds no class folders; expected {self.root}/<class>/<image>")
        if classes is not None:
            check_classes(found, classes, f"image folder {self.root}")
        self.classes = list(found if classes is None else classes)
        label_of = {name: i for i, name in enumerate(self.classes)}
        self.samples: list[tuple[Path, int]] = []
        for name in found:
            files = sorted(p for p in (self.root / name).rglob("*") if p.suffix.lower() in EXTENSIONS)
            if not files:  # torchvision refuses it too: a class with no image would be a head row never trained
                raise DataError(f"class folder {self.root / name} holds no images (looked for "
                                f"{', '.join(EXTENSIONS)}); remove it or add its images")
            self.samples += [(p, label_of[name]) for p in files]
        if not self.samples:
            raise DataError(f"{self.root} holds no images (looked for {', '.join(EXTENSIONS)} in "
                            f"{len(found)} class folders)")
        self.targets = torch.tensor([label for _, label in self.samples])
        self.transform = transform
        self.mode = "L" if in_chans == 1 else "RGB"

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        img = load_image(path, self.mode)
        return (self.transform(img) if self.transform else img), label

    def __repr__(self) -> str:
        return f"ImageFolder({self.root}, n={len(self)}, classes={len(self.classes)})"

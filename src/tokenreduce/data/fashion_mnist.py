"""Fashion-MNIST (Xiao et al. 2017, arXiv:1708.07747): 60k train / 10k test 28x28 grayscale
images of 10 clothing classes, read straight from the idx files (gzipped or not).

Where the files are looked for: ``data_dir`` (``--data DIR``) if given, else
``$TOKENREDUCE_DATA`` and ``/usr/share/datasets/fashion-mnist`` (Debian package
``dataset-fashion-mnist``); in each, also ``fashion-mnist/`` and torchvision's ``FashionMNIST/raw``.
``download=True`` fetches the files with torchvision into ``data_dir`` (or the cache) when a network exists.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.datasets import FashionMNIST as TVFashionMNIST

from ..core.errors import TokenReduceError
from .transforms import Transform

CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle boot")
#: Items per split of the published dataset (the real files hold exactly these: tests/test_facts.py).
SIZES = {"train": 60_000, "test": 10_000}
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
_SPLITS = {"train": "train", "test": "test", "val": "test"}
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataError(TokenReduceError):
    """Missing, empty or malformed data."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An idx file (LeCun's MNIST format, optionally gzipped) as a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise DataError(f"{path} is not an idx file (bad magic number)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - offset != expected:
        raise DataError(f"{path} is truncated or corrupted: {len(raw) - offset} data bytes, header says {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims)


def _candidates(data_dir: str | os.PathLike | None) -> list[Path]:
    if data_dir:  # an explicit directory is the only place looked at
        roots = [Path(data_dir)]
    else:
        roots = [Path(d) for d in (os.environ.get("TOKENREDUCE_DATA"),) if d] + [SYSTEM_DIR]
    return [p for r in roots for p in (r, r / "fashion-mnist", r / "FashionMNIST" / "raw")]


def _find(stem: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for name in (stem + ".gz", stem):
            if (d / name).is_file():
                return d / name
    return None


def find_files(split: str, data_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """The (images, labels) idx files of ``split``; a DataError that says how to get them."""
    if data_dir is not None and not Path(data_dir).exists():
        raise DataError(f"data directory {data_dir} does not exist")
    dirs = _candidates(data_dir)
    found = [_find(stem, dirs) for stem in _FILES[split]]
    if None in found:
        where = str(data_dir) if data_dir else " or ".join(str(d) for d in dirs[::3])
        raise DataError(
            f"Fashion-MNIST {split} files ({', '.join(s + '.gz' for s in _FILES[split])}) not found in "
            f"{where}. Get them with 'apt install dataset-fashion-mnist', or download them from "
            "https://github.com/zalandoresearch/fashion-mnist into a directory and pass --data DIR, "
            "or pass --download (torchvision, needs a network)"
        )
    return found[0], found[1]


def download(root: str | os.PathLike) -> Path:
    """Fetch the four files with torchvision into ``root``; returns the directory holding them."""
    try:
        TVFashionMNIST(str(root), train=True, download=True)
        TVFashionMNIST(str(root), train=False, download=True)
    except Exception as e:  # network errors come in many types
        raise DataError(f"downloading Fashion-MNIST into {root} failed ({e}); install 'dataset-fashion-mnist' "
                        "or copy the idx files there and pass --data DIR") from e
    return Path(root) / "FashionMNIST" / "raw"


class FashionMNIST(Dataset):
    """Fashion-MNIST split; items are ``(transform(uint8 (1, 28, 28)), label)``.

    Attributes: images uint8 (N, 28, 28), targets int64 (N,), classes (10 names).
    """

    classes = list(CLASSES)

    def __init__(self, split: str, transform: Transform | None = None, data_dir: str | os.PathLike | None = None,
                 download_to: str | os.PathLike | None = None) -> None:
        if split not in _SPLITS:
            raise DataError(f"Fashion-MNIST split must be one of {', '.join(_SPLITS)}, got {split!r}")
        split = _SPLITS[split]
        try:
            img_path, lbl_path = find_files(split, data_dir)
        except DataError:
            if download_to is None:
                raise
            img_path, lbl_path = find_files(split, download(download_to))
        images, labels = read_idx(img_path), read_idx(lbl_path)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataError(f"{img_path}: expected uint8 images (N, H, W), got {images.dtype} {images.shape}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise DataError(f"{lbl_path}: {labels.shape} labels for {len(images)} images")
        if len(images) == 0:
            raise DataError(f"{img_path} holds no images")
        if labels.min() < 0 or labels.max() >= len(CLASSES):
            raise DataError(f"{lbl_path}: labels outside 0..{len(CLASSES) - 1}")
        self.split, self.root, self.files = split, img_path.parent, (img_path, lbl_path)
        self.images = torch.from_numpy(images.copy())
        self.targets = torch.from_numpy(labels.astype(np.int64))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.images[i][None]  # (1, 28, 28) uint8
        return (self.transform(img) if self.transform else img), int(self.targets[i])

    def content_digest(self) -> dict[str, str]:
        """File name (without ``.gz``: the same content gzipped or not) -> SHA-256 of its decoded content (shape
        and values), for the images and the labels file: what tells files rewritten with other images of the same
        class counts apart (a resume compares it)."""
        digests = {}
        for path, values in zip(self.files, (self.images, self.targets), strict=True):
            h = hashlib.sha256(f"{tuple(values.shape)}|".encode())
            h.update(values.numpy())
            digests[path.name.removesuffix(".gz")] = h.hexdigest()
        return digests

    def __repr__(self) -> str:
        return f"FashionMNIST(split={self.split}, n={len(self)}, root={self.root}, transform={self.transform})"


def write_idx(path: str | os.PathLike, arr: np.ndarray) -> None:
    """Write a uint8 array as a gzipped idx file."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes())


def make_synthetic(root: str | os.PathLike, n_train: int = 64, n_test: int = 32, seed: int = 0) -> Path:
    """A tiny learnable stand-in in Fashion-MNIST's file format (class k: a bright band at rows
    2k..2k+5 plus noise), for tests and smoke runs without the real files. Returns ``root``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.permutation(np.arange(n) % len(CLASSES))
        images = rng.integers(0, 90, (n, 28, 28))
        for i, k in enumerate(labels):
            images[i, 2 * k + 4 : 2 * k + 10, 4:24] += 160
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return root

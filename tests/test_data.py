"""Data: idx parsing, Fashion-MNIST lookup and errors, image folders, transforms, seeded augmentation."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch.utils.data import Dataset

from tokenreduce import TokenReduceError
from tokenreduce.data import DataError, FashionMNIST, Seeded, build_dataset, data_config_from_model, subset
from tokenreduce.data.fashion_mnist import SYSTEM_DIR, read_idx, write_idx


@pytest.fixture
def fmnist_dir(tmp_path: Path) -> Path:
    """A tiny Fashion-MNIST in idx format: 40 train, 20 test images."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 40), ("t10k", 20)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return tmp_path


def test_read_idx_round_trip_and_truncation(tmp_path: Path) -> None:
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    raw = gzip.decompress((tmp_path / "a.gz").read_bytes())
    (tmp_path / "short").write_bytes(raw[:-3])
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "junk").write_bytes(b"hello world")
    with pytest.raises(DataError, match="not an idx file"):
        read_idx(tmp_path / "junk")


def test_fashion_mnist_from_dir(fmnist_dir: Path) -> None:
    ds = build_dataset("fashion_mnist", "train", train=False, data_dir=fmnist_dir)
    assert isinstance(ds, FashionMNIST) and len(ds) == 40 and len(ds.classes) == 10
    x, y = ds[3]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32 and y == 3
    assert x.min() >= -1 and x.max() <= 1  # default normalisation 0.5 / 0.5
    test = build_dataset("fmnist", "test", img_size=32, in_chans=3, data_dir=fmnist_dir)
    assert len(test) == 20 and test[0][0].shape == (3, 32, 32)
    # a directory holding the idx files is recognised as Fashion-MNIST
    assert isinstance(build_dataset(str(fmnist_dir), "val"), FashionMNIST)


@pytest.mark.skipif(not (SYSTEM_DIR / "t10k-images-idx3-ubyte.gz").exists(), reason="dataset-fashion-mnist missing")
def test_installed_fashion_mnist_test_split() -> None:
    ds = build_dataset("fashion_mnist", "test")
    assert len(ds) == 10000 and torch.bincount(ds.targets).tolist() == [1000] * 10


def test_missing_and_empty_data_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_dataset("fashion_mnist", "train", data_dir=tmp_path / "nope")
    with pytest.raises(DataError, match="apt install dataset-fashion-mnist"):
        build_dataset("fashion_mnist", "train", data_dir=tmp_path)
    with pytest.raises(DataError, match="not a registered name"):
        build_dataset("imagenet22k", "train")
    with pytest.raises(DataError, match="does not exist"):
        build_dataset(str(tmp_path / "missing_folder"), "train")
    with pytest.raises(DataError, match="no 'train' directory"):
        build_dataset(str(tmp_path), "train")
    (tmp_path / "train").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        build_dataset(str(tmp_path), "train")
    (tmp_path / "train" / "cat").mkdir()
    with pytest.raises(DataError, match="holds no images"):
        build_dataset(str(tmp_path), "train")
    with pytest.raises(TokenReduceError, match="unknown augment"):
        build_dataset("fashion_mnist", "train", augment="mixup")


def _image_folder(root: Path) -> Path:
    from PIL import Image

    for split in ("train", "val"):
        for i, cls in enumerate(("cat", "dog")):
            d = root / split / cls
            d.mkdir(parents=True)
            Image.fromarray(np.full((20, 24, 3), 40 * i, np.uint8)).save(d / "rgb.png")
            Image.fromarray(np.full((20, 24), 200, np.uint8)).save(d / "gray.jpg")
    return root


def test_image_folder(tmp_path: Path) -> None:
    root = _image_folder(tmp_path)
    ds = build_dataset(str(root), "train", img_size=16, train=True)
    assert ds.classes == ["cat", "dog"] and len(ds) == 4
    assert all(ds[i][0].shape == (3, 16, 16) for i in range(4))  # gray images are converted
    val = build_dataset(str(root), "test", img_size=16, in_chans=1)  # 'test' falls back to val/
    assert val[0][0].shape == (1, 16, 16) and val.targets.tolist() == [0, 0, 1, 1]


def test_wrong_image_mode_is_a_clear_error(tmp_path: Path) -> None:
    from PIL import Image

    root = _image_folder(tmp_path)
    Image.fromarray(np.full((8, 8), 60000, np.uint16)).save(root / "train" / "cat" / "deep.png")  # 16-bit
    ds = build_dataset(str(root), "train", img_size=16)
    bad = next(i for i, (p, _) in enumerate(ds.samples) if p.name == "deep.png")
    with pytest.raises(DataError, match="deep.png.*16-/32-bit"):
        ds[bad]


def test_data_config_from_model_and_augmentation(fmnist_dir: Path) -> None:
    model = VisionTransformer(img_size=28, patch_size=7, in_chans=1, embed_dim=32, depth=1, num_heads=2)
    cfg = data_config_from_model(model)
    assert cfg["img_size"] == [28, 28] and cfg["in_chans"] == 1 and len(cfg["mean"]) == 1
    train = Seeded(build_dataset("fashion_mnist", "train", train=True, data_dir=fmnist_dir, **cfg))
    state = torch.get_rng_state(), random.getstate()
    a, b, c = train[(5, 11)][0], train[(5, 11)][0], train[(5, 12)][0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(torch.get_rng_state(), state[0]) and random.getstate() == state[1]  # RNGs untouched
    plain = build_dataset("fashion_mnist", "train", train=False, data_dir=fmnist_dir, **cfg)
    assert torch.equal(plain[5][0], plain[5][0])


def test_subset_is_fixed(fmnist_dir: Path) -> None:
    ds = build_dataset("fashion_mnist", "train", data_dir=fmnist_dir)
    a, b = subset(ds, 10), subset(ds, 10)
    assert len(a) == 10 and a.indices == b.indices and a.classes == ds.classes
    assert subset(ds, None) is ds


# ----------------------------------------------------------------------------- one class list


def _folders(root: Path, splits: dict[str, tuple[str, ...]]) -> str:
    """Image folders with two images per class; a class's images have its own brightness everywhere."""
    from PIL import Image

    shade = {c: 30 * i for i, c in enumerate(sorted({c for cs in splits.values() for c in cs}))}
    for split, classes in splits.items():
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for k in range(2):
                Image.fromarray(np.full((8, 8), shade[cls], np.uint8)).save(root / split / cls / f"{k}.png")
    return str(root)


def test_a_split_is_labelled_by_the_training_classes_by_name(tmp_path: Path) -> None:
    root = _folders(tmp_path, {"train": ("cat", "dog", "fox"), "val": ("cat", "fox")})
    train = build_dataset(root, "train", img_size=8)
    assert train.classes == ["cat", "dog", "fox"] and train.targets.tolist() == [0, 0, 1, 1, 2, 2]
    val = build_dataset(root, "test", img_size=8, classes=train.classes)  # it lacks dog: fox stays 2
    assert val.classes == ["cat", "dog", "fox"] and val.targets.tolist() == [0, 0, 2, 2]
    other = build_dataset(root, "test", img_size=8, classes=["fox", "dog", "cat"])  # another order: by name
    assert other.targets.tolist() == [2, 2, 0, 0]


def test_a_split_with_classes_the_model_does_not_know_is_refused(tmp_path: Path, fmnist_dir: Path) -> None:
    root = _folders(tmp_path / "f", {"train": ("cat", "dog"), "val": ("cat", "cow", "emu")})
    with pytest.raises(DataError, match="2 classes the model does not know: cow, emu; it was trained on 2 classes"):
        build_dataset(root, "test", img_size=8, classes=["cat", "dog"])
    with pytest.raises(DataError, match="dataset 'fashion_mnist' has 10 classes the model does not know"):
        build_dataset("fashion_mnist", "test", data_dir=fmnist_dir, classes=["cat", "dog"])
    fmnist = build_dataset("fashion_mnist", "test", data_dir=fmnist_dir)
    with pytest.raises(DataError, match="in another order"):
        build_dataset("fashion_mnist", "test", data_dir=fmnist_dir, classes=fmnist.classes[::-1])
    assert build_dataset("fashion_mnist", "test", data_dir=fmnist_dir, classes=fmnist.classes).classes == fmnist.classes


TINY = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 8, "patch_size": 4, "embed_dim": 16, "depth": 1,
                                                   "num_heads": 2, "in_chans": 1, "num_classes": 3}}


def test_training_and_evaluation_label_every_split_by_the_training_classes(tmp_path: Path, monkeypatch) -> None:
    from tokenreduce.bench.evaluation import finetuned_cases, load_data, load_reference
    from tokenreduce.models import read_meta, save_checkpoint
    from tokenreduce.tasks import Task
    from tokenreduce.train.loop import TrainConfig, train

    root = _folders(tmp_path / "data", {"train": ("cat", "dog", "fox"), "val": ("cat", "fox")})
    built: dict[str, Dataset] = {}
    dataset = Task.dataset

    def spy(self, name, split, *, train, **kw):
        built[f"{split}{'-aug' if train else ''}"] = ds = dataset(self, name, split, train=train, **kw)
        return ds

    monkeypatch.setattr(Task, "dataset", spy)
    out = tmp_path / "run"
    train(TrainConfig(model=TINY, data=root, epochs=1, batch_size=3, out=str(out), threads=1, quiet=True))
    assert built["test"].targets.tolist() == [0, 0, 2, 2]  # the loop's evaluation: fox is class 2, not 1
    assert read_meta(out)["classes"] == ["cat", "dog", "fox"]
    ref = load_reference(out)
    assert load_data(ref, data=root).test.tensors[1].tolist() == [0, 0, 2, 2]  # tokenreduce eval
    other = tmp_path / "other.safetensors"
    save_checkpoint(other, ref.model, meta={**read_meta(out), "classes": ["fox", "dog", "cat"]})
    with pytest.raises(TokenReduceError, match="same classes in another order"):
        finetuned_cases([str(other)], ref)

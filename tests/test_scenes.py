"""The scene test bed: deterministic scenes, exact masks, splits kept apart."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from tokenreduce.data import build_dataset
from tokenreduce.data import scenes as sc
from tokenreduce.data.fashion_mnist import write_idx


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.fixture
def items() -> np.ndarray:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (12, 28, 28)).astype(np.uint8)
    img[:, :4] = 0  # some black rows, as real garments have
    return img


def test_scene_depends_only_on_split_index_seed(items):
    full, masks = sc.generate(items, "train", seed=3)
    alone, mask = sc.make_scene(items, 7, np.random.default_rng((3, 0, 7)))
    assert np.array_equal(full[7], alone) and np.array_equal(masks[7], mask)
    other, _ = sc.generate(items, "train", seed=4)
    test, _ = sc.generate(items, "test", seed=3)
    assert not np.array_equal(full, other) and not np.array_equal(full, test)


@pytest.mark.slow
def test_scenes_byte_identical_across_processes(items, tmp_path):
    np.save(tmp_path / "items.npy", items)
    code = ("import hashlib, numpy as np; from tokenreduce.data.scenes import generate; "
            f"s, m = generate(np.load({str(tmp_path / 'items.npy')!r}), 'test', seed=1); "
            "print(hashlib.sha256(s.tobytes()).hexdigest(), hashlib.sha256(m.tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    s, m = sc.generate(items, "test", seed=1)
    assert out == [_digest(s), _digest(m)]


def test_mask_is_the_pasted_garment(items, monkeypatch):
    monkeypatch.setattr(sc, "CLUTTER_COUNT", (0, 0))
    scenes, masks = sc.generate(items, "train")
    assert masks.any(axis=(1, 2)).all()
    assert np.array_equal(scenes > 0, masks)  # no clutter: exactly the garment's pixels are lit
    monkeypatch.setattr(sc, "CLUTTER_COUNT", (6, 6))
    cluttered, masks2 = sc.generate(items, "train")
    # with clutter the target is opaque on its mask (every mask pixel is the target's), clutter lit elsewhere
    assert (cluttered[masks2] >= round(0.6 * sc.THRESHOLD)).all()
    assert (cluttered[~masks2] > 0).any()


def test_garment_intensity_and_clutter_ranges(items):
    scenes, masks = sc.generate(items, "train")
    frac = masks.mean(axis=(1, 2))
    assert (frac > 0.05).all() and (frac < 0.6).all()  # the object is a minority of the canvas


def _idx_dir(root, train_value: int, test_value: int):
    root.mkdir(parents=True, exist_ok=True)
    for prefix, value, n in (("train", train_value, 30), ("t10k", test_value, 20)):
        img = np.zeros((n, 28, 28), np.uint8)
        img[:, 6:22, 6:22] = value
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", img)
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n, dtype=np.uint8) % 10)
    return root


def test_no_test_scene_uses_a_training_item(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    data = _idx_dir(tmp_path / "fm", train_value=250, test_value=100)
    test = build_dataset("fmnist_scenes", "test", data_dir=data)
    train = build_dataset("fmnist_scenes", "train", data_dir=data)
    assert int(test.scenes.max()) <= 100  # only test items' pixels (value 100) appear in test scenes
    assert int(train.scenes.max()) > 100
    assert len(test) == 20 and len(train) == 30 and test.classes == train.classes


def test_cache_round_trip_and_dataset_items(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    data = _idx_dir(tmp_path / "fm", train_value=200, test_value=180)
    lazy = build_dataset("fmnist_scenes", "test", data_dir=data)
    one = lazy.raw(5)  # made on demand: no cache file yet
    assert not list((tmp_path / "cache").rglob("*.npz"))
    first = build_dataset("fmnist_scenes", "test", data_dir=data)
    assert len(first.scenes) == 20  # the whole split: generated and cached
    files = list((tmp_path / "cache" / "data").glob("scenes-test-*.npz"))
    assert len(files) == 1
    monkeypatch.setattr(sc, "generate", None)  # the cache must serve the whole split now
    again = build_dataset("fmnist_scenes", "test", data_dir=data)
    assert torch.equal(first.scenes, again.scenes) and torch.equal(first.masks, again.masks)
    assert torch.equal(one[0], again.raw(5)[0]) and torch.equal(one[1], again.object_mask(5))
    x, y = first[3]
    assert x.shape == (1, 56, 56) and y == 3
    seg = build_dataset("fmnist_scenes_seg", "test", data_dir=data)
    img, pixels = seg[3]
    assert torch.equal(img, x)
    assert set(pixels.unique().tolist()) <= {3, seg.background}
    assert torch.equal(pixels == 3, first.masks[3])


def test_training_augment_moves_the_mask_with_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENREDUCE_CACHE", str(tmp_path / "cache"))
    data = _idx_dir(tmp_path / "fm", train_value=200, test_value=180)
    seg = build_dataset("fmnist_scenes_seg", "train", data_dir=data, train=True)
    torch.manual_seed(0)
    for i in range(5):
        img, pixels = seg[i]
        lit = img[0] > -0.99  # normalised: raw 0 -> -1
        assert (lit[pixels != seg.background]).all()


def test_recall_foreground_comes_from_object_masks():
    from tokenreduce.probes.recall_at_kept import patch_foreground

    mask = torch.zeros(1, 56, 56, dtype=torch.bool)
    mask[0, :8, :4] = True  # the first patch column of the top two rows
    frac = patch_foreground(mask, (14, 14))
    assert frac.shape == (1, 196) and frac[0, 0] == 1 and frac[0, 14] == 1 and frac.sum() == 2
    raw = torch.full((1, 56, 56), 200, dtype=torch.uint8)  # all bright: the threshold rule says all foreground
    assert patch_foreground(raw, (14, 14)).sum() == 196

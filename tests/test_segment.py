"""The ``segment`` task: Fashion-MNIST mosaics, confusion matrix / mIoU, dense heads on reduced models."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from timm.models.vision_transformer import VisionTransformer
from torch.utils.data import default_collate

import tokenreduce
from tokenreduce import TokenReduceError
from tokenreduce.data import DataError, Mosaic, Seeded, build_dataset, build_mosaic
from tokenreduce.data.fashion_mnist import CLASSES, make_synthetic, write_idx
from tokenreduce.tasks import TaskContext, build_task
from tokenreduce.tasks.segment import confusion_matrix, miou_from_confusion

LABELS = [3, 7, 0, 9]


@pytest.fixture
def four_images(tmp_path: Path) -> Path:
    """4 train / 4 test hand-made 28x28 images: image j has label LABELS[j], a 3x3 block of 255 at
    rows/cols 10..12, one pixel at 52 (5, 5) and one at 51 (6, 6); zero elsewhere."""
    images = np.zeros((4, 28, 28), np.uint8)
    images[:, 10:13, 10:13] = 255
    images[:, 5, 5] = 52  # just above the threshold: foreground
    images[:, 6, 6] = 51  # at the threshold (0.2 * 255): background
    for prefix in ("train", "t10k"):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", np.array(LABELS))
    return tmp_path


def test_mosaic_labels_on_a_hand_made_example(four_images: Path) -> None:
    ds = build_dataset("fmnist_mosaic", "train", data_dir=four_images)
    assert isinstance(ds, Mosaic) and len(ds) == 1 and ds.classes == list(CLASSES) and ds.background == 10
    assert sorted(ds.sources[0].tolist()) == [0, 1, 2, 3]  # each image once
    x, mask = ds[0]
    assert x.shape == (1, 56, 56) and x.dtype == torch.float32 and mask.shape == (56, 56) and mask.dtype == torch.long
    for t, src in enumerate(ds.sources[0].tolist()):  # tiles row-major: TL, TR, BL, BR
        oy, ox = 28 * (t // 2), 28 * (t % 2)
        want = torch.full((28, 28), 10)
        want[10:13, 10:13] = LABELS[src]
        want[5, 5] = LABELS[src]
        assert torch.equal(mask[oy : oy + 28, ox : ox + 28], want), t
        # normalised with mean = std = 0.5: 255 -> 1, 0 -> -1
        assert x[0, oy + 11, ox + 11] == 1.0 and x[0, oy, ox] == -1.0
    assert (mask != 10).sum() == 4 * 10


def test_mosaics_are_deterministic_sized_and_jointly_augmented(tmp_path: Path) -> None:
    root = make_synthetic(tmp_path, n_train=64, n_test=32)
    a, b = build_mosaic("fashion_mnist", "train", data_dir=root), build_mosaic("fashion_mnist", "train", data_dir=root)
    assert len(a) == 16 and torch.equal(a.sources, b.sources) and torch.equal(a[5][1], b[5][1])
    assert not torch.equal(build_mosaic("fashion_mnist", "train", data_dir=root, seed=1).sources, a.sources)
    assert len(build_mosaic("fashion_mnist", "test", data_dir=root, size=3)) == 3
    with pytest.raises(TokenReduceError, match=r"mosaic count must be in 1..8"):
        build_mosaic("fashion_mnist", "test", data_dir=root, size=9)
    # training augmentation moves image and mask together: foreground pixels stay foreground
    train = Seeded(build_dataset("fmnist_mosaic", "train", train=True, data_dir=root))
    moved = 0
    for i in range(8):
        x, mask = train[(i, 100 + i)]
        raw = torch.round((x[0] * 0.5 + 0.5) * 255)
        assert torch.equal(mask != 10, raw > 51)
        moved += not torch.equal(mask, a[i][1])
    assert moved > 0
    x, mask = build_mosaic("fmnist", "test", data_dir=root, img_size=28, in_chans=3)[0]
    assert x.shape == (3, 28, 28) and mask.shape == (28, 28)


def test_mosaic_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="apt install dataset-fashion-mnist"):
        build_dataset("fmnist_mosaic", "train", data_dir=tmp_path)
    with pytest.raises(DataError, match="apt install dataset-fashion-mnist"):
        build_mosaic("fashion_mnist", "test", data_dir=tmp_path)
    root = make_synthetic(tmp_path / "d", n_train=8, n_test=8)
    with pytest.raises(TokenReduceError, match="does not apply to mosaics"):
        build_dataset("fmnist_mosaic", "train", train=True, augment="crop_flip_erase", data_dir=root)


def test_confusion_matrix_and_miou_by_hand() -> None:
    target = torch.tensor([[0, 0, 0, 1], [1, 2, 2, 2]])
    pred = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 0]])
    cm = confusion_matrix(pred, target, 4)  # rows: truth, columns: prediction; class 3 absent from both
    assert cm.tolist() == [[2, 1, 0, 0], [0, 1, 1, 0], [1, 0, 2, 0], [0, 0, 0, 0]]
    miou, iou = miou_from_confusion(cm)
    # IoU0 = 2 / (3 + 3 - 2) = 1/2, IoU1 = 1 / (2 + 2 - 1) = 1/3, IoU2 = 2 / (3 + 3 - 2) = 1/2; class 3 left out
    assert iou[:3].tolist() == pytest.approx([0.5, 1 / 3, 0.5]) and math.isnan(iou[3])
    assert miou == pytest.approx(4 / 9)
    # a class only predicted counts with IoU 0; an ignored label (-1) is not counted
    cm = confusion_matrix(torch.tensor([0, 3, 1, 1, 2]), torch.tensor([0, 0, 1, 1, -1]), 5)
    miou, iou = miou_from_confusion(cm)
    assert cm.sum() == 4 and miou == pytest.approx((0.5 + 1.0 + 0.0) / 3) and iou[3] == 0
    with pytest.raises(TokenReduceError, match="empty"):
        miou_from_confusion(torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(TokenReduceError, match="predictions must lie in 0..1"):
        confusion_matrix(torch.tensor([2]), torch.tensor([0]), 2)


def _tiny(**kw) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(img_size=56, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=2,
                             num_classes=10, mlp_ratio=2.0, **kw)  # 14x14 = 196 patch tokens


def _bound(model, spec: str = "segment"):
    task = build_task(spec)
    task.bind(model, TaskContext(classes=list(CLASSES)))
    return task


@pytest.fixture
def mosaics(tmp_path: Path):
    return build_mosaic("fashion_mnist", "test", data_dir=make_synthetic(tmp_path, n_train=16, n_test=24))


def test_forward_gives_a_loss_and_every_parameter_a_gradient(mosaics) -> None:
    model = _tiny()
    task = _bound(model)
    assert task.head.out_features == 11 and model.num_classes == 0  # the image classifier is gone
    images, masks = default_collate([mosaics[i] for i in range(3)])
    out = task(images, masks)
    assert set(out.losses) == {"ce"} and torch.isfinite(out.losses["ce"]) and 0 <= out.stats["pixel_acc"] <= 100
    sum(out.losses.values()).backward()
    missing = [n for n, p in task.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing
    assert set(task.owned_state_dict()) == {"head.weight", "head.bias"}
    groups = task.param_groups(1e-3, 0.05)
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in task.parameters() if p.requires_grad)


def test_background_false_ignores_background() -> None:
    task = _bound(_tiny(), "segment(background=False, upsample='nearest')")
    assert task.head.out_features == 10
    images = torch.randn(2, 1, 56, 56)
    masks = torch.full((2, 56, 56), 10)
    masks[:, :8, :8] = 4
    loss = task(images, masks).losses["ce"]
    logits = task.pixel_logits(task.model, images)
    want = torch.nn.functional.cross_entropy(logits[:, :, :8, :8], masks[:, :8, :8])
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(tokenreduce.SpecError, match="upsample"):
        build_task("segment(upsample='bicubic')")


@pytest.mark.parametrize("spec", ["topk(keep=0.5, locs=(0,))", "tome(r=40)"])
def test_reduced_models_give_full_resolution_logits(spec: str, mosaics) -> None:
    model = tokenreduce.apply(_tiny(), spec, dense=True)
    task = _bound(model)
    images, masks = default_collate([mosaics[i] for i in range(2)])
    logits = task.pixel_logits(model, images)
    assert logits.shape == (2, 11, 56, 56) and torch.isfinite(logits).all()
    assert tokenreduce.get_info(model).tokens_per_block[-1] < 197  # the model did reduce
    out = task(images, masks)
    out.losses["ce"].backward()
    assert task.head.weight.grad is not None
    # a model patched without dense=True is switched to dense output, same reducer object
    plain = tokenreduce.apply(_tiny(), spec)
    reducer = tokenreduce.reducer_of(plain)
    task = _bound(plain)
    assert tokenreduce.reducer_of(plain) is reducer
    assert task.pixel_logits(plain, images).shape == (2, 11, 56, 56)


def test_evaluate_accumulates_one_confusion_matrix(mosaics) -> None:
    model = tokenreduce.apply(_tiny(), "tome(r=40)")
    task = _bound(model)
    a = task.evaluate(model, mosaics, batch_size=1)
    b = task.evaluate(model, mosaics, batch_size=len(mosaics))
    assert set(a) == {"miou", "pixel_acc", "iou_per_class", "n"} and a["n"] == len(mosaics) == 6
    assert a["miou"] == pytest.approx(b["miou"]) and a["iou_per_class"] == pytest.approx(b["iou_per_class"])
    with torch.no_grad():  # the same numbers from one confusion matrix over all pixels
        images, masks = default_collate([mosaics[i] for i in range(len(mosaics))])
        pred = task.pixel_logits(model, images).argmax(1)
    miou, iou = miou_from_confusion(confusion_matrix(pred, masks, 11))
    assert a["miou"] == pytest.approx(100 * miou) and 0 <= a["pixel_acc"] <= 100
    present = [v for v in a["iou_per_class"] if v is not None]
    assert len(present) == int((~iou.isnan()).sum()) and a["miou"] == pytest.approx(sum(present) / len(present))


def test_segment_refuses_what_it_cannot_do() -> None:
    task = build_task("segment")
    with pytest.raises(TokenReduceError, match="no distillation"):
        task.bind(_tiny(), TaskContext(classes=list(CLASSES), distill=("logits",)))
    task = _bound(_tiny())
    with pytest.raises(TokenReduceError, match=r"per-pixel masks \(B, H, W\)"):
        task(torch.randn(2, 1, 56, 56), torch.tensor([1, 2]))


def test_the_deterministic_cuda_forms_equal_the_default_ones() -> None:
    """On CUDA under --deterministic the upsampling and the pixel CE take forms with deterministic kernels
    (products, 1-D NLL): the same numbers as F.interpolate and the 2-D CE, checked here on the CPU."""
    from tokenreduce.tasks.segment import pixel_cross_entropy, separable_bilinear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 4, 3, generator=g, dtype=torch.float64)
    ref = torch.nn.functional.interpolate(x, size=(16, 12), mode="bilinear", align_corners=False)
    assert torch.allclose(separable_bilinear(x, (16, 12)), ref, atol=1e-12)
    masks = torch.randint(0, 5, (2, 16, 12), generator=g)
    masks[0, 0, :4] = -100
    flat = ref.movedim(1, -1).reshape(-1, 5)
    rows = torch.nn.functional.cross_entropy(flat, masks.reshape(-1), ignore_index=-100)
    assert torch.allclose(pixel_cross_entropy(ref, masks, -100), rows, atol=1e-12)

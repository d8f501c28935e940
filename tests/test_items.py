"""Per-item results (tasks/items.py): stored compactly, read back exactly, and the metric is their mean, for
the classification and the retrieval tasks; a training run's record keeps its final evaluation's items."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from torch.utils.data import TensorDataset

from tokenreduce.core.errors import TokenReduceError
from tokenreduce.tasks import build_task
from tokenreduce.tasks.base import TaskContext
from tokenreduce.tasks.items import decode, encode


def test_items_round_trip_exactly():
    bits = torch.tensor([True, False, True, True, False, False, True, False, True])
    assert decode(encode(bits)).tolist() == bits.float().tolist()
    reals = np.array([0.25, float("nan"), 1.0, 0.125], dtype=np.float32)
    back = decode(encode(reals))
    assert math.isnan(back[1]) and back[[0, 2, 3]].tolist() == [0.25, 1.0, 0.125]
    with pytest.raises(TokenReduceError, match="unknown dtype"):
        decode({"dtype": "int8", "n": 1, "data": ""})
    with pytest.raises(TokenReduceError, match="3 values stored, 4 declared"):
        decode({**encode(np.zeros(3, dtype=np.float32)), "n": 4})


def _model_and_data(classes: int = 4, n: int = 37):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, in_chans=1, num_classes=classes,
                              embed_dim=16, depth=1, num_heads=1).eval()
    return model, TensorDataset(torch.randn(n, 1, 16, 16), torch.arange(n) % classes)


def test_classify_items_are_each_images_correct_and_top1_their_mean():
    model, data = _model_and_data()
    task = build_task("classify")
    task.bind(model, TaskContext(classes=list("abcd")))
    out = task.evaluate(model, data, batch_size=8, items=True)
    hits = decode(out["items"]["top1"])
    assert hits.shape == (37,) and out["top1"] == pytest.approx(100 * hits.mean())
    logits = model(data.tensors[0])
    assert hits.tolist() == (logits.argmax(-1) == data.tensors[1]).float().tolist()  # in the data's order
    assert "items" not in task.evaluate(model, data, batch_size=8)  # only when asked


def test_hash_items_are_each_querys_ap_and_map_their_mean():
    model, data = _model_and_data()
    task = build_task("hash(bits=8, protocol='asym')")
    task.bind(model, TaskContext(classes=list("abcd"), train_labels=data.tensors[1], seed=0))
    out = task.evaluate(model, data, batch_size=8, database=data, items=True)
    aps = decode(out["items"]["map_asym"])
    assert aps.shape == (37,) and out["map_asym"] == pytest.approx(100 * np.nanmean(aps), abs=1e-4)
    assert out["top1"] == pytest.approx(100 * decode(out["items"]["top1"]).mean())

from __future__ import annotations

import torch
from conftest import make_host

from tokenreduce.visualize import patch_groups, visualize


def test_patch_groups_marks_pruned_and_merged():
    source = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 1]])  # cls; token 1 holds patches 0 and 2; patch 1 pruned
    assert patch_groups(source, 1).tolist() == [1, -1, 1]


def test_visualize_writes_one_png_per_image(tmp_path, images):
    paths = visualize(make_host("deit"), "tome(r=8)", images[:2], tmp_path)
    assert [p.name for p in paths] == ["image000.png", "image001.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)

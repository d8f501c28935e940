from __future__ import annotations

import pytest
import torch
from conftest import make_host

from tokenreduce import SpecError
from tokenreduce.visualize import draw, patch_groups, visualize


def test_patch_groups_marks_pruned_and_merged():
    source = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 1]])  # cls; token 1 holds patches 0 and 2; patch 1 pruned
    assert patch_groups(source, 1).tolist() == [1, -1, 1]


def test_visualize_writes_one_png_per_image(tmp_path, images):
    paths = visualize(make_host("deit"), "tome(r=8)", images[:2], tmp_path)
    assert [p.name for p in paths] == ["image000.png", "image001.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_draw_writes_a_folder_per_spec_and_leaves_the_model_unpatched(tmp_path, images):
    model = make_host("deit")
    paths = draw(model, ["tome(r=8)", "evit(keep=0.5, locs=(1, 2))"], images[:1], ["x"], tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in paths) == [
        "evit_keep_0.5_locs_1_2/image000.png", "tome_r_8/image000.png"]
    assert sorted(p.name for p in (tmp_path / "tome_r_8").iterdir()) == ["image000.png"]  # no temporary left
    assert not hasattr(model, "_tokenreduce_patch")
    with pytest.raises(SpecError, match="beyond"):
        draw(model, ["evit(keep=0.5, locs=(9,))"], images[:1], ["x"], tmp_path)
    assert not hasattr(model, "_tokenreduce_patch")

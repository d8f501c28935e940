from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_host

import tokenreduce as tr
from tokenreduce import SpecError
from tokenreduce import visualize as vis
from tokenreduce.visualize import draw, group_image, patch_groups, visualize


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
    assert not tr.is_patched(model)
    with pytest.raises(SpecError, match="beyond"):
        draw(model, ["evit(keep=0.5, locs=(9,))"], images[:1], ["x"], tmp_path)
    assert not tr.is_patched(model)


def cell(img, r, c, patch=(2, 2)):
    return img[r * patch[0]:(r + 1) * patch[0], c * patch[1]:(c + 1) * patch[1]]


def test_group_image_draws_each_patch_at_its_grid_position():
    """A kept patch is drawn as it is, a pruned one dimmed, the patches of one merged token tinted
    with one colour; each at its own cell of the row-major grid."""
    rng = np.random.default_rng(0)
    image = rng.uniform(0.2, 1.0, size=(8, 8, 3))  # a 4 x 4 grid of 2 x 2 patches
    groups = torch.arange(16)  # every patch its own token (size 1): kept
    groups[6] = -1  # patch (1, 2) pruned
    groups[15] = 0  # patch (3, 3) merged into token 0 with patch (0, 0)
    sizes = torch.ones(16)
    sizes[0] = 2
    out = group_image(groups, sizes, (4, 4), image, (2, 2))
    assert np.allclose(cell(out, 1, 2), 0.15 * cell(image, 1, 2))  # pruned: dimmed in place
    for r, c in [(0, 1), (1, 1), (2, 3), (3, 0)]:
        assert np.array_equal(cell(out, r, c), cell(image, r, c))  # kept: unchanged
    tint = [(cell(out, r, c) - 0.45 * cell(image, r, c)) / 0.55 for r, c in [(0, 0), (3, 3)]]
    assert np.allclose(tint[0], tint[1]) and not np.allclose(cell(out, 0, 0), cell(image, 0, 0))
    assert np.allclose(tint[0], tint[0][0, 0])  # one colour over the whole cell
    changed = [(r, c) for r in range(4) for c in range(4) if not np.array_equal(cell(out, r, c), cell(image, r, c))]
    assert changed == [(0, 0), (1, 2), (3, 3)]


def test_visualize_draws_the_pruned_patches_of_each_snapshot(tmp_path, images, monkeypatch):
    """Each panel drawn for a block shows as dimmed exactly the patches that block's snapshot says are
    gone (EViT without fusion prunes them), and no other."""
    drawn = []

    def recording(groups, sizes, grid, image, patch):
        out = group_image(groups, sizes, grid, image, patch)
        drawn.append((image, out, grid, patch))
        return out

    monkeypatch.setattr(vis, "group_image", recording)
    model = make_host("deit")
    visualize(model, "evit(keep=0.5, locs=(1, 2), fuse=False)", images[:1], tmp_path)
    info = tr.get_info(model)
    p = info.host.num_prefix
    live = [int((info.snapshots[b][0, :, p:].sum(0) > 0).sum()) for b in sorted(info.snapshots)]
    assert len(drawn) == len(live) == 2 and live[0] > live[1]
    for (image, out, (gh, gw), patch), n_live in zip(drawn, live, strict=True):
        cells = [(cell(out, r, c, patch), cell(image, r, c, patch)) for r in range(gh) for c in range(gw)]
        dimmed = sum(np.allclose(o, 0.15 * i) and not np.allclose(i, 0) for o, i in cells)
        same = sum(np.array_equal(o, i) for o, i in cells)
        assert dimmed == gh * gw - n_live and same == n_live

"""imagepiece: merging only inside the inattentive set, sizes, exact schedules, identity at zero, the
documented operating points, and the benchmark's model (fmnist-vit with the conv stem)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_host

import tokenreduce as tr
from tokenreduce.core import ops
from tokenreduce.core.method import AttnInfo, Host
from tokenreduce.core.state import TokenState

DEIT_S = Host(depth=12, dim=384, num_heads=6, num_prefix=1, num_patches=196, grid=(14, 14), has_class_token=True)
FMNIST = Host(depth=6, dim=128, num_heads=4, num_prefix=1, num_patches=49, grid=(7, 7), has_class_token=True)


def counts(spec: str, host: Host) -> list[int]:
    sched = tr.build_reducer(spec).bind(host)
    return [host.num_patches, *(sched.counts[b] for b in sched.locs)]


def hand_made(n: int = 12, d: int = 8):
    """1 cls + n patches. Patches 0..5 are attentive and come in identical-key pairs (the most similar
    tokens of all, so a matching over every token would merge them first); patches 6..11 are
    inattentive with distinct keys."""
    g = torch.Generator().manual_seed(0)
    attentive = torch.randn(3, d, generator=g).repeat_interleave(2, 0)  # (6, d) pairs
    keys = torch.cat([torch.randn(1, d, generator=g), attentive, torch.randn(n - 6, d, generator=g)])  # (1 + n, d)
    attn = torch.cat([torch.tensor([0.2]), torch.full((6,), 0.1), torch.full((n - 6,), 0.01)])  # (1 + n,)
    x = torch.randn(1, 1 + n, 4, generator=g)
    info = AttnInfo(cls_attn=attn.expand(1, 2, -1), keys=keys.expand(1, 2, -1, -1))
    return x, info


def test_attentive_tokens_are_never_merged():
    x, info = hand_made()
    host = Host(depth=4, dim=8, num_heads=2, num_prefix=1, num_patches=12, grid=(3, 4), has_class_token=True)
    red = tr.build_reducer("imagepiece(locs=(0,), bottom=0.5, merge=0.25, keep=0.8)")
    sched = red.bind(host)
    assert sched.counts[0] == 9  # r = round(0.25 * 12) = 3 of the S = 6 inattentive ones, no pruning yet
    state = TokenState.start(x, 1)
    state.block = 0
    out = red.reduce(x, state, info, sched.counts[0])
    assert out.shape == (1, 10, 4)
    held = state.index[0].tolist()
    sizes = state.size[0].tolist()
    for pos in range(0, 7):  # cls and the six attentive patches: present, alone, untouched
        row = held.index(pos)
        assert sizes[row] == 1.0
        torch.testing.assert_close(out[0, row], x[0, pos])
    assert sum(sizes) == 13 and max(sizes) >= 2.0
    assert {pos for pos, s in zip(held, sizes, strict=True) if s > 1} <= set(range(7, 13))
    # the same keys matched over every patch merge the attentive pairs (cosine 1): the restriction is what holds
    plan = ops.bipartite_soft_matching(info.keys.mean(1), 3, 1)
    assert set(plan.src[0].tolist()) & set(range(1, 7))


@pytest.mark.parametrize("spec", [
    "imagepiece(locs=(0, 1, 2), keep=1.0, merge=0.1)",
    "imagepiece(locs=(0, 2), keep=1.0, rescore='same', bottom=0.5, merge=0.2)",
])
def test_sizes_add_up_to_the_patch_count_when_only_merging(spec, images):
    model = tr.apply(make_host("distilled"), spec, trace=True)
    with torch.no_grad():
        model(images)
    info = tr.get_info(model)
    p = model.num_prefix_tokens
    assert tr.build_reducer(spec).conserves_patches
    torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))
    for source in info.snapshots.values():
        torch.testing.assert_close(source[:, p:].sum((1, 2)), torch.full((3,), 64.0))


@pytest.mark.parametrize("spec", [
    "imagepiece(locs=(0, 1), merge=0.1, keep=0.7)",  # consecutive: block 1 prunes, then merges
    "imagepiece(locs=(0, 2), merge=0.1, keep=0.7, rescore='same')",
    "imagepiece(locs=(1,), bottom=0.6, merge=0.25, keep=0.5, prop_attn=False)",
])
@pytest.mark.parametrize("host", ["deit", "registers", "qknorm"])
def test_counts_per_block_equal_the_compiled_schedule(spec, host, images):
    model = tr.apply(make_host(host), spec, trace=True)
    with torch.no_grad():
        model(images)
    info = tr.get_info(model)
    p = model.num_prefix_tokens
    assert info.tokens_per_block == info.schedule.tokens_per_block(p)
    assert info.tokens_per_block[-1] < 64 + p
    torch.testing.assert_close(info.sizes, info.snapshots[max(info.snapshots)].sum(-1))


def test_zero_reduction_is_the_identity(images):
    model = make_host("deit")
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, "imagepiece(locs=(0, 1, 2), merge=0.0, keep=1.0)")
        out = model(images)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert tr.get_info(model).tokens_per_block == [65] * 4


def test_rescore_same_prunes_in_the_merging_block():
    nxt = tr.build_reducer("imagepiece(locs=(0, 2))").bind(FMNIST)
    same = tr.build_reducer("imagepiece(locs=(0, 2), rescore='same')").bind(FMNIST)
    assert nxt.locs == (0, 1, 2, 3) and same.locs == (0, 2)
    assert nxt.counts == (45, 36, 33, 27, 27, 27) and same.counts == (36, 36, 27, 27, 27, 27)


def test_documented_operating_points():
    """The counts the docstring and the imagepiece study quote."""
    assert counts("imagepiece", DEIT_S) == [196, 180, 144, 132, 106, 98, 79]
    hyper = counts("imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))", DEIT_S)
    assert hyper[-1] == 24 and abs(hyper[-1] / 196 - 0.13) < 0.01  # hyper-speed: about 13% left
    assert counts("imagepiece(locs=(1, 2, 4))", FMNIST) == [49, 45, 33, 27, 25, 20]
    assert counts("imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)", FMNIST)[-1] == 7  # 14% of 49: hyper-speed


@pytest.mark.parametrize("spec,match", [
    ("imagepiece(rescore='later', locs=(0,))", "rescore='later' is invalid"),
    ("imagepiece(locs=(3,))", "block 3 is the last of 4"),
    ("imagepiece(locs=(0,), bottom=0.1, merge=0.2)", "at most 3"),
    ("imagepiece(locs=(0,), bottom=0.0)", "bottom=0.0 is outside"),
    ("imagepiece(locs=(0,), merge=1.0)", "merge=1.0 is outside"),
    ("imagepiece(locs=(0,), keep=0.0)", "keep=0.0 is outside"),
])
def test_clear_errors(spec, match):
    with pytest.raises(tr.SpecError, match=match):
        tr.apply(make_host("deit"), spec)


def test_runs_on_the_benchmark_model_with_the_conv_stem():
    """fmnist-vit (28x28 grayscale, patch 4) with the conv stem: the 7x7 grid is kept, so the hyper-speed
    schedule compiled for 49 patches runs as compiled."""
    from tokenreduce.models import build_model
    from tokenreduce.train.recipes import get_recipe

    model = build_model({**get_recipe("fmnist-vit-short")["model"], "stem": "conv"}).eval()
    assert tuple(model.patch_embed.grid_size) == (7, 7)
    tr.apply(model, "imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7) + evit(keep=0.9, locs=(5,))")
    with torch.no_grad():
        out = model(torch.randn(2, 1, 28, 28))
    info = tr.get_info(model)
    assert out.shape == (2, 10) and info.tokens_per_block == info.schedule.tokens_per_block(1)

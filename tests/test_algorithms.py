"""Independent checks of each method's algorithm on hand-made inputs."""

from __future__ import annotations

import math

import torch

import tokenreduce as tr
from tokenreduce.core import ops
from tokenreduce.core.method import AttnInfo
from tokenreduce.core.state import TokenState


def state_for(x: torch.Tensor, p: int = 1) -> TokenState:
    return TokenState.start(x, p, trace=True)


def test_tome_identical_tokens_merge_exactly_and_sizes_add():
    # official pairing over sequence positions: cls(0, A, protected) b0(1) a0(2) b1(3) a1(4).
    # a1 points the same way as b0; a0 is orthogonal to both b's
    cls = torch.tensor([[9.0, 9.0, 9.0]])
    a0, b0, a1, b1 = torch.eye(3)[0], torch.eye(3)[1], torch.eye(3)[1], torch.eye(3)[2]
    x = torch.stack([cls[0], b0, a0, b1, a1 * 3])[None]  # a1 scaled: same direction as b0
    state = state_for(x)
    plan = ops.bipartite_soft_matching(x, r=1, num_prefix=1)
    # a1 (position 4) is merged into b0 (position 1), whose output slot follows cls and the unmerged a0
    assert plan.src.tolist() == [[4]] and plan.dst.tolist() == [[2]] and plan.dst_pos.tolist() == [[1]]
    out = state.merge(x, plan)
    # output order: prefix, unmerged A (a0), B (b0 merged with a1, b1)
    torch.testing.assert_close(out[0, 0], cls[0])
    torch.testing.assert_close(out[0, 1], a0)
    torch.testing.assert_close(out[0, 2], (b0 + 3 * a1) / 2)  # size-weighted mean, sizes 1 and 1
    torch.testing.assert_close(state.size, torch.tensor([[1.0, 1.0, 2.0, 1.0]]))
    assert state.source[0, 2, 1] == 1 and state.source[0, 2, 4] == 1


def test_tome_weighted_merge_uses_sizes_and_proportional_attention_bias():
    x = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.0, 0.0]]])  # cls, b0, a0: a0 merges into b0
    state = TokenState.start(x, 1, prop_attn=True)
    state.size = torch.tensor([[1.0, 3.0, 1.0]])
    x[0, 1] = torch.tensor([2.0, 0.0])
    out = state.merge(x, ops.bipartite_soft_matching(x, 1, 1))
    torch.testing.assert_close(out[0, 1], torch.tensor([(3 * 2.0 + 1 * 1.0) / 4, 0.0]))
    torch.testing.assert_close(state.attn_bias()[0, 0, 0], torch.log(torch.tensor([1.0, 4.0])))


def test_tome_merges_the_most_similar_pairs_first():
    torch.manual_seed(0)
    x = torch.randn(1, 1 + 8, 16)
    x[0, 6] = x[0, 5] * 2  # a2 (position 6) and b2 (position 5) point the same way: the best edge
    plan = ops.bipartite_soft_matching(x, r=1, num_prefix=1)
    # B = positions 1, 3, 5, 7; b2's output slot follows cls and the 3 unmerged A tokens (2, 4, 8)
    assert plan.src.tolist() == [[6]] and plan.dst.tolist() == [[1 + 3 + 2]] and plan.dst_pos.tolist() == [[5]]


def test_evit_fuses_the_lowest_attention_tokens_with_raw_weights():
    x = torch.arange(1, 8, dtype=torch.float32)[None, :, None].repeat(1, 1, 2)  # cls + 6 patches
    attn = torch.tensor([0.10, 0.30, 0.05, 0.20, 0.02, 0.25, 0.08])  # CLS row incl. CLS itself
    info = AttnInfo(cls_attn=attn.expand(1, 2, 7))  # two heads, same row
    reducer = tr.build_reducer("evit(keep=0.5, locs=(0,))")
    state = state_for(x)
    out = reducer.reduce(x, state, info, count=3 + 1)
    # top-3 patches by attention: patch 0 (.30), 2 (.20), 4 (.25) -> tokens 2, 4, 6; fused: 3, 5, 7
    assert out[0, :4, 0].tolist() == [1.0, 2.0, 4.0, 6.0]
    fused = 0.05 * 3 + 0.02 * 5 + 0.08 * 7
    assert math.isclose(out[0, 4, 0].item(), fused, rel_tol=1e-6)
    assert state.size[0].tolist() == [1, 1, 1, 1, 3]


def test_evit_schedule_matches_the_paper_on_deit_small():
    import timm

    model = tr.apply(timm.create_model("deit_small_patch16_224"), "evit(keep=0.7, locs=(3, 6, 9))")
    tpb = tr.get_info(model).tokens_per_block
    assert (tpb[3], tpb[6], tpb[9]) == (140, 100, 72)
    tr.apply(model, "ctp()")
    tpb = tr.get_info(model).tokens_per_block
    assert (tpb[3], tpb[7], tpb[9]) == (99, 50, 13)  # 98, 49, 12 patch tokens + CLS
    tr.apply(model, "tome(r=13)")
    assert tr.get_info(model).tokens_per_block[-1] == 197 - 12 * 13


def test_ctp_weights_heads_by_output_content_norm():
    # two heads; head 0 attends to patch 0, head 1 to patch 1; head 1's outputs have 3x the norm
    x = torch.zeros(1, 3, 4)
    cls_attn = torch.tensor([[[0.0, 0.6, 0.4], [0.0, 0.4, 0.6]]])  # (B, H, N)
    norms = torch.tensor([[[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]]])
    reducer = tr.build_reducer("ctp(counts=(1,), locs=(0,))")
    state = state_for(x)
    reducer.reduce(x, state, AttnInfo(cls_attn=cls_attn, head_norms=norms), count=1)
    # M = 0.25 * A_0 + 0.75 * A_1 -> patch 1 (index 2) wins (0.55 vs 0.45); plain head mean would tie
    assert state.index.tolist() == [[0, 2]]


def test_cls_attention_row_equals_full_attention_row():
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    full = ((q @ k.transpose(-2, -1)) * 8**-0.5).softmax(-1)[:, :, 0]
    torch.testing.assert_close(ops.cls_attention(q, k, 8**-0.5), full)


def test_random_is_seeded_and_shares_the_pattern_across_the_batch():
    from conftest import make_host

    x = torch.randn(2, 3, 32, 32)
    model = tr.apply(make_host("deit"), "random(keep=0.5, locs=(1,), seed=3)")
    model(x)
    a = tr.get_info(model).index
    tr.apply(model, "random(keep=0.5, locs=(1,), seed=3)")
    model(x)
    assert torch.equal(a, tr.get_info(model).index) and torch.equal(a[0], a[1])
    tr.apply(model, "random(keep=0.5, locs=(1,), seed=4)")
    model(x)
    assert not torch.equal(a, tr.get_info(model).index)

"""TokenState's one update path, tokens that come back (restore, unmerge, dense), the merge ops of
the core (weighted plans, matching inside a subset) and schedules that grow. Hand-made tensors."""

from __future__ import annotations

import pytest
import torch

from tokenreduce.core import ops
from tokenreduce.core.errors import SpecError, TokenReduceError
from tokenreduce.core.schedule import compile_schedule, from_counts
from tokenreduce.core.state import TokenState


def tokens(values: list[float]) -> torch.Tensor:
    """(1, N, 1) tokens whose single channel is the given value."""
    return torch.tensor(values, dtype=torch.float32)[None, :, None]


def plan(keep: list[int], src: list[int], dst: list[int], dst_pos: list[int]) -> ops.MergePlan:
    t = lambda v: torch.tensor([v], dtype=torch.long)  # noqa: E731
    return ops.MergePlan(t(keep), t(src), t(dst), t(dst_pos))


def mixed_reductions(dense: bool = True) -> tuple[TokenState, torch.Tensor]:
    """cls + 6 patches with value = position, reduced by gather, merge, fuse, gather, with the
    tokens changing between reductions as blocks would change them. Returns the state and x."""
    x = tokens([0, 1, 2, 3, 4, 5, 6])
    state = TokenState.start(x, 1, trace=True, dense=dense, keep_pruned=True)
    state.keep_mask = torch.tensor([[1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])
    x = state.gather(x, torch.tensor([[0, 1, 2, 4, 5, 6]])) + 100  # prune position 3 (value 3)
    # merge token 1 (position 1, value 101) into token 2 (position 2, value 102): slot 1 of keep
    x = state.merge(x, plan(keep=[0, 2, 3, 4, 5], src=[1], dst=[1], dst_pos=[2]))
    # keep positions 0, 2, 4; fuse positions 5 and 6 (values 105, 106) into one token
    x = state.gather_and_fuse(x, torch.tensor([[0, 1, 2]]), torch.tensor([[3, 4]]),
                              torch.tensor([[0.5, 0.25]])) + 1000
    x = state.gather(x, torch.tensor([[0, 1, 3]])) + 1  # prune position 4 (value 1104)
    return state, x


def test_every_reduction_keeps_all_aligned_fields_aligned():
    state, x = mixed_reductions()
    assert x[0, :, 0].tolist() == [1101.0, 1102.5, 1080.0]  # +1101 on 0, (101 + 102) / 2 and 79 (fused)
    assert state.index.tolist() == [[0, 2, 5]]
    assert state.size.tolist() == [[1.0, 2.0, 2.0]]
    torch.testing.assert_close(state.keep_mask, torch.tensor([[1.0, 0.9, 0.5]]))  # max of members
    assert [sorted(row.nonzero()[:, 0].tolist()) for row in state.source[0]] == [[0], [1, 2], [5, 6]]
    assert state.members.tolist() == [[0, 2, 2, -1, -1, 5, 5]]  # 3 and 4 pruned
    assert [p.fields["index"].tolist() for p in state.pruned] == [[[3]], [[4]]]


def test_restore_returns_pruned_tokens_in_place_with_their_values_at_pruning():
    state, x = mixed_reductions(dense=False)
    out = state.restore(x)
    # present tokens as they are now; pruned ones as they were when pruned (3, then 1104)
    assert out[0, :, 0].tolist() == [1101.0, 1102.5, 3.0, 1104.0, 1080.0]
    assert state.index.tolist() == [[0, 2, 3, 4, 5]]
    assert state.size.tolist() == [[1.0, 2.0, 1.0, 1.0, 2.0]]  # position 3 was pruned while unmerged
    torch.testing.assert_close(state.keep_mask, torch.tensor([[1.0, 0.9, 0.7, 0.6, 0.5]]))
    groups = [sorted(row.nonzero()[:, 0].tolist()) for row in state.source[0]]
    assert groups == [[0], [1, 2], [3], [4], [5, 6]]
    assert state.pruned == [] and state.members is None


def test_restore_of_a_batch_puts_every_token_back_at_its_original_position():
    torch.manual_seed(0)
    B, p, n, C = 3, 2, 10, 4
    x0 = torch.randn(B, p + n, C)
    state = TokenState.start(x0, p, keep_pruned=True)
    x = x0
    pruned_at = {}
    for step in range(3):  # each image drops its own 2 random tokens per step
        scores = torch.rand(B, x.shape[1] - p)
        keep, drop = ops.keep_topk(scores, x.shape[1] - p - 2, p, with_drop=True)
        for b in range(B):
            for j in drop[b].tolist():
                pruned_at[(b, state.index[b, j].item())] = x[b, j].clone()
        x = state.gather(x, keep) * (step + 2)
    out = state.restore(x)
    assert out.shape == x0.shape
    assert torch.equal(state.index, torch.arange(p + n).expand(B, -1))
    for b in range(B):
        for j in range(p + n):
            expected = pruned_at.get((b, j))
            if expected is None:  # never pruned: 2 * 3 * 4 times its start value
                expected = x0[b, j] * 24
            torch.testing.assert_close(out[b, j], expected)


def test_unmerge_copies_a_merged_token_to_every_position_it_holds():
    torch.manual_seed(1)
    B, p, n, C = 2, 1, 12, 8
    x = torch.randn(B, p + n, C)
    state = TokenState.start(x, p, trace=True, dense=True)
    for r in (4, 3, 2):
        x = state.merge(x, ops.bipartite_soft_matching(x, r, p)) + 0.5
    out = state.unmerge(x)
    assert out.shape == (B, p + n, C)
    holder = state.source.argmax(dim=1)  # (B, N0): the token whose source contains each position
    for b in range(B):
        for j in range(p + n):
            torch.testing.assert_close(out[b, j], x[b, holder[b, j]])
    assert len({tuple(v.tolist()) for v in out[0]}) == x.shape[1]  # exactly the merged tokens, copied


def test_dense_after_gather_merge_and_fuse_gives_every_position_in_original_order():
    state, x = mixed_reductions()
    out = state.dense(x)
    assert out.shape == (1, 7, 1)
    # 1 was merged into 2; 3 and 4 were pruned (their values then); 5 and 6 were fused
    assert out[0, :, 0].tolist() == [1101.0, 1102.5, 1102.5, 3.0, 1104.0, 1080.0, 1080.0]
    assert state.members.tolist() == [[0, 2, 2, 3, 4, 5, 5]] and state.pruned == []


def test_unmerge_before_restore_fills_pruned_positions_from_the_tokens_kept_aside():
    state, x = mixed_reductions()
    out = state.unmerge(x)
    assert out[0, :, 0].tolist() == [1101.0, 1102.5, 1102.5, 3.0, 1104.0, 1080.0, 1080.0]
    assert state.index.tolist() == [[0, 2, 5]]  # unmerge leaves the state as it was


def test_dense_without_reduction_is_the_identity():
    x = torch.randn(2, 1 + 6, 3)
    state = TokenState.start(x, 1, dense=True)
    assert torch.equal(state.dense(x), x)


def test_keep_mask_follows_merges_as_the_max_over_the_merged_tokens():
    torch.manual_seed(2)
    B, p, n = 2, 1, 14
    x = torch.randn(B, p + n, 6)
    mask0 = torch.cat([torch.ones(B, p), torch.rand(B, n)], 1)
    state = TokenState.start(x, p, trace=True)
    state.keep_mask = mask0
    x = state.merge(x, ops.bipartite_soft_matching(x, 5, p))
    x = state.merge(x, ops.subset_matching(x, torch.arange(p + 1, p + 9).expand(B, -1), 3))
    keep, drop = ops.keep_topk(x[:, p:, 0], 3, p, with_drop=True)
    x = state.gather_and_fuse(x, keep, drop, torch.full(drop.shape, 0.1))
    expected = (state.source * mask0[:, None, :]).amax(dim=-1)  # max over each token's members
    torch.testing.assert_close(state.keep_mask, expected)
    torch.testing.assert_close(state.size, state.source.sum(-1))
    assert x.shape[1] == state.index.shape[1] == state.keep_mask.shape[1] == p + 3 + 1


def test_weighted_merge_equals_the_hand_computation_and_sums_sizes():
    x = tokens([9.0, 2.0, 4.0, 7.0])  # cls, a0, b0, a1: merge a0 into b0 with weights 3 and 1
    state = TokenState.start(x, 1)
    state.size = torch.tensor([[1.0, 2.0, 5.0, 1.0]])
    weight = torch.tensor([[1.0, 3.0, 1.0, 1.0]])
    out = state.merge(x, plan(keep=[0, 2, 3], src=[1], dst=[1], dst_pos=[2]), weight=weight)
    assert out[0, :, 0].tolist() == [9.0, (3 * 2.0 + 1 * 4.0) / 4, 7.0]
    assert state.size.tolist() == [[1.0, 7.0, 1.0]]  # sizes summed, whatever the weight
    merged, wsum = plan(keep=[0, 2, 3], src=[1], dst=[1], dst_pos=[2]).mean(x, weight)
    assert wsum.tolist() == [[1.0, 4.0, 1.0]]
    with pytest.raises(TokenReduceError, match="one weight per token"):
        state.merge(out, plan(keep=[0, 1], src=[2], dst=[1], dst_pos=[1]), weight=torch.ones(1, 5))


def test_a_reducers_mass_is_carried_summed_by_later_merges_and_drives_proportional_attention():
    x = tokens([9.0, 2.0, 4.0, 7.0, 3.0])  # cls + 4 patches
    state = TokenState.start(x, 1, prop_attn=True, keep_pruned=True)
    x = state.merge(x, plan(keep=[0, 2, 3, 4], src=[1], dst=[1], dst_pos=[2]))  # a plain merge: mass is the size
    assert state.mass is None and state.attn_bias()[0, 0, 0].exp().tolist() == pytest.approx([1.0, 2.0, 1.0, 1.0])
    weighed = torch.tensor([[1.0, 1.75, 1.25]])  # as a reducer weighs them (DiffRate: by similarity)
    x = state.merge(x, plan(keep=[0, 1, 3], src=[2], dst=[2], dst_pos=[4]), mass=weighed)
    assert state.mass.tolist() == [[1.0, 1.75, 1.25]] and state.size.tolist() == [[1.0, 2.0, 2.0]]
    assert state.attn_bias()[0, 0, 0].exp().tolist() == pytest.approx([1.0, 1.75, 1.25])
    x = state.merge(x, plan(keep=[0, 1], src=[2], dst=[1], dst_pos=[2]))  # another stage's merge sums it
    assert state.mass.tolist() == [[1.0, 3.0]] and state.size.tolist() == [[1.0, 4.0]]


def test_restore_stands_in_the_size_for_a_mass_untracked_when_a_token_was_pruned():
    x = tokens([9.0, 2.0, 4.0, 7.0, 3.0])
    state = TokenState.start(x, 1, keep_pruned=True)
    x = state.merge(x, plan(keep=[0, 2, 3, 4], src=[1], dst=[1], dst_pos=[2]))  # sizes 1, 2, 1, 1
    x = state.gather(x, torch.tensor([[0, 1, 2]]))  # prune position 4 (size 1), no mass yet
    x = state.merge(x, plan(keep=[0, 1], src=[2], dst=[1], dst_pos=[2]), mass=torch.tensor([[1.0, 2.5]]))
    x = state.restore(x)
    assert state.index.tolist() == [[0, 2, 4]]
    assert state.mass.tolist() == [[1.0, 2.5, 1.0]] and state.size.tolist() == [[1.0, 3.0, 1.0]]


def test_subset_matching_never_touches_tokens_outside_the_subset():
    torch.manual_seed(3)
    B, p, n = 2, 1, 12
    x = torch.randn(B, p + n, 5)
    x[:, p + 0] = x[:, p + 1]  # identical tokens outside the subset: they must not merge
    subset = torch.stack([torch.tensor([3, 4, 6, 7, 9, 10, 12]), torch.tensor([2, 5, 6, 8, 9, 11, 12])])
    pl = ops.subset_matching(x, subset, 3)
    for b in range(B):
        members = set(subset[b].tolist())
        a_set, b_set = set(subset[b, 0::2].tolist()), set(subset[b, 1::2].tolist())
        assert set(pl.src[b].tolist()) <= a_set and set(pl.dst_pos[b].tolist()) <= b_set
        assert pl.keep[b].tolist() == sorted(set(range(p + n)) - set(pl.src[b].tolist()))
        assert pl.keep[b].gather(0, pl.dst[b]).tolist() == pl.dst_pos[b].tolist()
        outside = [j for j in range(p + n) if j not in members]
        assert set(outside) <= set(pl.keep[b].tolist())
    state = TokenState.start(x, p, trace=True)
    out = state.merge(x, pl)
    for b in range(B):
        for slot, j in enumerate(pl.keep[b].tolist()):
            if j not in set(subset[b].tolist()):
                assert torch.equal(out[b, slot], x[b, j])  # untouched, bit for bit
    assert torch.equal(state.size[:, p:].sum(1), torch.full((B,), float(n)))


def test_subset_matching_over_all_patches_is_bipartite_soft_matching():
    torch.manual_seed(4)
    B, p, n = 2, 1, 10
    x = torch.randn(B, p + n, 6)
    full = ops.bipartite_soft_matching(x, 4, p)
    # ToMe's sets with one prefix token: A = positions 2, 4, ..., B = 1, 3, ...; interleaved so
    # that subset[0::2] is A and subset[1::2] is B
    subset = torch.arange(p, p + n).reshape(-1, 2).flip(1).reshape(-1)  # 2, 1, 4, 3, ...
    sub = ops.subset_matching(x, subset.expand(B, -1), 4)
    assert torch.equal(sub.src, full.src) and torch.equal(sub.dst_pos, full.dst_pos)
    s1, s2 = TokenState.start(x, p), TokenState.start(x, p)
    o1, o2 = s1.merge(x, full), s2.merge(x, sub)
    order1, order2 = s1.index.argsort(1), s2.index.argsort(1)
    torch.testing.assert_close(ops.gather_tokens(o1, order1), ops.gather_tokens(o2, order2))


def test_subset_matching_bad_r_is_a_clear_error_and_zero_is_the_identity():
    x = torch.randn(1, 1 + 6, 4)
    subset = torch.tensor([[2, 3, 5]])
    with pytest.raises(TokenReduceError, match="at most 2"):
        ops.subset_matching(x, subset, 3)
    with pytest.raises(TokenReduceError, match="at most 0"):
        ops.subset_matching(x, subset[:, :1], 1)
    state = TokenState.start(x, 1)
    assert torch.equal(state.merge(x, ops.subset_matching(x, subset, 0)), x)


def test_restore_and_unmerge_say_what_they_need():
    x = torch.randn(1, 5, 2)
    state = TokenState.start(x, 1)
    with pytest.raises(TokenReduceError, match="keep_pruned=True"):
        state.restore(x)
    with pytest.raises(TokenReduceError, match="dense=True"):
        state.unmerge(x)
    with pytest.raises(TokenReduceError, match="at least one dropped token"):
        state.gather_and_fuse(x, torch.arange(5)[None], torch.zeros(1, 0, dtype=torch.long), torch.ones(1, 0))
    dense = TokenState.start(x, 1, dense=True)
    with pytest.raises(TokenReduceError, match="describes 5"):
        dense.dense(x[:, :3])


def test_nothing_extra_is_tracked_unless_asked():
    x = torch.randn(2, 1 + 8, 3)
    state = TokenState.start(x, 1)
    state.gather(x, torch.arange(5).expand(2, -1))
    assert state.pruned == [] and state.members is None and state.source is None and state.size is None
    assert TokenState.start(x, 1, dense=True).keep_pruned


def test_schedule_may_grow_when_declared_up_to_the_patch_count():
    sched = compile_schedule(16, 4, "m", where="block", counts=(8, 16), locs=(1, 3), grow=True)
    assert sched.counts == (16, 8, 8, 16)
    assert from_counts(16, 4, (4, 10), (0, 2), "block", "m", grow=True).counts == (4, 4, 10, 10)
    with pytest.raises(SpecError, match="counts cannot grow"):
        compile_schedule(16, 4, "m", where="block", counts=(8, 16), locs=(1, 3))
    with pytest.raises(SpecError, match=r"\[1, 16\].*never more than the 16 patches"):
        compile_schedule(16, 4, "m", where="block", counts=(8, 17), locs=(1, 3), grow=True)
    with pytest.raises(SpecError, match=r"\[1, 16\]"):
        compile_schedule(16, 4, "m", where="block", counts=(0,), locs=(1,), grow=True)


def test_active_is_the_one_rule_for_where_the_reducer_acts():
    sched = compile_schedule(16, 5, "m", where="attn", counts=(8, 8, 16), locs=(1, 2, 4), grow=True)
    current = 16
    acts = []
    for block in range(sched.depth):
        acts.append(sched.active(block, current))
        current = sched.counts[block]
    assert acts == [False, True, False, False, True]  # block 2 keeps 8 of 8: a no-op; block 4 grows
    assert sched.active(1, 9) and not sched.active(0, 3)

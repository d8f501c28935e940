"""Composition (core/compose.py): the contract of tests/test_contract.py for composite specs
``'A + B'``, plus what only a composite does (points, realigned scores, tokens coming back).

Each entry of COMPOSITES is a composite spec that reduces on the tiny 4-block hosts; its zero-reduction
twin is built from each stage's own ``zero``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import CLASS_TOKEN_FREE, HOSTS, make_host

import tokenreduce as tr
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core.compose import Compose, split_stages
from tokenreduce.core.method import AttnInfo, format_spec, parse_spec
from tokenreduce.core.schedule import Schedule

COMPOSITES = [
    "tome(r=4) + evit(keep=0.5, locs=(1, 2))",  # same blocks: evit reads scores after tome merged
    "evit(keep=0.5, locs=(1, 2)) + dynamicvit(keep=0.7, locs=(1, 2))",  # both points of a block, learned
    "topk(keep=0.5, locs=(1, 2)) + llf()",  # pruned at 'attn' of block 2, back at its 'block' point
    "imagepiece(locs=(0, 1), merge=0.1, keep=0.7) + evit(keep=0.5, locs=(1, 2))",
    "imagepiece(locs=(0, 1), merge=0.1, keep=0.9) + tome(r=3)",
    "imagepiece(locs=(0,), merge=0.1, keep=0.8) + dynamicvit(keep=0.7, locs=(1, 2))",
    "imagepiece(locs=(0, 1), merge=0.1, keep=0.7) + llf()",
    "imagepiece(locs=(0,), merge=0.1, keep=1.0) + tome(r=2) + topk(keep=0.7, locs=(2,))",  # three stages
]


def stages(spec: str) -> list[str]:
    return split_stages(spec)


def zero_of(spec: str) -> str:
    """The composite of each stage's zero-reduction spec."""
    return " + ".join(format_spec(name, tr.get_method(name).zero) for name, _ in map(parse_spec, stages(spec)))


def needs_cls(spec: str) -> bool:
    return tr.build_reducer(spec).needs_class_token


CASES = [(s, h) for s in COMPOSITES for h in HOSTS if not (needs_cls(s) and h in CLASS_TOKEN_FREE)]


def test_split_stages_at_top_level_plus_only():
    assert split_stages("evit(keep=0.7, locs=(3, 6, 9))") == ["evit(keep=0.7, locs=(3, 6, 9))"]
    assert split_stages(" tome(r=2) + evit(keep=0.5, locs=(1, 2))+topk ") == [
        "tome(r=2)", "evit(keep=0.5, locs=(1, 2))", "topk"]
    assert split_stages("a(x='1 + 2') + b(y=(1, 2))") == ["a(x='1 + 2')", "b(y=(1, 2))"]
    assert split_stages("tome(r=2) +") == ["tome(r=2) +"]  # does not parse: the spec parser says why


@pytest.mark.parametrize("spec", COMPOSITES)
def test_composite_spec_is_canonical_and_declares_the_union(spec):
    red = tr.build_reducer(spec)
    assert isinstance(red, Compose)
    parts = [tr.build_reducer(s) for s in stages(spec)]
    assert red.spec() == " + ".join(p.spec() for p in parts)
    assert tr.build_reducer(red.spec()).spec() == red.spec()
    assert red.needs == frozenset().union(*(p.needs for p in parts))
    assert red.keep_pruned == any(p.keep_pruned for p in parts)
    assert red.learned == any(p.learned for p in parts)
    assert red.needs_class_token == any(p.needs_class_token for p in parts)
    assert red.conserves_patches == all(p.conserves_patches for p in parts)
    assert red.proportional == any(p.proportional for p in parts)
    wheres = {p.where for p in parts}
    assert red.where == (wheres.pop() if len(wheres) == 1 else "both")
    assert Compose.budget_family(make_host("deit")) == []


@pytest.mark.parametrize("spec,host", CASES)
def test_identity_at_zero_reduction(spec, host, images):
    model = make_host(host)
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, zero_of(spec))
        out = model(images)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert tr.get_info(model).tokens_per_block == [64 + model.num_prefix_tokens] * 4


@pytest.mark.parametrize("spec,host", CASES)
def test_counts_equal_the_compiled_schedule_prefix_first_sizes_sum(spec, host, images):
    model = make_host(host)
    tr.apply(model, spec, trace=True)
    with torch.no_grad():
        out = model(images)
    info = tr.get_info(model)
    p = model.num_prefix_tokens
    assert torch.isfinite(out).all()
    assert info.tokens_per_block == info.schedule.tokens_per_block(p)
    assert info.schedule.where == tr.build_reducer(info.spec).where
    assert info.tokens_per_block != [64 + p] * 4
    assert torch.equal(info.index[:, :p], torch.arange(p).expand(3, p))
    for block, source in info.snapshots.items():
        assert source.shape[1] == info.tokens_per_block[block]
        assert (source.sum(1) <= 1).all(), "an original token belongs to at most one token"
    torch.testing.assert_close(info.sizes, info.snapshots[max(info.snapshots)].sum(-1))
    if tr.build_reducer(spec).conserves_patches or tr.build_reducer(spec).keep_pruned:
        # merged or fused, never dropped; or every pruned token restored (LLF)
        torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))


@pytest.mark.parametrize("spec", COMPOSITES)
def test_batch_invariance(spec, images):
    model = tr.apply(make_host("deit"), spec)
    with torch.no_grad():
        full = model(images)
        single = torch.cat([model(images[i: i + 1]) for i in range(len(images))])
    torch.testing.assert_close(full, single, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", COMPOSITES)
def test_apply_remove_round_trip(spec, images):
    model = make_host("deit")
    keys = set(model.state_dict())
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, spec)
        reduced = model(images)
        twin = copy.deepcopy(model)
        tr.remove(model)
        back = model(images)
    assert "forward_features" not in vars(model)
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(back, ref, rtol=0, atol=0)
    assert not torch.allclose(reduced, ref)
    assert tr.get_info(twin).spec == tr.build_reducer(spec).spec()


@pytest.mark.parametrize("spec", COMPOSITES)
def test_declared_scoring_macs_match_flop_counter(spec):
    model = tr.apply(make_host("registers"), spec)
    report = count_macs(model)
    measured = flop_counter_macs(model) - (report.total - report.scoring)
    assert abs(report.scoring - measured) <= 0.01 * measured, (report.scoring, measured)


@pytest.mark.parametrize("spec", COMPOSITES)
def test_gradients_reach_every_parameter(spec, images):
    model = tr.apply(make_host("layerscale").train(), spec)
    with tr.capture(model) as seen:  # the live record: auxiliary losses keep their graph
        out = model(images)
    loss = out.logsumexp(-1).mean() + sum(seen.last.aux_losses.values(), torch.tensor(0.0))
    loss.backward()
    missing = [n for n, prm in model.named_parameters() if prm.requires_grad and prm.grad is None]
    assert not missing, f"no gradient for {missing}"


def test_later_stage_reads_the_scores_of_the_tokens_that_reach_it(images):
    """Two top-k stages in one block keep what one top-k keeps: the second ranks the survivors by the
    same CLS attention (realigned to them), not by the first tokens' scores."""
    model = make_host("deit")
    with torch.no_grad():
        tr.apply(model, "topk(keep=0.5, locs=(1,)) + topk(keep=0.5, locs=(1,))")
        two = model(images)
        counts = tr.get_info(model).tokens_per_block
        index = tr.get_info(model).index
        tr.apply(model, "topk(counts=(16,), locs=(1,))")
        one = model(images)
    assert counts == tr.get_info(model).tokens_per_block == [65, 17, 17, 17]
    assert torch.equal(index, tr.get_info(model).index)
    torch.testing.assert_close(two, one, rtol=0, atol=0)


def test_stage_that_grows_in_the_block_it_pruned_still_acts(images):
    """Pruned at the attention point of block 2, back after its MLP: the count leaving block 2 is the
    count entering it, yet the MLP ran on half the tokens (Schedule.mid, the adapter and the MACs)."""
    model = make_host("deit")
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, "topk(keep=0.5, locs=(2,)) + llf()")
        out = model(images)
    info = tr.get_info(model)
    assert info.schedule.where == "both" and info.schedule.locs == (2,)
    assert info.schedule.point_counts(2, 64) == (32, 64)
    assert info.tokens_per_block == [65] * 4
    assert torch.equal(info.index, torch.arange(65).expand(3, -1)), "every token back at its position"
    assert not torch.allclose(out, ref)
    assert count_macs(model).blocks[2].tokens_mlp == 33
    report = count_macs(model)
    assert report.total == flop_counter_macs(model)


def test_dense_output_of_a_composite_with_llf(images):
    model = tr.apply(make_host("deit"), "imagepiece(locs=(0, 1), merge=0.1, keep=0.7) + llf()", dense=True)
    with torch.no_grad():
        assert model.forward_features(images).shape == (3, 65, 64)


def test_replay_spec_of_a_composite():
    host = make_host("deit")
    sched = tr.build_reducer("tome(r=4) + evit(keep=0.5, locs=(1, 2))").bind(tr.adapters.timm_vit.check_host(host))
    replay = Compose.replay_spec(sched)
    assert replay is not None and replay.startswith("random(")
    tr.apply(host, replay)
    assert tr.get_info(host).schedule.counts == sched.counts
    both = Schedule(64, (64, 32, 64, 64), (1, 2), "both", (64, 32, 16, 64))
    assert Compose.replay_spec(both) is None


def test_realign_follows_tokens_by_index():
    from tokenreduce.core.compose import _realign

    B, H, N = 2, 3, 5
    attn = torch.rand(B, H, N)
    keys = torch.rand(B, H, N, 4)
    probs = torch.rand(B, H, N, N)
    before = torch.tensor([[0, 1, 2, 3, 4], [0, 4, 2, 1, 3]])
    after = torch.tensor([[0, 3, 1], [0, 3, 4]])
    info = AttnInfo(cls_attn=attn, keys=keys, probs=probs)
    _realign(info, before, after, 5)
    pos = torch.tensor([[0, 3, 1], [0, 4, 1]])
    for b in range(B):
        torch.testing.assert_close(info.cls_attn[b], attn[b][:, pos[b]])
        torch.testing.assert_close(info.keys[b], keys[b][:, pos[b]])
        torch.testing.assert_close(info.probs[b], probs[b][:, pos[b]][:, :, pos[b]])


@pytest.mark.parametrize("spec,match", [
    ("tome(r=2) + nope(x=1)", "unknown method 'nope'"),
    ("tome(r=2) + evit(kep=0.5)", "unknown parameter 'kep'"),
    ("tome(r=2) +", "malformed spec"),
    ("topk(keep=0.5, locs=(0,)) + llf(at=1) + topk(keep=0.5, locs=(1,), where='block')",
     "brought tokens back there"),
    ("topk(keep=0.5, locs=(1,)) + evit(keep=0.5, locs=(5,))", "beyond the model's depth"),
    # a restoring stage that would bring nothing back
    ("llf() + llf()", "no stage acts before block 2"),
    ("llf(at=0) + topk(keep=0.5, locs=(1,))", "no stage acts before block 0"),
    ("topk(keep=0.5, locs=(1,)) + llf() + llf()", "already brought every pruned token back at block 2"),
])
def test_clear_errors(spec, match):
    with pytest.raises(tr.SpecError, match=match):
        tr.apply(make_host("deit"), spec)


def test_inspect_shows_a_composite(capsys):
    from tokenreduce.cli import main

    spec = "imagepiece(locs=(1,), merge=0.1, keep=0.9) + evit(keep=0.5, locs=(3,))"
    assert main(["inspect", "--model", "test_vit", "--img-size", "64", "--spec", spec]) == 0
    out = capsys.readouterr().out
    assert "imagepiece(locs=(1,), bottom=0.3, merge=0.1, keep=0.9" in out and " + evit(keep=0.5" in out
    assert "MACs/image unpatched" in out


def test_export_declarations_follow_the_stages():
    """A composite exports only if every stage does, and has a dynamic schedule if any stage has one."""
    a, b = tr.core.method.build_reducer("topk(keep=0.7, locs=(1,))"), tr.core.method.build_reducer("llf()")
    assert Compose([a, b]).exportable and not Compose([a, b]).dynamic_schedule
    a.exportable, b.dynamic_schedule = False, True  # as a method's class would declare
    both = Compose([a, b])
    assert not both.exportable and both.dynamic_schedule

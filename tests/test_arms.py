"""The arms a re-test of the four papers needs, as declared parameters whose defaults are today's method:
FISH's sigma, delta and iterations in ``eet``; the oracle pruner (``oracle``, supplied priorities);
Cropr's frozen random scorer; BSPF without fusion; ImagePiece's alternation order; ImagePiece in front
of DynamicViT, trained."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_host, supplied

import tokenreduce as tr
from tokenreduce import SpecError, TokenReduceError, UnsupportedModelError
from tokenreduce.adapters import timm_vit
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core import ops
from tokenreduce.core.method import AttnInfo, Host
from tokenreduce.core.state import TokenState
from tokenreduce.methods.oracle import oracle_priority, oracle_spec, patch_fractions
from tokenreduce.tasks import TaskContext, build_task, fish
from tokenreduce.tasks.eet import EETConfig

CLASSES = [str(i) for i in range(10)]


def _reducer(model):
    return timm_vit.get_patch(model).reducer


def _images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _step(model, images, labels, lr=0.1):
    """One optimizer step of the classify task over its own parameter groups; returns the losses."""
    task = build_task("classify")
    task.bind(model, TaskContext(classes=CLASSES))
    task.train()
    opt = torch.optim.SGD(task.param_groups(lr, 0.0), lr=lr)
    out = task(images, labels)
    sum(out.losses.values()).backward()
    opt.step()
    return out.losses


# ----------------------------------------------------------------------------- EET: FISH's parameters


def _codes(spec: str, labels: torch.Tensor) -> torch.Tensor:
    task = build_task(spec)
    task.bind(make_host("deit"), TaskContext(classes=CLASSES, train_labels=labels, seed=0))
    task.solve_codes()
    return task.image_codes.clone()


LABELS = torch.arange(200) % 10


def test_fish_defaults_give_the_official_targets():
    cfg = EETConfig()
    assert (cfg.fish_sigma, cfg.fish_delta, cfg.fish_iters) == (1.0, 1e-4, 15) == (fish.SIGMA, fish.DELTA, fish.ITERS)
    want = fish.fish_codes(LABELS, 8, num_classes=10, seed=0).codes  # the call before the parameters existed
    assert torch.equal(_codes("eet(bits=8, dkt=False, drg=False)", LABELS), want)


@pytest.mark.parametrize("params", [{"sigma": 0.1}, {"delta": 1.0}, {"iters": 1}])
def test_non_default_fish_parameters_change_the_targets(params):
    spec = "eet(bits=8, dkt=False, drg=False, " + ", ".join(f"fish_{k}={v!r}" for k, v in params.items()) + ")"
    got = _codes(spec, LABELS)
    assert torch.equal(got, fish.fish_codes(LABELS, 8, num_classes=10, seed=0, **params).codes)
    assert not torch.equal(got, fish.fish_codes(LABELS, 8, num_classes=10, seed=0).codes)


@pytest.mark.parametrize("spec,match", [
    ("eet(fish_sigma=0)", "fish_sigma must be a finite number > 0"),
    ("eet(fish_delta=-1e-4)", "fish_delta must be a finite number > 0"),
    ("eet(fish_iters=0)", "fish_iters must be an integer >= 1"),
    ("eet(fish_iters=2.5)", "fish_iters takes an int"),
])
def test_bad_fish_parameters_are_spec_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        build_task(spec)
    with pytest.raises(SpecError, match="fish_sigma"):
        EETConfig(fish_sigma=float("nan"))


# ----------------------------------------------------------------------------- the oracle


def test_patch_fractions_by_grid_and_by_patch_size():
    masks = torch.zeros(2, 8, 8, dtype=torch.bool)
    masks[0, :4, :4] = True  # the top-left patch of a 2 x 2 grid, whole
    masks[1, 4:, 4:6] = True  # half of the bottom-right patch
    want = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]])
    torch.testing.assert_close(patch_fractions(masks, (2, 2)), want)
    torch.testing.assert_close(patch_fractions(masks, patch_size=4), want)
    torch.testing.assert_close(patch_fractions(masks.float(), 2), want)
    with pytest.raises(TokenReduceError, match="exactly one"):
        patch_fractions(masks)
    with pytest.raises(TokenReduceError, match="do not split"):
        patch_fractions(masks, patch_size=3)


def _object_masks() -> tuple[torch.Tensor, list[list[int]]]:
    """Masks (3, 32, 32) at the input's resolution (4-pixel patches, an 8 x 8 grid) and each image's
    object patches: image 0 a 2 x 3 block, image 1 a diagonal, image 2 one patch partly covered."""
    masks = torch.zeros(3, 32, 32, dtype=torch.bool)
    masks[0, 8:16, 20:32] = True  # patch rows 2-3, columns 5-7
    for i in range(6):
        masks[1, 4 * i:4 * i + 4, 4 * i:4 * i + 4] = True
    masks[2, 28:30, 0:4] = True  # half of patch (7, 0)
    objects = [sorted(r * 8 + c for r in (2, 3) for c in (5, 6, 7)), [9 * i for i in range(6)], [56]]
    return masks, objects


def test_the_oracle_keeps_exactly_the_object_patches(images):
    masks, objects = _object_masks()
    prio = patch_fractions(masks, patch_size=4)  # (3, 64)
    for i, obj in enumerate(objects):
        model = tr.apply(make_host("deit"), f"oracle(counts=({len(obj)},), locs=(1,))")
        with torch.no_grad(), oracle_priority(model, prio[i:i + 1]):
            model(images[i:i + 1])
        assert (tr.get_info(model).index[0, 1:] - 1).tolist() == obj
    # more tokens than object patches: the object first, then the lowest patch indices (ties='index')
    model = tr.apply(make_host("registers"), "oracle(counts=(8,), locs=(1,), where='attn')")
    with torch.no_grad(), oracle_priority(model, prio):
        model(images)
    kept = (tr.get_info(model).index[:, 3:] - 3).tolist()
    assert kept[0] == sorted([0, 1] + objects[0])
    assert kept[1] == sorted({1, 2} | set(objects[1]))  # patch 0 is on the object
    assert kept[2] == [0, 1, 2, 3, 4, 5, 6, 56]


def test_a_later_block_keeps_by_the_patches_the_tokens_stem_from(images):
    masks, objects = _object_masks()
    model = tr.apply(make_host("deit"), "oracle(counts=(32, 6, 2), locs=(0, 1, 2))", trace=True)
    with torch.no_grad(), oracle_priority(model, patch_fractions(masks, patch_size=4)):
        model(images)
    info = tr.get_info(model)
    assert (info.index[0, 1:] - 1).tolist() == objects[0][:2]
    assert (info.snapshots[1][0, 1:, 1:].nonzero()[:, 1]).tolist() == objects[0]


def test_ties_by_class_attention_keep_what_topk_keeps(images):
    spec = "counts=(24, 8), locs=(1, 2), where='block'"
    oracle = tr.apply(make_host("deit"), f"oracle({spec}, ties='cls_attn')")
    topk = tr.apply(make_host("deit"), f"topk({spec})")
    with torch.no_grad(), oracle_priority(oracle, torch.zeros(64)):  # no object anywhere: attention decides
        out = oracle(images)
        want = topk(images)
    assert torch.equal(tr.get_info(oracle).index, tr.get_info(topk).index)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    with pytest.raises(UnsupportedModelError, match="class token"):
        tr.apply(make_host("avgpool"), f"oracle({spec}, ties='cls_attn')")


def test_without_a_priority_the_oracle_refuses(images):
    model = tr.apply(make_host("deit"), "oracle(counts=(16,), locs=(1,))")
    with pytest.raises(TokenReduceError, match=r"no token priority was supplied.*oracle_priority"):
        model(images)
    with oracle_priority(model, torch.rand(64)):
        model(images)
    with pytest.raises(TokenReduceError, match="no token priority"):  # the context took it back
        model(images)
    with pytest.raises(TokenReduceError, match=r"must be \(B, 64\) or \(64,\)"), oracle_priority(model, torch.rand(49)):
        pass
    with pytest.raises(TokenReduceError, match="holds 2 images but the forward has 3"), \
            oracle_priority(model, torch.rand(2, 64)):
        model(images)
    with pytest.raises(TokenReduceError, match="NaN"), oracle_priority(model, torch.full((64,), float("nan"))):
        pass
    with pytest.raises(TokenReduceError, match="runs no oracle"), oracle_priority(make_host("deit"), torch.rand(64)):
        pass
    with pytest.raises(SpecError, match="give the schedule"):
        tr.apply(make_host("deit"), "oracle")


def test_the_oracle_at_a_methods_schedule_and_its_declarations(images):
    ctp = tr.apply(make_host("deit"), "ctp(counts=(32, 16), locs=(1, 2))")
    spec = oracle_spec(tr.get_info(ctp).schedule)
    assert spec == "oracle(counts=(32, 16), locs=(1, 2), where='block', ties='index')"
    model = tr.apply(make_host("deit"), spec)
    assert tr.get_info(model).tokens_per_block == tr.get_info(ctp).tokens_per_block
    assert count_macs(model).scoring == 0  # reads nothing from the attention
    assert set(model.state_dict()) == set(make_host("deit").state_dict())  # the priority is never saved
    assert not tr.get_method("oracle").budget_family(timm_vit.check_host(model))
    assert not tr.build_reducer(spec).exportable
    twin = copy.deepcopy(model)
    with oracle_priority(model, torch.rand(64)), pytest.raises(TokenReduceError, match="no token priority"):
        twin(images)  # a copy is another model: it has its own (empty) priority


# ----------------------------------------------------------------------------- Cropr: the frozen random scorer


def test_a_frozen_router_is_never_trained_and_the_backbone_is():
    model = tr.apply(make_host("layerscale"), "cropr(r=8, queries=3, frozen=True)")
    reducer = _reducer(model)
    assert not reducer.learned and tr.get_method("cropr").learned
    assert not list(reducer.parameters())  # queries are buffers: no gradient, in no optimizer
    router = {k: v.clone() for k, v in reducer.state_dict().items()}
    assert set(router) == {f"stages.{i}.queries" for i in range(3)}
    backbone = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = _step(model, _images(4), torch.tensor([0, 3, 9, 1]))
    assert set(losses) == {"ce"} and tr.get_info(model).aux_outputs == {}  # no auxiliary head, no aux loss
    assert tr.get_info(model).tokens_per_block == [56, 48, 40, 40]  # pruned as the learned router prunes
    assert all(torch.equal(v, reducer.state_dict()[k]) for k, v in router.items())
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, backbone[n])]
    assert "blocks.0.attn.qkv.weight" in changed and "head.weight" in changed


def test_a_frozen_router_scores_as_the_learned_one_at_its_start(images):
    torch.manual_seed(0)
    learned = tr.apply(make_host("deit"), "cropr(r=8, classes=10, queries=2)")
    torch.manual_seed(0)
    frozen = tr.apply(make_host("deit"), "cropr(r=8, queries=2, frozen=True)")
    a, b = _reducer(learned).stages[0], _reducer(frozen).stages[0]
    assert torch.equal(a.queries.detach(), b.queries)  # the same initialisation, the same draw
    x = torch.randn(3, 65, 64)
    for mode in (True, False):  # the training-mode score is the deployed one, X q
        frozen.train(mode)
        with torch.no_grad():
            frozen(images)
        torch.testing.assert_close(_reducer(frozen).token_scores(x, 0), x[:, 1:] @ b.collapsed())
    deployed = copy.deepcopy(frozen).eval()
    from tokenreduce.models import deploy

    deploy(deployed)
    with torch.no_grad():
        torch.testing.assert_close(deployed(images), frozen.eval()(images), rtol=1e-5, atol=1e-5)
    with pytest.raises(SpecError, match="give one of them"):
        tr.apply(make_host("deit"), "cropr(r=8, frozen=True, inference=True)")


# ----------------------------------------------------------------------------- BSPF without fusion


def _bspf(spec: str, images):
    model = tr.apply(make_host("deit"), spec, trace=True)
    with torch.no_grad():
        out = model(images)
    return model, out, tr.get_info(model)


def test_bspf_without_fusion_prunes_the_same_tokens_and_drops_them(images):
    base = "bspf(size=24, keep=0.5, locs=(1,))"
    _, fused_out, fused = _bspf(base, images)
    _, same_out, same = _bspf("bspf(size=24, keep=0.5, locs=(1,), fuse=True)", images)
    model, out, dropped = _bspf("bspf(size=24, keep=0.5, locs=(1,), fuse=False)", images)
    torch.testing.assert_close(same_out, fused_out, rtol=0, atol=0)  # the default is the fused reading
    assert dropped.tokens_per_block == fused.tokens_per_block == [65, 33, 33, 33]
    assert torch.equal(dropped.index, fused.index)  # the same kept tokens
    assert not torch.allclose(out, fused_out)
    assert torch.equal(dropped.sizes, torch.ones(3, 33)) and fused.sizes[:, 1:].sum(1).eq(64).all()
    reducer = _reducer(model)
    assert not reducer.learned and not reducer.conserves_patches and not reducer.kernel.requires_grad
    report = count_macs(model)
    measured = flop_counter_macs(model) - (report.total - report.scoring)
    assert report.scoring == measured  # the kernel only: no cosines, no Hamming products


def test_bspf_without_fusion_keeps_the_counts_of_several_blocks(images):
    _, _, fused = _bspf("bspf(size=24, keep=0.5, locs=(1, 2))", images)
    _, _, dropped = _bspf("bspf(size=24, keep=0.5, locs=(1, 2), fuse=False)", images)
    assert dropped.tokens_per_block == fused.tokens_per_block == [65, 33, 17, 17]


# ----------------------------------------------------------------------------- ImagePiece: the alternation order


def _inattentive(n: int = 12, d: int = 8):
    """1 cls + n patches, all inattentive with distinct attention (patch j draws 0.01 * (n - j) / n, so
    the raster order is the reverse of the score order) and random keys."""
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(1 + n, d, generator=g)
    attn = torch.cat([torch.tensor([0.5]), 0.01 * (n - torch.arange(n)) / n])
    x = torch.randn(1, 1 + n, 4, generator=g)
    return x, AttnInfo(cls_attn=attn.expand(1, 2, -1), keys=keys.expand(1, 2, -1, -1))


def _merged(spec: str, x, info, subset=None):
    host = Host(depth=4, dim=8, num_heads=2, num_prefix=1, num_patches=12, grid=(3, 4), has_class_token=True)
    red = tr.build_reducer(spec)
    sched = red.bind(host)
    state = TokenState.start(x, 1)
    state.block = 0
    if subset is None:
        out = red.reduce(x, state, info, sched.counts[0])
    else:  # the reference: the same matching over the subset in the given order
        out = state.merge(x, ops.subset_matching(info.keys.mean(1), subset, 3))
    return out, state.index.clone(), state.size.clone()


@pytest.mark.parametrize("order,subset", [
    ("spatial", list(range(1, 13))),
    ("score", list(range(12, 0, -1))),  # least attended first: the last patch
])
def test_the_order_decides_which_tokens_pair(order, subset):
    x, info = _inattentive()
    spec = f"imagepiece(locs=(0,), bottom=1.0, merge=0.25, keep=1.0, rescore='same', order={order!r})"
    got = _merged(spec, x, info)
    want = _merged(spec, x, info, torch.tensor([subset]))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    default = _merged(spec.replace(f", order={order!r}", ""), x, info)
    spatial = _merged(spec.replace(f"order={order!r}", "order='spatial'"), x, info)
    assert all(torch.equal(a, b) for a, b in zip(default, spatial, strict=True))  # the default is today's
    if order != "spatial":
        assert not torch.equal(got[1], spatial[1]), "the alternative must pair other tokens"


def test_random_order_is_seeded_fixed_and_pairs_other_tokens():
    x, info = _inattentive()
    spec = "imagepiece(locs=(0,), bottom=1.0, merge=0.25, keep=1.0, rescore='same', order='random'"
    a, b = _merged(spec + ", seed=0)", x, info), _merged(spec + ", seed=0)", x, info)
    other = _merged(spec + ", seed=1)", x, info)
    spatial = _merged(spec.replace("random", "spatial") + ")", x, info)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    assert not torch.equal(a[1], spatial[1]) or not torch.equal(other[1], spatial[1])


@pytest.mark.parametrize("order", ["score", "random"])
def test_every_order_keeps_the_schedule_and_batch_invariance(order, images):
    spec = f"imagepiece(locs=(0, 1), merge=0.1, keep=0.7, order={order!r})"  # block 1 prunes, then merges
    model = tr.apply(make_host("distilled"), spec, trace=True)
    ref = tr.apply(make_host("distilled"), spec.replace(order, "spatial"))
    with torch.no_grad():
        out = model(images)
        single = torch.cat([model(images[i:i + 1]) for i in range(3)])
        spatial = ref(images)
    info = tr.get_info(model)
    assert info.tokens_per_block == info.schedule.tokens_per_block(2) == tr.get_info(ref).tokens_per_block
    torch.testing.assert_close(out, single, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(out, spatial)
    with pytest.raises(SpecError, match="order='zigzag' is invalid"):
        tr.apply(make_host("deit"), "imagepiece(locs=(0,), order='zigzag')")


# ----------------------------------------------------------------------------- ImagePiece in front of DynamicViT


def test_imagepiece_in_front_of_dynamicvit_trains():
    torch.manual_seed(0)
    spec = "imagepiece(locs=(0,), merge=0.1, keep=0.8) + dynamicvit(keep=0.7, locs=(1, 2))"
    model = tr.apply(make_host("deit"), spec)
    predictors = {n: p.detach().clone() for n, p in model.named_parameters() if ".predictors." in n}
    assert predictors
    losses = _step(model, _images(4), torch.tensor([0, 3, 9, 1]))
    assert {"ce", "aux/ratio"} <= set(losses)
    grads = {n: p.grad for n, p in model.named_parameters() if ".predictors." in n}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for stage in (".predictors.0.", ".predictors.1."):  # both DynamicViT predictors learn
        assert sum(float(g.abs().sum()) for n, g in grads.items() if stage in n) > 0
        assert any(not torch.equal(p, predictors[n]) for n, p in model.named_parameters() if stage in n)
    model.eval()
    with torch.no_grad():
        model(_images(2))
    info = tr.get_info(model)
    assert info.tokens_per_block == info.schedule.tokens_per_block(1)  # inference: tokens really dropped


# ----------------------------------------------------------------------------- the suite's hook


def test_the_suite_supplies_what_a_method_declares(images):
    model = tr.apply(make_host("deit"), "oracle(counts=(16,), locs=(1,))")
    with supplied(model):
        model(images)
    with pytest.raises(TokenReduceError, match="no token priority"):
        model(images)

"""DynamicViT: schedule, training-mode masking, the masked attention, gradients, state_dict."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_host

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import _attention
from tokenreduce.core.method import Host
from tokenreduce.core.ops import policy_softmax
from tokenreduce.core.state import TokenState
from tokenreduce.methods.dynamicvit import convert_official_checkpoint

SPEC = "dynamicvit(keep=0.5, locs=(1, 2))"


def predictor_params(model):
    return {n: p for n, p in model.named_parameters() if n.startswith("tokenreduce.")}


def test_official_schedule_on_deit_small():
    reducer = tr.build_reducer("dynamicvit")
    host = Host(depth=12, dim=384, num_heads=6, num_prefix=1, num_patches=196, grid=(14, 14),
                has_class_token=True)
    sched = reducer.bind(host)
    assert sched.locs == (2, 5, 8) and sched.where == "block"
    assert [sched.tokens_per_block(1)[i] for i in sched.locs] == [138, 97, 68]


def test_eval_counts_and_topk_by_keep_score(images):
    model = tr.apply(make_host("deit"), "dynamicvit(keep=0.5, locs=(1,))")
    scores = []
    model.tokenreduce.predictors[0].register_forward_hook(lambda m, i, o: scores.append(o[..., 0]))
    with torch.no_grad():
        model(images)
    info = tr.get_info(model)
    assert info.tokens_per_block == [65, 33, 33, 33] == info.schedule.tokens_per_block(1)
    top = scores[0].topk(32, dim=1).indices.sort(dim=1).values + 1
    assert torch.equal(info.index[:, 1:], top)
    assert info.keep_mask is None and info.aux_losses == {}


def test_training_keeps_all_tokens_and_emits_the_ratio_loss(images):
    torch.manual_seed(0)
    model = tr.apply(make_host("registers").train(), "dynamicvit(keep=0.5, locs=(1,), ratio_weight=2.0)")
    model(images)
    info = tr.get_info(model)
    assert info.tokens_per_block == [67] * 4
    mask = info.keep_mask  # (B, N)
    assert mask.shape == (3, 67) and torch.equal(mask[:, :3], torch.ones(3, 3))
    assert set(mask.unique().tolist()) <= {0.0, 1.0}
    expected = 2.0 * ((mask[:, 3:].mean(1) - 0.5) ** 2).mean()
    torch.testing.assert_close(info.aux_losses["ratio"], expected)


def test_keep_one_is_identity_in_eval_and_training(images):
    for train in (False, True):
        model = make_host("deit").train(train)
        with torch.no_grad():
            ref = model(images)
            tr.apply(model, "dynamicvit(keep=1.0, locs=(1, 2))")
            out = model(images)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        info = tr.get_info(model)
        assert info.keep_mask is None and info.aux_losses == {}


@pytest.mark.parametrize("loss_name", ["ratio", "task"])
def test_gradients_reach_every_predictor(loss_name, images):
    torch.manual_seed(0)
    model = tr.apply(make_host("deit").train(), SPEC)
    with tr.capture(model) as seen:  # the live record: the ratio loss keeps its graph
        logits = model(images)
    if loss_name == "ratio":
        loss = seen.last.aux_losses["ratio"]
    else:  # reaches the predictors only through the masked attention
        loss = F.cross_entropy(logits, torch.tensor([1, 2, 3]))
    loss.backward()
    for stage in range(2):
        grads = [p.grad for n, p in predictor_params(model).items() if n.startswith(f"tokenreduce.predictors.{stage}.")]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert sum(g.abs().sum() for g in grads) > 0, f"no {loss_name} gradient for stage {stage}"


def _qkv(seed: int = 0, B: int = 2, H: int = 2, N: int = 7, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, d, generator=g) for _ in range(3))


def test_policy_softmax_with_all_ones_is_sdpa():
    q, k, v = _qkv()
    probs = policy_softmax((q * 8**-0.5) @ k.transpose(-2, -1), torch.ones(2, 7))
    torch.testing.assert_close(probs @ v, F.scaled_dot_product_attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_masked_attention_path_with_all_ones_equals_the_fused_path():
    blk = make_host("qknorm").blocks[0]
    x = torch.randn(2, 65, 64)
    state = TokenState.start(x, 1)
    fused, _ = _attention(blk.attn, x, state, frozenset({"cls_attn"}))
    state.keep_mask = torch.ones(2, 65)
    masked, info = _attention(blk.attn, x, state, frozenset({"cls_attn"}))
    torch.testing.assert_close(masked, fused, rtol=1e-5, atol=1e-5)
    assert info.cls_attn.shape == (2, 2, 65)


def test_a_zero_policy_entry_hides_that_token_from_every_other():
    q, k, v = _qkv()
    policy = torch.ones(2, 7)
    policy[:, 3] = 0.0
    probs = policy_softmax(k @ q.transpose(-2, -1), policy)
    others = torch.arange(7) != 3
    assert probs[..., others, 3].abs().max() < 1e-6
    assert (probs[..., 3, 3] > 1e-3).all(), "a masked token still attends to itself"
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 7))
    # through the adapter: changing the masked token changes no other token's output
    blk = make_host("deit").blocks[0]
    x = torch.randn(1, 65, 64)
    state = TokenState.start(x, 1)
    state.keep_mask = torch.ones(1, 65)
    state.keep_mask[:, 5] = 0.0
    out, _ = _attention(blk.attn, x, state, frozenset())
    x2 = x.clone()
    x2[:, 5] = torch.randn(64)
    out2, _ = _attention(blk.attn, x2, state, frozenset())
    keep = torch.arange(65) != 5
    torch.testing.assert_close(out2[:, keep], out[:, keep], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out2[:, 5], out[:, 5])


def test_gradient_reaches_a_zero_policy_entry():
    q, k, v = _qkv()
    policy = torch.ones(2, 7)
    policy[:, 3] = 0.0
    policy.requires_grad_(True)
    (policy_softmax(q @ k.transpose(-2, -1), policy) @ v).square().sum().backward()
    assert torch.isfinite(policy.grad).all() and (policy.grad[:, 3] != 0).all()


def test_state_dict_round_trip_and_remove(images):
    plain_keys = set(make_host("deit").state_dict())
    torch.manual_seed(1)
    model = tr.apply(make_host("deit"), SPEC)
    saved = model.state_dict()
    assert set(saved) - plain_keys == set(predictor_params(model))
    with torch.no_grad():
        ref = model(images)
        torch.manual_seed(2)
        fresh = tr.apply(make_host("deit", seed=3), SPEC)
        assert not torch.allclose(fresh(images), ref)
        fresh.load_state_dict(saved)
        torch.testing.assert_close(fresh(images), ref, rtol=0, atol=0)
    tr.remove(fresh)
    assert set(fresh.state_dict()) == plain_keys


def test_apply_follows_the_models_mode():
    model = tr.apply(make_host("deit").eval(), SPEC)
    assert not model.tokenreduce.training
    model.train()
    assert model.tokenreduce.training


def official_predictor_keys(stage: int, dim: int) -> dict[str, tuple[int, ...]]:
    """The state_dict keys and shapes of stage ``stage``'s predictor in an official DynamicViT ViT
    checkpoint, written out by hand from github.com/raoyongming/DynamicViT, models/dyvit.py:
    ``VisionTransformerDiffPruning.score_predictor = nn.ModuleList(PredictorLG(embed_dim) ...)``, one
    per pruning location, and ``PredictorLG`` = ``in_conv = Sequential(LayerNorm(C), Linear(C, C),
    GELU())``, ``out_conv = Sequential(Linear(C, C // 2), GELU(), Linear(C // 2, C // 4), GELU(),
    Linear(C // 4, 2), LogSoftmax(dim=-1))``; GELU and LogSoftmax hold no parameters."""
    p = f"score_predictor.{stage}."
    shapes = {
        "in_conv.0.weight": (dim,), "in_conv.0.bias": (dim,),
        "in_conv.1.weight": (dim, dim), "in_conv.1.bias": (dim,),
        "out_conv.0.weight": (dim // 2, dim), "out_conv.0.bias": (dim // 2,),
        "out_conv.2.weight": (dim // 4, dim // 2), "out_conv.2.bias": (dim // 4,),
        "out_conv.4.weight": (2, dim // 4), "out_conv.4.bias": (2,),
    }
    return {p + k: v for k, v in shapes.items()}


def test_convert_official_checkpoint():
    """An official checkpoint (its backbone keys are timm's; its predictors as the official model
    names them, with their own values) loads strictly into the patched model, each tensor where it belongs."""
    model = tr.apply(make_host("deit"), SPEC)
    backbone = make_host("deit", seed=1).state_dict()
    gen = torch.Generator().manual_seed(0)
    predictors = {k: torch.randn(shape, generator=gen) for s in range(2)
                  for k, shape in official_predictor_keys(s, model.embed_dim).items()}
    converted = convert_official_checkpoint({"model": {**backbone, **predictors}})
    model.load_state_dict(converted)  # strict: no key missing, none left over, every shape fits
    reducer = tr.reducer_of(model)
    for s in range(2):
        got = dict(reducer.predictors[s].named_parameters())
        for k, v in predictors.items():
            if k.startswith(f"score_predictor.{s}."):
                assert torch.equal(got[k.removeprefix(f"score_predictor.{s}.")], v), k
    assert torch.equal(model.blocks[0].attn.qkv.weight, backbone["blocks.0.attn.qkv.weight"])


@pytest.mark.parametrize("params", ["keep=0.0", "tau=0.0", "ratio_weight=-1.0", "keep=0.01"])
def test_bad_specs(params):
    with pytest.raises(tr.SpecError, match="dynamicvit"):
        tr.apply(make_host("deit"), f"dynamicvit({params}, locs=(1, 2))")

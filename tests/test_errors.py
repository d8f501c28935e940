"""Bad input: each raises one clear error naming the problem and the valid choices."""

from __future__ import annotations

import pytest
import torch
from conftest import make_host

import tokenreduce as tr


@pytest.mark.parametrize(
    "spec,words",
    [
        ("nope(r=1)", ["unknown method 'nope'", "tome", "evit"]),
        ("tome(r=", ["malformed spec"]),
        ("tome(13)", ["must be named"]),
        ("tome(r=__import__('os'))", ["not a literal"]),
        ("evit(keep=1.5)", ["keep=1.5", "(0, 1]"]),
        ("evit(keep=0)", ["outside (0, 1]"]),
        ("evit(kep=0.5)", ["unknown parameter 'kep'", "keep, locs, fuse"]),
        ("random(r=70)", ["r=70 is too large", "at most"]),  # tome clips r as official ToMe does
        ("evit(keep=0.7, locs=(1, 12))", ["block index 12", "depth 4", "0..3"]),
        ("random(keep=0.5, r=3)", ["exactly one of"]),
        ("topk(keep=0.5, locs=(2, 1))", ["strictly increasing"]),
        ("ctp(counts=(10, 20), locs=(1, 2))", ["keep 20 of 10"]),
        ("random(keep=0.5, locs=(1,), where='mlp')", ["'attn' or 'block'"]),
        ("", ["non-empty"]),
    ],
)
def test_bad_specs_raise_clear_errors(spec, words):
    model = make_host("deit")
    with pytest.raises(tr.SpecError) as e:
        tr.apply(model, spec)
    for w in words:
        assert w in str(e.value)
    assert not hasattr(model, "_tokenreduce_patch"), "a failed apply must leave the model untouched"


def test_non_vit_model_is_refused():
    with pytest.raises(tr.UnsupportedModelError, match="timm VisionTransformer"):
        tr.apply(torch.nn.Linear(3, 3), "tome(r=1)")


def test_unsupported_block_type_is_refused():
    import timm

    model = timm.create_model("vit_small_patch16_224", img_size=32, patch_size=4, depth=2, embed_dim=64,
                              num_heads=2, block_fn=timm.models.vision_transformer.ResPostBlock)
    with pytest.raises(tr.UnsupportedModelError, match="ResPostBlock"):
        tr.apply(model, "tome(r=1)")


def test_cls_methods_need_a_class_token():
    """A class-token score on a model without one: refused in one line naming the method, the model and the
    scores that need none (without ``score`` the pruner takes one of those: tests/test_scores.py)."""
    with pytest.raises(tr.UnsupportedModelError, match=r"^evit scores tokens by class-token attention but "
                       r"VisionTransformer has no class token; give it score='shift' or score='received'"):
        tr.apply(make_host("avgpool"), "evit(keep=0.5, locs=(1,), score='cls')")


def test_an_attention_pool_head_other_than_siglips_is_refused_by_name():
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, class_token=False,
                              global_pool="prr")
    with pytest.raises(tr.UnsupportedModelError, match="AttentionPoolPrr is not supported; supported: "
                                                       "AttentionPoolLatent"):
        tr.apply(model, "tome(r=2)")


def test_wrong_resolution_is_a_clear_error():
    model = tr.apply(make_host("deit"), "tome(r=2)")
    with pytest.raises(tr.TokenReduceError, match="input resolution 48x48 does not match the 32x32"):
        model(torch.randn(1, 3, 48, 48))


def test_remove_of_an_unpatched_model_is_an_error():
    with pytest.raises(tr.TokenReduceError, match="not patched"):
        tr.remove(make_host("deit"))


def test_parse_spec_is_literal_only():
    assert tr.parse_spec("evit(keep=0.7, locs=[3, 6, 9])") == ("evit", {"keep": 0.7, "locs": (3, 6, 9)})
    assert tr.parse_spec("tome") == ("tome", {})

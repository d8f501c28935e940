"""Scores that need neither a class token nor an attention map (core/scores.py), and the hosts without a
class token they serve: timm's SigLIP (attention-pool head) here; transformers' SiglipVisionModel in
tests/test_hf_host.py; every method on both in the contract matrices."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer
from torch.utils._python_dispatch import TorchDispatchMode

import tokenreduce as tr
from tokenreduce.core.attention import received_attention

PRUNERS = ["topk(keep=0.5, locs=(1, 2))", "evit(keep=0.5, locs=(1, 2))", "ctp(counts=(32, 16), locs=(1, 2))"]


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def with_score(spec: str, score: str) -> str:
    return f"{spec[:-1]}, score='{score}')"


def test_received_attention_is_the_column_mean_of_the_softmax():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 37, 8, generator=g), torch.randn(2, 3, 37, 8, generator=g)
    bias = torch.randn(2, 1, 1, 37, generator=g)
    dense = ((q @ k.transpose(-2, -1)) * 0.3 + bias).softmax(-1).mean(-2)  # (B, H, N)
    torch.testing.assert_close(received_attention(q, k, 0.3, bias), dense)
    full = torch.randn(2, 3, 37, 37, generator=g)  # a per-query bias is sliced per chunk
    torch.testing.assert_close(received_attention(q, k, 0.3, full), ((q @ k.transpose(-2, -1)) * 0.3 + full)
                               .softmax(-1).mean(-2))


@pytest.mark.parametrize("spec", PRUNERS)
def test_the_default_score_is_cls_with_a_class_token_and_the_shift_without(spec, images):
    """score=None is 'cls' where the host has a class token (the published score, the spec unchanged) and
    the representation shift where it has none, named in the bound spec (get_info)."""
    for host, score in (("deit", "cls"), ("siglip", "shift")):
        model = make_host(host)
        with torch.no_grad():
            tr.apply(model, with_score(spec, score))
            explicit = model(images)
            tr.apply(model, spec)
            default = model(images)
        torch.testing.assert_close(default, explicit, rtol=0, atol=0)
        named = tr.get_info(model).spec
        assert ("score" not in named) if score == "cls" else (f"score='{score}'" in named), named
        tr.apply(model, named)  # the named spec rebuilds what ran
        with torch.no_grad():
            torch.testing.assert_close(model(images), explicit, rtol=0, atol=0)


def test_topk_by_shift_keeps_the_tokens_whose_branch_moved_them_most(images):
    """At the 'block' point the shift is ||MLP branch|| (the paper's layer): the kept tokens are the top
    ones by that norm, read here from the host's own modules with a hook."""
    model = make_host("siglip")
    blk = model.blocks[1]
    seen = {}
    blk.mlp.register_forward_hook(lambda m, a, out: seen.setdefault("mlp", out))
    tr.apply(model, "topk(counts=(16,), locs=(1,), where='block', score='shift')")
    with torch.no_grad():
        model(images)
    shift = blk.ls2(seen["mlp"]).norm(dim=-1)  # (B, 64): drop path is the identity in eval
    want = shift.topk(16, dim=1).indices.sort(dim=1).values
    assert torch.equal(tr.get_info(model).index, want)


def test_received_attention_changes_what_is_kept(images):
    model = make_host("siglip")
    kept = {}
    for score in ("shift", "received"):
        tr.apply(model, f"topk(keep=0.5, locs=(1, 2), score='{score}')")
        with torch.no_grad():
            model(images)
        kept[score] = tr.get_info(model).index
    assert not torch.equal(kept["shift"], kept["received"])


class Shapes(TorchDispatchMode):
    """Records the shape of every tensor an operator returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


def square(model: torch.nn.Module, images: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """The operator outputs of a forward whose last two dims are both a token count of that forward."""
    with torch.no_grad(), Shapes() as rec:
        model(images)
    counts = set(tr.get_info(model).tokens_per_block) | {64}
    return [(f, s) for f, s in rec.shapes if len(s) >= 2 and s[-1] == s[-2] and s[-1] in counts]


@pytest.mark.parametrize("spec", [with_score(s, score) for s in PRUNERS for score in ("shift", "received")])
def test_class_token_free_scores_never_build_an_n_by_n_tensor(spec, images):
    """No operator of the forward returns a (..., N, N) tensor: the attention stays fused (SDPA) and the mean
    attention received is formed in query chunks. Width 48 (not a token count), so only attention maps can
    be square; the same check sees the (N, N) key similarity of a merging method."""
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "embed_dim": 48}, class_token=False, global_pool="map").eval()
    tr.apply(model, spec)
    assert square(model, images) == []
    tr.apply(model, "pitome(keep=0.8)")  # its (N, N) similarity of the keys: the detector sees it
    assert square(model, images)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["topk(keep=0.5, locs=(1, 2), score='received')", "evit(keep=0.5, locs=(1, 2))",
                                  "ctp(counts=(32, 16), locs=(1, 2))", "tome(r=4)"])
def test_siglip_compiles_as_one_graph(spec, images):
    torch._dynamo.reset()
    model = tr.apply(make_host("siglip"), spec)
    with torch.no_grad():
        want = model(images)
        got = torch.compile(model, fullgraph=True, dynamic=False, backend="eager")(images)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_siglip_exports_to_onnx_with_a_dynamic_batch(tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed: pip install 'tokenreduce[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed: pip install 'tokenreduce[export]'")
    from tokenreduce.bench.export import export_onnx, run_session, session

    model = tr.apply(make_host("siglip"), "topk(keep=0.5, locs=(1, 2))").eval()  # the shift, attention-pool head
    res = export_onnx(model, tmp_path / "m.onnx", dynamic_batch=True)
    sess = session(res.path)
    for b in (1, 3):
        x = torch.randn(b, 3, 32, 32, generator=torch.Generator().manual_seed(10 + b))
        with torch.no_grad():
            torch.testing.assert_close(run_session(sess, x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("host", ["siglip", "avgpool"])
def test_dense_restores_every_position_and_remove_the_model(host, images):
    model = make_host(host)
    with torch.no_grad():
        ref_tokens, ref = model.forward_features(images), model(images)
        tr.apply(model, "topk(keep=0.5, locs=(1, 2))", dense=True)
        dense = model.forward_features(images)
        tr.remove(model)
        back = model(images)
    assert dense.shape == ref_tokens.shape
    torch.testing.assert_close(back, ref, rtol=0, atol=0)


def test_a_model_with_no_pooling_returns_the_reduced_tokens(images):
    """timm global_pool='' and no class token (a tower whose tokens go on as they are): exact at zero
    reduction, and the head sees the reduced tokens, one row per token left."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, class_token=False, global_pool="").eval()
    with torch.no_grad():
        ref = model(images)
        tr.apply(model, "topk(keep=1.0, locs=(1,))")
        torch.testing.assert_close(model(images), ref, rtol=0, atol=0)
        tr.apply(model, "tome(r=8)")
        out = model(images)
    assert ref.shape == (3, 64, 10) and out.shape == (3, tr.get_info(model).tokens_per_block[-1], 10) == (3, 32, 10)

"""``saint`` is the published algorithm as its official code runs it on timm's ViT: the bipartite cosine graph of
the patch keys, the edge threshold, the degree-and-closeness score with its fallback for isolated tokens, the
official count (the batch mean of the per-image counts of tokens with at least K edges, truncated), dropping (not
merging) in the first half of the blocks, after attention + residual, prefix tokens protected.

The reference below is written from the description of the official code (docs/methods/saint.md;
github.com/ArmenJeddi/saint, ViT/saint/prune.py ``saint_drop`` and ViT/saint/patch/timm.py): the count over the
batch, then one image at a time with Python lists and floats, the kept tokens in the official order (by
decreasing score, then the B tokens), sharing nothing with ``core/ops.py`` or methods/saint.py but the host's own
sub-modules. It runs on a tiny timm ViT (with a class token, with a distillation token, without a class token) and
a tiny transformers ViT and DeiT, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import check_host
from tokenreduce.core.method import AttnInfo
from tokenreduce.core.state import TokenState
from tokenreduce.methods.saint import r_from_tokens

transformers = pytest.importorskip("transformers")

HF_SIZE = dict(image_size=32, patch_size=4, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
               intermediate_size=256, layer_norm_eps=1e-6, num_labels=10)


def _scores_one_image(keys: torch.Tensor, threshold: float, gamma: float, min_edges: int) -> tuple[list[float], int]:
    """keys (T, d) of one image's patch tokens -> the score of each even-position token (A) against the
    odd-position ones (B), and how many A tokens have at least ``min_edges`` edges."""
    unit = keys / keys.norm(dim=-1, keepdim=True)
    scores, counted = [], 0
    for sims in (unit[0::2] @ unit[1::2].T).tolist():  # one row of cosine similarities per A token
        edges = [s for s in sims if s >= threshold]
        if edges:
            closeness = sum(edges) / len(edges)
            scores.append(len(edges) * math.exp(gamma * (closeness - threshold)))
        else:
            scores.append(sum(sims) / len(sims))
        counted += len(edges) >= min_edges
    return scores, counted


def official_drop(x: torch.Tensor, keys: torch.Tensor, protected: int, threshold: float, gamma: float = 10.0,
                  min_edges: int = 5, r: int | None = None) -> torch.Tensor:
    """One official SAINT drop of a batch: x (B, N, C), keys (B, H, N, d) -> (B, N - r, C), r the truncated
    batch mean of the per-image counts (or the ``r`` given); nothing dropped when r is 0."""
    metric = keys.mean(dim=1)[:, protected:]  # (B, T, d)
    per_image = [_scores_one_image(m, threshold, gamma, min_edges) for m in metric]
    if r is None:
        r = int(sum(c for _, c in per_image) / len(per_image))
    if r <= 0:
        return x
    out = []
    for t, (scores, _) in zip(x, per_image, strict=True):
        patches = t[protected:]
        a_rows, b_rows = patches[0::2], patches[1::2]
        ranked = sorted(range(len(scores)), key=lambda i: -scores[i])  # most redundant first
        kept = [a_rows[i] for i in ranked[r:]]
        out.append(torch.stack([*t[:protected], *kept, *b_rows]))
    return torch.stack(out)


def reference_timm(model: torch.nn.Module, images: torch.Tensor, drop: Callable) -> tuple[torch.Tensor, list[int]]:
    """Logits of a timm ViT with ``drop(block, x, keys)`` after attention + residual; tokens leaving each block."""
    t = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    counts = []
    for i, blk in enumerate(model.blocks):
        attn = blk.attn
        B, n, _ = t.shape
        q, k, v = attn.qkv(blk.norm1(t)).reshape(B, n, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, N, d)
        o = ((q @ k.transpose(-2, -1)) * attn.scale).softmax(-1) @ v
        t = t + blk.ls1(attn.proj(o.transpose(1, 2).reshape(B, n, -1)))
        t = drop(i, t, k)
        t = t + blk.ls2(blk.mlp(blk.norm2(t)))
        counts.append(t.shape[1])
    return model.forward_head(model.norm(t)), counts


def reference_hf(model: torch.nn.Module, images: torch.Tensor, drop: Callable) -> tuple[torch.Tensor, list[int]]:
    """The same on a transformers ViT or DeiT (with its teacher head)."""
    base = model.vit if hasattr(model, "vit") else model.deit
    t = base.embeddings(images)
    counts = []
    for i, layer in enumerate(base.layers):
        attn = layer.attention
        B, n, _ = t.shape
        h = layer.layernorm_before(t)
        q, k, v = (proj(h).reshape(B, n, attn.num_attention_heads, -1).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))  # (B, H, N, d)
        o = ((q @ k.transpose(-2, -1)) * attn.scaling).softmax(-1) @ v
        t = t + attn.o_proj(o.transpose(1, 2).reshape(B, n, -1))
        t = drop(i, t, k)
        t = t + layer.mlp(layer.layernorm_after(t))
        counts.append(t.shape[1])
    t = base.layernorm(t)
    if hasattr(model, "vit"):
        return model.classifier(t[:, 0]), counts
    return (model.cls_classifier(t[:, 0]) + model.distillation_classifier(t[:, 1])) / 2, counts


def _timm(name: str) -> tuple[torch.nn.Module, Callable]:
    return make_host(name).double(), reference_timm


def _hf(cls: str, config: str) -> Callable:
    def build() -> tuple[torch.nn.Module, Callable]:
        torch.manual_seed(0)
        model = getattr(transformers, cls)(getattr(transformers, config)(**HF_SIZE))
        return model.eval().double(), reference_hf
    return build


#: timm: a class token, class + distillation tokens, none (average pooling); transformers: ViT, DeiT
HOSTS = {
    "timm-deit": lambda: _timm("deit"),
    "timm-distilled": lambda: _timm("distilled"),
    "timm-avgpool": lambda: _timm("avgpool"),
    "hf-vit": _hf("ViTForImageClassification", "ViTConfig"),
    "hf-deit": _hf("DeiTForImageClassificationWithTeacher", "DeiTConfig"),
}
PROTECTED = {"timm-deit": 1, "timm-distilled": 2, "timm-avgpool": 0, "hf-vit": 1, "hf-deit": 2}


def _images(seed: int = 2) -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def _check(host: str, spec: str, drop: Callable) -> list[int]:
    model, reference = HOSTS[host]()
    images = _images()
    with torch.no_grad():
        want, counts = reference(model, images, drop)
        tr.apply(model, spec)
        got = _logits(model(images))
        assert tr.get_info(model).tokens_per_block == counts
        plain = _logits(tr.remove(model)(images))
    assert counts[-1] < 64 + PROTECTED[host], "nothing was dropped: the check could not fail"
    assert not torch.allclose(want, plain)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    return counts


@pytest.mark.parametrize("host", list(HOSTS))
@pytest.mark.parametrize("threshold,K,gamma", [(0.5, 1, 3.0), (0.2, 5, 10.0)])
def test_the_official_batch_count_equals_the_reference_in_float64(host: str, threshold: float, K: int,
                                                                  gamma: float) -> None:
    """``count='batch'``: the official count, in the first half of the blocks."""
    p = PROTECTED[host]

    def drop(block: int, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return official_drop(x, keys, p, threshold, gamma, K) if block < 4 // 2 else x

    _check(host, f"saint(count='batch', threshold={threshold}, K={K}, gamma={gamma})", drop)


@pytest.mark.parametrize("host", list(HOSTS))
@pytest.mark.parametrize("r", [(5, 9, 0, 3), (32, 16, 8, 4)])
def test_a_fixed_count_drops_the_official_ranking_in_float64(host: str, r: tuple[int, ...]) -> None:
    """``count='fixed'``: the official score and drop with r given per block (all the A tokens in the second
    case: then the ranking does not matter, only the split)."""
    p = PROTECTED[host]

    def drop(block: int, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return official_drop(x, keys, p, 0.75, r=r[block])

    assert _check(host, f"saint(r={r})", drop) == [64 + p - sum(r[: i + 1]) for i in range(4)]


def test_the_batch_count_is_batch_dependent_and_the_fixed_count_is_not() -> None:
    """The official count takes the batch mean: an image's output changes with its batch. The fixed count run
    with the counts one batch gave (``r_from_tokens``, a calibration) equals it on that batch and is
    batch-invariant."""
    model = make_host("deit").double()
    images = _images()
    with torch.no_grad():
        tr.apply(model, "saint(count='batch', threshold=0.3, K=2)")
        batch = model(images)
        alone = torch.cat([model(images[i:i + 1]) for i in range(3)])
        model(images)
        info = tr.get_info(model)  # as docs/methods/saint.md calibrates
        calibrated = r_from_tokens(info.tokens_per_block, info.host.num_prefix, info.schedule.num_patches)
        tr.apply(model, f"saint(r={calibrated}, threshold=0.3)")
        fixed = model(images)
        fixed_alone = torch.cat([model(images[i:i + 1]) for i in range(3)])
    assert not torch.allclose(batch, alone), "the official count should depend on the batch here"
    torch.testing.assert_close(fixed, batch, rtol=0, atol=1e-12)
    torch.testing.assert_close(fixed_alone, fixed, rtol=0, atol=1e-12)


def test_the_batch_count_declares_a_dynamic_schedule_and_no_export() -> None:
    fixed, batch = tr.build_reducer("saint(r=4)"), tr.build_reducer("saint(count='batch')")
    assert not fixed.dynamic_schedule and fixed.exportable
    assert batch.dynamic_schedule and not batch.exportable
    model = tr.apply(make_host("deit"), "saint(count='batch')")
    assert tr.get_info(model).schedule.locs == (0, 1)  # the first half: the official placement
    tr.apply(model, "saint(count='batch', locs=(1, 3))")
    assert tr.get_info(model).schedule.locs == (1, 3)


def test_a_redundant_token_is_dropped_first() -> None:
    """Five patches: A = 0, 2, 4 and B = 1, 3. Patch 2 nearly duplicates both B tokens, patch 0 is near both but
    less close, patch 4 is isolated (no edge): with r = 1 patch 2 goes, with r = 2 patch 0 too. The output
    order is the official one: prefix, the kept A tokens by decreasing score, then B."""
    e = torch.eye(6, dtype=torch.float64)
    patches = [e[0] + 0.5 * e[1], e[0], e[0] + 0.1 * e[2] + 0.1 * e[1], e[0] + 0.2 * e[2], e[4]]
    x = torch.stack([e[5], *patches])[None]  # (1, 6, 6), a class token first
    for r, kept in [(1, [0, 1, 5, 2, 4]), (2, [0, 5, 2, 4])]:  # cls, kept A by decreasing score, B
        reducer = tr.build_reducer(f"saint(r={r})")
        reducer.bind(check_host(make_host("deit")))
        state = TokenState.start(x, 1)
        out = reducer.reduce(x, state, AttnInfo(keys=x[:, None]), count=5 - r)
        assert state.index[0].tolist() == kept
        assert torch.equal(out[0], x[0, kept])


@pytest.mark.parametrize("spec,match", [
    ("saint(count='batch', r=4)", r"give r with count='fixed' only"),
    ("saint(r=4, locs=(0,))", r"locs is for count='batch'"),
    ("saint(r=4, threshold=1.5)", r"threshold=1.5 is outside \[-1, 1\]"),
    ("saint(r=4, K=-1)", r"K=-1 must be a non-negative int"),
    ("saint(r=4, gamma=-1.0)", r"gamma=-1.0 must be a non-negative number"),
    ("saint(r=4, count='image')", r"count"),
    ("saint(r=40)", r"r=40 is too large at block 0"),
    ("saint(count='batch', locs=(7,))", r"block index 7 is beyond the model's depth 4"),
])
def test_bad_specs_are_refused_naming_the_valid_choices(spec: str, match: str) -> None:
    with pytest.raises(tr.SpecError, match=match):
        tr.apply(make_host("deit"), spec)


def test_the_default_drops_as_many_tokens_per_block_as_the_default_tome() -> None:
    """On DeiT's 14 x 14 grid, where neither method's clip bites."""
    torch.manual_seed(0)
    model = tr.apply(VisionTransformer(**{**TINY, "img_size": 56}).eval(), "saint")  # 196 patches
    counts = tr.get_info(model).schedule.counts
    assert counts == tr.get_info(tr.apply(model, "tome")).schedule.counts == (183, 170, 157, 144)

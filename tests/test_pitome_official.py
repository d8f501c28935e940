"""``pitome`` is the published algorithm as its official code runs it on timm's ViT: the energy score over the
keys' cosine graph with the per-block margin, the energy-ordered split of the first half of the blocks, the
protected low-energy tokens of the second half, the size-weighted merge, floor(T - T keep) per block.

The reference below is written from the official code's description (docs/methods/pitome.md;
github.com/hchautran/PiToMe, algo/pitome/merge.py and algo/pitome/patch/deit.py), one image at a time with
Python lists and floats, sharing nothing with ``core/ops.py`` but timm's own sub-modules.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.adapters.timm_vit import check_host
from tokenreduce.core import ops
from tokenreduce.core.errors import TokenReduceError
from tokenreduce.core.method import AttnInfo
from tokenreduce.core.state import TokenState


def _merge_one_image(t: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int, p: int, margin: float,
                     alpha: float, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One PiToMe merge of one image: t (N, C), size (N,), keys (N, d) -> (N - r, C), (N - r,). ``split``:
    the first half's pairing (every token a candidate, the energy order split alternately, ToMe's links)."""
    patches = list(range(p, t.shape[0]))
    unit = {i: keys[i] / keys[i].norm() for i in patches}
    cos = {(i, j): float(unit[i] @ unit[j]) for i in patches for j in patches}

    def elu(v: float) -> float:
        return v if v > 0 else alpha * (math.exp(v) - 1.0)

    energy = {i: sum(elu(cos[i, j] - margin) for j in patches) / len(patches) for i in patches}
    order = sorted(patches, key=lambda i: -energy[i])  # highest energy first

    def best(a: int, b_set: list[int]) -> int:
        return max(b_set, key=lambda b: cos[a, b])

    if split:
        a_set, b_set = order[0::2], order[1::2]
        links = sorted(((cos[a, best(a, b_set)], a, best(a, b_set)) for a in a_set), key=lambda e: -e[0])
        merged, kept = [(a, b) for _, a, b in links[:r]], [a for _, a, _ in links[r:]]
    else:
        a_set, b_set = order[0:2 * r:2], order[1:2 * r:2]
        merged, kept = [(a, best(a, b_set)) for a in a_set], order[2 * r:]  # the low-energy rest is protected
    total = {j: t[j] * size[j] for j in b_set}
    weight = {j: size[j].clone() for j in b_set}
    for a, b in merged:
        total[b] = total[b] + t[a] * size[a]
        weight[b] = weight[b] + size[a]
    rows = [t[i] for i in range(p)] + [t[i] for i in kept] + [total[j] / weight[j] for j in b_set]
    sizes = [size[i] for i in range(p)] + [size[i] for i in kept] + [weight[j] for j in b_set]
    return torch.stack(rows), torch.stack(sizes)


def reference_pitome(model: torch.nn.Module, images: torch.Tensor, keep: float, margin: float = 0.75,
                     alpha: float = 1.0, prop_attn: bool = False) -> tuple[torch.Tensor, list[int]]:
    """Logits of PiToMe on a timm ViT, image by image; and the tokens leaving each block."""
    p, depth = model.num_prefix_tokens, len(model.blocks)
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    logits, counts = [], []
    for t in tokens:  # (N, C)
        size = torch.ones(t.shape[0], dtype=t.dtype)
        counts = []
        for i, blk in enumerate(model.blocks):
            attn = blk.attn
            n, heads = t.shape[0], attn.num_heads
            q, k, v = attn.qkv(blk.norm1(t)).reshape(n, 3, heads, -1).permute(1, 2, 0, 3)  # (H, N, d) each
            q, k = attn.q_norm(q), attn.k_norm(k)
            scores = (q @ k.transpose(-2, -1)) * attn.scale
            if prop_attn:
                scores = scores + size.log()
            o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
            t = t + blk.ls1(attn.proj(o))
            patches = n - p
            r = math.floor(patches - patches * keep)  # the official count
            if keep < 1.0:  # the official block skips the merge only at ratio 1
                block_margin = margin - margin * (i / depth)
                split = i < math.ceil(depth * 0.5)
                t, size = _merge_one_image(t, size, k.mean(0), r, p, block_margin, alpha, split)
            t = t + blk.ls2(blk.mlp(blk.norm2(t)))
            counts.append(t.shape[0])
        logits.append(model.forward_head(model.norm(t)[None])[0])
    return torch.stack(logits), counts


def _images(seed: int = 2) -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _check(model: torch.nn.Module, spec: str, **kw) -> None:
    images = _images()
    with torch.no_grad():
        want, counts = reference_pitome(model, images, **kw)
        tr.apply(model, spec)
        got = model(images)
    assert tr.get_info(model).tokens_per_block == counts
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.equal(want, tr.remove(model)(images))  # tokens were merged: the check can fail


@pytest.mark.parametrize("host", ["deit", "distilled", "registers", "avgpool"])
@pytest.mark.parametrize("keep", [0.5, 0.7, 0.9])
def test_pitome_equals_the_reference_in_float64(host: str, keep: float) -> None:
    _check(make_host(host).double(), f"pitome(keep={keep})", keep=keep)


def test_margin_alpha_and_proportional_attention_follow_the_reference() -> None:
    _check(make_host("deit").double(), "pitome(keep=0.6, margin=0.4, alpha=2.0, prop_attn=True)", keep=0.6,
           margin=0.4, alpha=2.0, prop_attn=True)


def test_an_odd_depth_splits_the_first_ceil_half_by_energy() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "depth": 5}).eval().double()  # blocks 0-2 split, 3-4 protect
    _check(model, "pitome(keep=0.75)", keep=0.75)


def test_counts_are_the_official_floors() -> None:
    model = tr.apply(make_host("deit"), "pitome(keep=0.8)")  # 64 patches
    assert tr.get_info(model).schedule.counts == (52, 42, 34, 28)  # 64 - floor(12.8), 52 - floor(10.4), ...
    tr.apply(model, "pitome(keep=0.5)")
    assert tr.get_info(model).schedule.counts == (32, 16, 8, 4)
    tr.apply(model, "pitome(keep=1.0)")
    assert tr.get_info(model).schedule.locs == ()


def test_a_late_block_protects_the_isolated_tokens_and_lists_them_after_the_prefix() -> None:
    """Block 3 of 4 (the protecting half): T = 6 patches, keep 0.7 -> r = 2. The four alike tokens have the
    highest energy and are the candidates (the two A ones merge into the B ones); the two isolated ones are kept
    untouched, right after the class token and before the B tokens."""
    e = torch.eye(8, dtype=torch.float64)
    alike = [e[0], e[0] + 0.1 * e[1], e[0] + 0.2 * e[2], e[0] + 0.3 * e[1] + 0.1 * e[2]]
    isolated = [e[3], e[4] + 0.2 * e[5]]
    x = torch.stack([e[7], alike[0], isolated[0], alike[1], alike[2], isolated[1], alike[3]])[None]  # (1, 7, 8)
    reducer = tr.build_reducer("pitome(keep=0.7)")
    reducer.bind(check_host(make_host("deit")))
    state = TokenState.start(x, 1)
    state.block = 3
    out = reducer.reduce(x, state, AttnInfo(keys=x[:, None]), count=4)  # keys (B, H=1, N, d)
    assert out.shape == (1, 5, 8)
    assert torch.equal(out[0, 0], x[0, 0])
    assert {tuple(out[0, i].tolist()) for i in (1, 2)} == {tuple(v.tolist()) for v in isolated}
    assert state.size[0, :3].tolist() == [1.0, 1.0, 1.0] and state.size[0, 3:].sum() == 4  # B took A in
    assert set(state.index[0, 3:].tolist()) <= {1, 3, 4, 6}  # the B tokens are alike ones


@pytest.mark.parametrize("spec,match", [
    ("pitome(keep=0.4)", r"keep=0.4 is outside \[0.5, 1\]"),
    ("pitome(keep=1.5)", r"keep=1.5 is outside \[0.5, 1\]"),
    ("pitome(margin=2.0)", r"margin=2.0 is outside \[-1, 1\]"),
    ("pitome(alpha=0.0)", r"alpha=0.0 must be a positive number"),
    ("pitome(keep='high')", r"keep"),
    ("pitome(ratio=0.9)", r"unknown parameter 'ratio'; valid parameters: keep, margin, alpha, prop_attn"),
])
def test_bad_specs_are_refused_naming_the_valid_choices(spec: str, match: str) -> None:
    with pytest.raises(tr.SpecError, match=match):
        tr.apply(make_host("deit"), spec)


def test_set_matching_refuses_more_merges_than_a_tokens() -> None:
    a, b = torch.tensor([[1, 3]]), torch.tensor([[2]])
    with pytest.raises(TokenReduceError, match="at most 2"):
        ops.set_matching(torch.zeros(1, 2, 1), a, b, 3, torch.zeros(1, 0, dtype=torch.long))

"""``tome`` is the published algorithm: the official pairing (A/B alternate over sequence positions,
prefix tokens protected where they fall), ToMe's clip of r, its output order.

The reference below is written from the description of the official code (docs/methods.md,
section "ToMe"; github.com/facebookresearch/ToMe, tome/merge.py and tome/patch/timm.py), one image at a
time with Python lists, sharing nothing with ``core/ops.py`` but timm's own sub-modules.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_host

import tokenreduce as tr
from tokenreduce.core import ops
from tokenreduce.core.errors import TokenReduceError
from tokenreduce.core.state import TokenState


def _merge_one_image(t: torch.Tensor, size: torch.Tensor, metric: torch.Tensor, r: int, p: int):
    """One ToMe merge of one image: t (N, C), size (N,), metric (N, d) -> (N - r, C), (N - r,)."""
    n = t.shape[0]
    unit = metric / metric.norm(dim=-1, keepdim=True)
    a_set = [i for i in range(n) if i % 2 == 0 and i >= p]  # prefix tokens in A merge into nothing
    b_set = [j for j in range(n) if j % 2 == 1 and j >= p]  # prefix tokens in B receive nothing
    edges = []  # (similarity, a, its most similar b)
    for i in a_set:
        sims = [float(unit[i] @ unit[j]) for j in b_set]
        best = max(range(len(b_set)), key=lambda k: sims[k])
        edges.append((sims[best], i, b_set[best]))
    edges.sort(key=lambda e: -e[0])
    merged, kept_a = edges[:r], [i for _, i, _ in edges[r:]]
    total = {j: t[j] * size[j] for j in b_set}
    weight = {j: size[j].clone() for j in b_set}
    for _, i, j in merged:
        total[j] = total[j] + t[i] * size[i]
        weight[j] = weight[j] + size[i]
    if p:  # the official code sorts the unmerged A tokens when there is a class token
        kept_a = sorted(kept_a)
    rows = [t[i] for i in range(p)] + [t[i] for i in kept_a] + [total[j] / weight[j] for j in b_set]
    sizes = [size[i] for i in range(p)] + [size[i] for i in kept_a] + [weight[j] for j in b_set]
    return torch.stack(rows), torch.stack(sizes)


def reference_tome(model: torch.nn.Module, images: torch.Tensor, r: int) -> tuple[torch.Tensor, list[int]]:
    """Logits of ToMe(r) on a timm ViT, image by image; and the tokens leaving each block."""
    p = model.num_prefix_tokens
    tokens = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    logits, counts = [], []
    for t in tokens:  # (N, C)
        size = torch.ones(t.shape[0], dtype=t.dtype)
        counts = []
        for blk in model.blocks:
            attn = blk.attn
            n, heads = t.shape[0], attn.num_heads
            q, k, v = attn.qkv(blk.norm1(t)).reshape(n, 3, heads, -1).permute(1, 2, 0, 3)  # (H, N, d) each
            q, k = attn.q_norm(q), attn.k_norm(k)
            scores = (q @ k.transpose(-2, -1)) * attn.scale + size.log()  # proportional attention
            o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
            t = t + blk.ls1(attn.proj(o))
            r_block = min(r, (n - p) // 2)  # the official clip, p = protected tokens
            if r_block > 0:
                t, size = _merge_one_image(t, size, k.mean(0), r_block, p)
            t = t + blk.ls2(blk.mlp(blk.norm2(t)))
            counts.append(t.shape[0])
        logits.append(model.forward_head(model.norm(t)[None])[0])
    return torch.stack(logits), counts


@pytest.mark.parametrize("host", ["deit", "distilled", "registers", "avgpool"])
@pytest.mark.parametrize("r", [3, 8, 40])
def test_tome_equals_the_reference_in_float64(host: str, r: int) -> None:
    model = make_host(host).double()
    images = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, counts = reference_tome(model, images, r)
        tr.apply(model, f"tome(r={r})")
        got = model(images)
    assert tr.get_info(model).tokens_per_block == counts
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert not torch.equal(want, tr.remove(model)(images))  # tokens were merged: the check can fail


def _plan_on(vectors: list[torch.Tensor], r: int, p: int) -> ops.MergePlan:
    return ops.bipartite_soft_matching(torch.stack(vectors)[None], r, p)


def test_sets_with_one_prefix_token_start_at_the_class_token() -> None:
    e = torch.eye(8)
    # position: 0 cls (A, protected) | 1 B | 2 A | 3 B | 4 A | 5 B | 6 A
    x = [e[0], e[1], e[2] + 0.2 * e[3], e[3], 2 * e[1], e[5], e[6] + 0.5 * e[5]]
    plan = _plan_on(x, 2, 1)
    # links: 4 -> 1 (cos 1), 6 -> 5 (0.45), 2 -> 3 (0.20); the two best merge. The first patch
    # (position 1) is in B and receives position 4
    assert plan.src.tolist() == [[4, 6]] and plan.dst_pos.tolist() == [[1, 5]]
    # output: cls, unmerged A (2), then B (1, 3, 5)
    assert plan.keep.tolist() == [[0, 2, 1, 3, 5]] and plan.dst.tolist() == [[2, 4]]
    xs = torch.stack(x)[None]
    out = TokenState.start(xs, 1).merge(xs, plan)
    torch.testing.assert_close(out[0, 2], (x[1] + x[4]) / 2)
    torch.testing.assert_close(out[0, 4], (x[5] + x[6]) / 2)


def test_sets_with_two_prefix_tokens_protect_cls_in_a_and_dist_in_b() -> None:
    e = torch.eye(8)
    # position: 0 cls (A) | 1 dist (B) | 2 A | 3 B | 4 A | 5 B | 6 A | 7 B
    # 2 equals dist and 6 equals cls: neither may link to a prefix token
    x = [e[0], e[1], e[1] + 0.3 * e[7], e[3], e[3], e[5], e[0] + 0.6 * e[5], e[7]]
    plan = _plan_on(x, 3, 2)
    assert plan.src.tolist() == [[4, 6, 2]] and plan.dst_pos.tolist() == [[3, 5, 7]]
    assert plan.keep.tolist() == [[0, 1, 3, 5, 7]]  # cls, dist, rest of A (none), rest of B
    plan = _plan_on(x, 2, 2)
    assert plan.keep.tolist() == [[0, 1, 2, 3, 5, 7]] and plan.dst.tolist() == [[3, 4]]


@pytest.mark.parametrize("p", [0, 1, 2, 3, 4])
def test_sets_alternate_over_positions_for_any_prefix(p: int) -> None:
    torch.manual_seed(p)
    n, r = p + 13, 5
    metric = torch.randn(2, n, 6)
    plan = ops.bipartite_soft_matching(metric, r, p)
    for b in range(2):
        src, dst_pos, keep = plan.src[b].tolist(), plan.dst_pos[b].tolist(), plan.keep[b].tolist()
        assert all(i % 2 == 0 and i >= p for i in src) and all(j % 2 == 1 and j >= p for j in dst_pos)
        assert keep[:p] == list(range(p))  # prefix first, in order
        kept_a = [i for i in keep[p:] if i % 2 == 0]
        assert keep[p:] == kept_a + [j for j in range(p, n) if j % 2 == 1]  # then A, then all of B
        if p:
            assert kept_a == sorted(kept_a)  # in sequence order
        assert sorted(keep + src) == list(range(n))
        assert [keep[d] for d in plan.dst[b].tolist()] == dst_pos


def test_r_is_clipped_as_the_official_code_clips_it() -> None:
    model = tr.apply(make_host("deit"), "tome(r=40)")  # 64 patches
    assert tr.get_info(model).schedule.counts == (32, 16, 8, 4)
    tr.apply(model, "tome(r=(5, 30, 0, 30))")
    assert tr.get_info(model).schedule.counts == (59, 30, 30, 15)
    with pytest.raises(tr.SpecError, match="r has 2 entries"):
        tr.apply(model, "tome(r=(1, 2))")
    with pytest.raises(TokenReduceError, match="at most 4"):
        ops.bipartite_soft_matching(torch.randn(1, 1 + 8, 4), 5, 1)

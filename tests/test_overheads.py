"""Per-block overhead of the reductions, counted in dispatched ATen operators (deterministic, no timing).

At batch 1 on a CPU every operator costs microseconds whatever its size, so a reduction's book-keeping
(index arithmetic, small gathers, sorts) can cost more than the tokens it removes save. Each method is
held to a budget: the most operators a block where it reduces may add to the same block of the
unpatched timm model, at batch 1 on the tiny hosts. A block where nothing is reduced adds none (ToMe's
proportional attention adds its log-size bias, 2 operators, once a merge has happened), and the whole
forward adds one more (the expand of the cached token index the TokenState starts from).
A failure here means an overhead regression - or a torch version that dispatches differently: then
recount with ``per_block_ops`` and update the budget with the reason.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_host
from torch.utils._python_dispatch import TorchDispatchMode

import tokenreduce as tr
from tokenreduce.core.method import format_spec

#: spec on the 4-block tiny hosts -> most extra operators in a block where it reduces (batch 1); a tuple
#: holds one budget per reducing block, in order (a method whose blocks do different work)
BUDGETS: dict[str, int | tuple[int, ...]] = {
    # the matched baseline: its index is built at bind; expand it (1), gather x (3) and the index (1)
    "random(keep=0.5, locs=(1, 2))": 5,
    # CLS row (8: slice, scale, 2 views, transpose, bmm, view, softmax), head mean, prefix fill, the top
    # (2: a stable argsort, ties to the lower position on every backend (core/ops.py _top), and its slice),
    # sort, gather x (3) and the index (1)
    "topk(keep=0.5, locs=(1, 2))": 17,
    "topk(keep=0.5, locs=(1, 2), where='block')": 17,
    # CLS row (8), head norms (1), importance (5), prefix fill, the top (2), sort, gathers (4)
    "ctp(counts=(32, 16), locs=(1, 2))": 22,
    # CLS row (8), head mean, prefix fill, argsort + 2 slices + 2 sorts, weights (1), dropped rows (3),
    # fused token (3), its slot (4), index (1), sizes (3), kept rows (3), cat (1)
    "evit(keep=0.5, locs=(1, 2))": 34,
    # keys mean (1), normalise (3), A/B (2), similarity (2), max, argsort, src/unm (2), sort, dst (1),
    # positions (7), merge (17 without autograd), index (1), log-size bias of the next block (2)
    "tome(r=8)": 42,
    "tome(r=(8, 0, 8, 0))": 42,
    # keys mean, patch slice, normalise (2), A/B slices, transpose, bmm, edges and degree (2), closeness (mul,
    # sum, clamp, div), score (sub, mul, exp, mul), isolated (sum, div), gt + where, argsort + slice, A positions
    # (1), prefix and B positions (2 expands), cat, gathers of the index (1) and x (3)
    "saint(r=8)": 32,
    # merging blocks 0 and 2, pruning (re-scoring) blocks 1 and 3. A merging block (58): CLS row (8), scores:
    # head mean, prefix fill, bottom-S top-k, sort (4); keys mean, gather the subset (4), normalise (3), A/B
    # slices, transpose, bmm, max, top-r (6), src and dst positions (5), kept positions (zeros, scatter,
    # stable sort, slice: 4), slots (cumsum, gather, sub: 3), merge (18 at the first merge: sizes from
    # ones; 17 later, 2 more in the CLS row under the log-size bias), index (1), the next block's log-size
    # bias (2). A pruning block (22): CLS row under the bias (10), head mean, prefix fill, the top (2), sort,
    # gathers of x (3), index and size (2), the next block's bias (2; 20 in the last block)
    "imagepiece(locs=(0, 2), merge=0.1, keep=0.7)": (58, 22, 60, 20),
    # block 1 prunes what block 0 left and merges inside the survivors with ONE plan (63): the prune's top-k
    # is an argsort whose slices give the survivors and the inattentive subset, and x is gathered once
    "imagepiece(locs=(0, 1), merge=0.1, keep=0.7)": (58, 63, 22),
    # deployed Cropr (after the MLP): patch slice, x @ q (unsqueeze, view, mm, view, select: 5), prefix
    # padded with +inf (1), the top (2), sort, gathers of x (3) and the index (1)
    "cropr(r=8, inference=True)": 14,
    # plus keeping the pruned tokens aside (8: the complement by a stable sort (4), their x (3) and index
    # (1)); with llf the modules stop before the penultimate block, whose block point restores them in
    # place (7: 2 cats, argsort of the index, 2 gathers)
    "cropr(r=8, inference=True) + llf()": (22, 22, 7),
    "topk(keep=0.5, locs=(1,)) + llf()": (25, 7),
}
#: extra operators of a block where nothing is reduced, once sizes exist, for a method with
#: proportional attention (log(size) as an additive attention bias: log, view)
PROP_ATTN_BIAS = 2
HOSTS = ["deit", "distilled", "registers"]


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def per_block_ops(model: torch.nn.Module, x: torch.Tensor) -> tuple[list[int], int]:
    """(operators dispatched in each block, in the whole forward) of a warm no-grad forward; a block
    runs from its norm1 to the next block's (to the final norm for the last one), so a reduction
    after the MLP counts in its own block."""
    count, marks = _Count(), []
    hooks = [m.register_forward_pre_hook(lambda *_: marks.append(count.n))
             for m in [*(blk.norm1 for blk in model.blocks), model.norm]]
    try:
        with torch.no_grad():
            model(x)  # warm: shape-dependent index tensors are cached on the first forward
            marks.clear()
            with count:
                model(x)
    finally:
        for h in hooks:
            h.remove()
    return [b - a for a, b in zip(marks, marks[1:], strict=False)], count.n


@pytest.fixture(scope="module")
def baseline() -> dict[str, tuple[list[int], int]]:
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return {host: per_block_ops(make_host(host), x) for host in HOSTS}


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("spec", list(BUDGETS))
def test_reduction_overhead_per_block(spec: str, host: str, baseline):
    model = tr.apply(make_host(host), spec)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    blocks, total = per_block_ops(model, x)
    base_blocks, base_total = baseline[host]
    extra = [b - a for a, b in zip(base_blocks, blocks, strict=True)]
    info = tr.get_info(model)
    entering = [info.schedule.num_patches, *info.schedule.counts[:-1]]
    reduced = [c != e for c, e in zip(info.schedule.counts, entering, strict=True)]
    assert any(reduced), f"{spec} reduces nothing on the tiny host: the test checks nothing"
    proportional, merged = tr.reducer_of(model).proportional, False
    budgets = iter(BUDGETS[spec] if isinstance(BUDGETS[spec], tuple) else [BUDGETS[spec]] * len(extra))
    for i, (ops, red) in enumerate(zip(extra, reduced, strict=True)):
        allowed = next(budgets) if red else (PROP_ATTN_BIAS if merged and proportional else 0)
        assert ops <= allowed, (
            f"{spec} on {host}: block {i} ({'reducing' if red else 'not reducing'}) adds {ops} operators to "
            f"timm's block, budget {allowed}; per block: {extra}"
        )
        merged = merged or red
    assert total - base_total == sum(extra) + 1, f"{spec}: {total - base_total} extra operators outside the blocks"


@pytest.mark.parametrize("name", tr.list_methods())
def test_nothing_reduced_costs_one_operator(name: str, baseline):
    """Every method at its zero spec (reduces nothing): the adapter's path adds no operator to any block,
    one to the forward."""
    model = tr.apply(make_host("deit"), format_spec(name, tr.get_method(name).zero))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    blocks, total = per_block_ops(model, x)
    base_blocks, base_total = baseline["deit"]
    assert blocks == base_blocks, f"{name} at zero adds operators to blocks: {blocks} vs timm's {base_blocks}"
    assert total == base_total + 1

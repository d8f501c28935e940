"""BSPF: the two scoring paths and where they agree, row-wise softmax against symmetry, the fusion by
hand, sizes and chunks kept, the kernel learns, MACs of both paths, tied models, starting a tied
fine-tune from a checkpoint. The contract suite (tests/test_contract.py) covers the rest."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer
from torch.utils._python_dispatch import TorchDispatchMode

import tokenreduce as tr
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core.attention import ChunkedProbs
from tokenreduce.core.state import TokenState
from tokenreduce.methods.bspf import (
    BSPF,
    ChunkDecision,
    Decision,
    chunk_groups,
    diagonal_blocks,
    entry_mask,
    entry_scores,
    fusion_plan,
    mirror,
    token_scores,
)
from tokenreduce.models import apply_transform, save_checkpoint
from tokenreduce.train.loop import TrainConfig, make_model

AVERAGE = torch.full((3, 3), 1 / 9)
ASYMMETRIC = torch.tensor([[0.0, 0.3, 0.0], [0.05, 0.3, 0.25], [0.0, 0.1, 0.0]])


def symmetric_blocks(n: int, c: int, seed: int = 0) -> torch.Tensor:
    a = torch.rand(n, c, c, generator=torch.Generator().manual_seed(seed))
    return (a + a.transpose(-2, -1)) / 2


# ----- the two paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [5, 7, 8])
def test_mirrored_equals_exact_on_symmetric_matrices_with_a_symmetric_kernel(c):
    a = symmetric_blocks(4, c)
    g = torch.randn(3, 3, generator=torch.Generator().manual_seed(2))
    for kernel in (AVERAGE, (g + g.T) / 2):
        exact, mirrored = entry_scores(a, kernel, "exact"), entry_scores(a, kernel, "mirrored")
        torch.testing.assert_close(mirrored, exact, rtol=0, atol=1e-6)
        torch.testing.assert_close(exact, exact.transpose(-2, -1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("c", [5, 7, 8])
def test_mirrored_decides_as_exact_on_symmetric_matrices_with_a_symmetric_kernel(c):
    """In exact arithmetic (small integers: no rounding, so E = E^T bit for bit) the masks, token scores
    and decisions are identical; in floating point the exact path's E and E^T may differ by rounding,
    enough to split a pair of equal entries at the mask threshold."""
    a = torch.randint(0, 6, (4, c, c), generator=torch.Generator().manual_seed(c)).float()
    a = a + a.transpose(-2, -1)
    kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]])
    exact, mirrored = entry_scores(a, kernel, "exact"), entry_scores(a, kernel, "mirrored")
    assert torch.equal(exact, mirrored) and torch.equal(exact, exact.transpose(-2, -1))
    assert torch.equal(entry_mask(exact, 0.5), entry_mask(mirrored, 0.5))
    reducer = BSPF(BSPF.Config(size=c, kernel=tuple(kernel.flatten().tolist())))
    blocks = [a[None, None]]  # (B=1, H=1, chunks, c, c)
    same = [reducer.decide(blocks, path) for path in ("exact", "mirrored")]
    assert torch.equal(same[0].token_keep(), same[1].token_keep())
    assert torch.equal(same[0].entry_keep(), same[1].entry_keep())
    asym = BSPF(BSPF.Config(size=c, kernel=tuple(ASYMMETRIC.flatten().tolist())))
    differ = [asym.decide(blocks, path) for path in ("exact", "mirrored")]
    assert not torch.equal(differ[0].entry_keep(), differ[1].entry_keep())


def test_a_non_symmetric_kernel_breaks_the_mirrored_path():
    a = symmetric_blocks(4, 7)
    exact, mirrored = entry_scores(a, ASYMMETRIC, "exact"), entry_scores(a, ASYMMETRIC, "mirrored")
    assert (exact - mirrored).abs().max() > 1e-2
    torch.testing.assert_close(mirrored, mirrored.transpose(-2, -1))  # mirrored scores are symmetric by construction


def test_the_mirrored_path_reads_only_the_upper_triangle():
    a = torch.rand(2, 6, 6, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b.tril_(-1).add_(torch.rand(2, 6, 6).tril(-1))  # a different lower triangle, the same upper one
    b = b + a.triu()
    assert not torch.equal(a, b) and torch.equal(a.triu(), b.triu())
    torch.testing.assert_close(entry_scores(a, AVERAGE, "mirrored"), entry_scores(b, AVERAGE, "mirrored"))
    assert not torch.allclose(entry_scores(a, AVERAGE, "exact"), entry_scores(b, AVERAGE, "exact"))
    torch.testing.assert_close(mirror(a), mirror(a).transpose(-2, -1))


def test_row_wise_softmax_breaks_symmetry():
    """W_q = W_k makes the logits S symmetric, but each row of A = softmax_row(S) has its own
    denominator Z_i: A_01 = e / (1 + e + e^2) but A_10 = e / (e + 2)."""
    s = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    assert torch.equal(s, s.T)
    a = s.softmax(-1)
    e = math.e
    assert math.isclose(a[0, 1].item(), e / (1 + e + e * e), rel_tol=1e-6)
    assert math.isclose(a[1, 0].item(), e / (e + 2), rel_tol=1e-6)
    assert abs(a[0, 1] - a[1, 0]) > 0.2
    # and the two paths then decide differently even with the symmetric kernel
    torch.testing.assert_close(a[0, 1] / a[1, 0], s.exp().sum(1)[1] / s.exp().sum(1)[0])  # A_ij / A_ji = Z_j / Z_i
    assert not torch.allclose(entry_scores(a[None], AVERAGE, "exact"), entry_scores(a[None], AVERAGE, "mirrored"))


def test_a_tied_model_has_symmetric_logits_but_asymmetric_attention(images):
    """On a real model with W_q = W_k: log A_ij - log A_ji = log Z_j - log Z_i (a difference of row
    terms only, so it adds up along paths), and it is not zero."""
    model = apply_transform("tie_qk", make_host("deit"))
    tr.apply(model, "bspf(size=16, locs=(1,))")
    with torch.no_grad(), model.tokenreduce.recording() as records:
        model(images)
    (a,) = records[0].attn  # (3, 2, 4, 16, 16)
    d = a.log() - a.log().transpose(-2, -1)
    assert d.abs().max() > 1e-3
    torch.testing.assert_close(d[..., 0, 1] + d[..., 1, 2], d[..., 0, 2], rtol=0, atol=1e-4)


# ----- fusion by hand --------------------------------------------------------------------------------


def test_fusion_moves_exactly_the_weighted_pruned_content():
    """One prefix token and one chunk of 4 tokens t1..t4 (positions 1..4); t1 and t4 are kept, t2 and t3
    pruned. sigma_id = max(cos, 0) x (1 - Hamming of [row, column] of the keep mask / 8)."""
    x = torch.tensor([[[5.0, 5.0], [1.0, 0.0], [2.0, 1.0], [1.0, 3.0], [0.0, 2.0]]])  # (1, 5, 2)
    state = TokenState.start(x, 1)
    state.size = torch.tensor([[1.0, 2.0, 1.0, 3.0, 1.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]], dtype=torch.bool)
    s = torch.tensor([3.0, 1.0, 2.0, 3.0])
    decision = Decision([ChunkDecision(torch.zeros(1, 1, 4, 4), mask[None, None], s[None, None],
                                       torch.tensor([[[0, 3]]]), torch.tensor([[[1, 2]]]))])
    plan, weight = fusion_plan(x, state, chunk_groups(4, 4), decision)
    out = state.merge(x, plan, weight)
    # t2 = (2, 1): cos to t1 = 2/sqrt(5), Hamming 1 of 8 -> 7/8; to t4 = 1/sqrt(5) x 2/8: goes to t1
    # t3 = (1, 3): cos to t4 = 3/sqrt(10), Hamming 1 of 8 -> 7/8; to t1: 0 agreement: goes to t4
    w2 = 1.0 * (2 / math.sqrt(5)) * (7 / 8) * math.exp(1 - 3)
    w3 = 3.0 * (3 / math.sqrt(10)) * (7 / 8) * math.exp(2 - 3)
    t1 = (2 * torch.tensor([1.0, 0.0]) + w2 * torch.tensor([2.0, 1.0])) / (2 + w2)
    t4 = (1 * torch.tensor([0.0, 2.0]) + w3 * torch.tensor([1.0, 3.0])) / (1 + w3)
    torch.testing.assert_close(out, torch.stack([torch.tensor([5.0, 5.0]), t1, t4])[None])
    # the change of each retained token is exactly its weighted share of the pruned content
    torch.testing.assert_close(out[0, 1] - x[0, 1], w2 / (2 + w2) * (x[0, 2] - x[0, 1]))
    torch.testing.assert_close(state.size, torch.tensor([[1.0, 3.0, 4.0]]))  # sizes summed: 8 = 8
    assert state.index.tolist() == [[0, 1, 4]]


def test_fusion_never_moves_content_across_chunks_and_conserves_sizes(images):
    for size in (16, 24):  # 64 patches: 4 chunks of 16; 24, 24, 16
        model = tr.apply(make_host("registers"), f"bspf(size={size}, keep=0.5, locs=(0, 2))", trace=True)
        with torch.no_grad():
            model(images)
        info = tr.get_info(model)
        p = model.num_prefix_tokens
        torch.testing.assert_close(info.sizes[:, p:].sum(1), torch.full((3,), 64.0))
        source = info.snapshots[2][:, p:, p:]  # (3, tokens, 64 patches)
        chunk_of = torch.arange(64) // size
        for b in range(3):
            for row in source[b]:
                assert len(set(chunk_of[row > 0].tolist())) == 1, "a token holds patches of two chunks"


@pytest.mark.parametrize("size,counts", [(7, [28, 14]), (10, [25, 15]), (24, [25, 13]), (48, [25, 13])])
def test_chunks_that_do_not_divide_the_patches(size, counts, images):
    """49 patches (28x28, patch 4, as the Fashion-MNIST reference): 7 = one chunk per grid row;
    10 -> 10 x 4 + 9; 24 -> 24 x 2 + 1 (a last chunk of a single token); each chunk keeps ceil(c/2)."""
    torch.manual_seed(0)
    model = VisionTransformer(**{**TINY, "img_size": 28}).eval()
    tr.apply(model, f"bspf(size={size}, locs=(1, 2))", trace=True)
    with torch.no_grad():
        out = model(images[:, :, :28, :28])
    info = tr.get_info(model)
    assert info.tokens_per_block == [50, 1 + counts[0], 1 + counts[1], 1 + counts[1]]
    assert torch.isfinite(out).all()
    source = info.snapshots[2][:, 1:, 1:]
    for b in range(3):
        for row in source[b]:
            assert len(set((torch.arange(49) // size)[row > 0].tolist())) == 1
    assert chunk_groups(49, 24) == [(0, 2, 24), (48, 1, 1)] and chunk_groups(49, 100) == [(0, 1, 49)]


# ----- no (N, N) tensor --------------------------------------------------------------------------------


class _Shapes(TorchDispatchMode):
    """The shape of every tensor an operator returns while the mode is on (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("host", ["deit", "registers"])
def test_chunked_probabilities_never_make_an_n_by_n_tensor(host, images):
    """A training step of bspf on chunked attention (64 patches: chunks 24, 24, 16, then 12, 12, 8):
    no operator, forward or backward, returns a tensor whose last two dims are (N, N) for a token count
    N of any block; the probabilities reach the method per chunk, (B, H, chunks, c, p + c)."""
    model = tr.apply(make_host(host).train(), "bspf(size=24, keep=0.5, locs=(1, 2))")
    p = model.num_prefix_tokens
    seen = {}
    reduce = model.tokenreduce.reduce

    def spy(x, state, info, count):
        seen[state.block] = info.probs
        return reduce(x, state, info, count)

    model.tokenreduce.reduce = spy
    with _Shapes() as mode:
        model(images).logsumexp(-1).mean().backward()
    counts = {64 + p, *tr.get_info(model).tokens_per_block}
    square = [s for s in mode.shapes if len(s) >= 2 and s[-1] == s[-2] and s[-1] in counts]
    assert not square, f"(N, N) tensors made: {sorted(set(square))}"
    assert sorted(seen) == [1, 2] and all(isinstance(a, ChunkedProbs) for a in seen.values())
    assert [a.shape for a in seen[1].chunks] == [(3, 2, 2, 24, p + 24), (3, 2, 1, 16, p + 16)]
    assert [a.shape for a in seen[2].chunks] == [(3, 2, 2, 12, p + 12), (3, 2, 1, 8, p + 8)]
    assert seen[1].prefix.shape == (3, 2, p, 64 + p) and seen[2].prefix.shape == (3, 2, p, 32 + p)


def test_chunked_probabilities_give_the_decisions_of_dense_ones(images):
    """BSPF decides the same from the per-chunk probabilities as from their dense (B, H, N, N) layout."""
    model = tr.apply(make_host("deit"), "bspf(size=24, keep=0.5, locs=(1,))")
    seen = {}
    reduce = model.tokenreduce.reduce

    def spy(x, state, info, count):
        seen["probs"] = info.probs
        return reduce(x, state, info, count)

    model.tokenreduce.reduce = spy
    with torch.no_grad():
        model(images)
    probs = seen["probs"]
    groups = chunk_groups(64, 24)
    per_chunk, dense = diagonal_blocks(probs, 1, groups), diagonal_blocks(probs.dense(), 1, groups)
    assert all(torch.equal(a, b) for a, b in zip(per_chunk, dense, strict=True))
    decide = model.tokenreduce.decide
    assert torch.equal(decide(per_chunk).token_keep(), decide(dense).token_keep())
    with pytest.raises(tr.TokenReduceError, match="computed in chunks"):
        diagonal_blocks(probs, 1, chunk_groups(64, 16))


# ----- learning, MACs, errors -------------------------------------------------------------------------


def test_the_kernel_learns_through_the_fusion(images):
    model = tr.apply(make_host("deit").train(), "bspf(size=16, keep=0.5, locs=(1, 2))")
    model(images).logsumexp(-1).mean().backward()
    grad = model.tokenreduce.kernel.grad
    assert grad is not None and grad.abs().sum() > 0
    # a step on the kernel changes the scores, hence the fusion weights, hence the output
    with torch.no_grad():
        model.eval()
        before = model(images)
        model.tokenreduce.kernel.sub_(0.5 * grad / grad.abs().max())
        assert not torch.allclose(model(images), before)


@pytest.mark.parametrize("path", ["exact", "mirrored"])
@pytest.mark.parametrize("host", ["deit", "avgpool"])
def test_scoring_macs_match_the_flop_counter(path, host):
    model = tr.apply(make_host(host), f"bspf(size=24, keep=0.5, locs=(1, 2), path={path!r})")
    report = count_macs(model)
    assert report.total == flop_counter_macs(model)
    p = model.num_prefix_tokens
    # block 1: 64 patches in chunks 24, 24, 16 keep 12, 12, 8; kernel + cosine (width 64) + Hamming
    entries = {"exact": lambda c: c * c, "mirrored": lambda c: c * (c + 1) // 2}[path]
    want = sum(n * (9 * entries(c) + (c - k) * k * (64 + 2 * c)) for n, c, k in [(2, 24, 12), (1, 16, 8)])
    assert report.blocks[1].scoring == want
    assert report.blocks[1].tokens_in == 64 + p and report.blocks[2].tokens_in == 32 + p


def test_mirrored_scoring_costs_less():
    exact = count_macs(tr.apply(make_host("deit"), "bspf(size=24, locs=(1, 2))")).scoring
    mirrored = count_macs(tr.apply(make_host("deit"), "bspf(size=24, locs=(1, 2), path='mirrored')")).scoring
    assert mirrored < exact


@pytest.mark.parametrize("spec,match", [
    ("bspf(path='upper')", "path='upper' is invalid; path takes 'exact' or 'mirrored'"),
    ("bspf(kernel=(1, 2))", "9 numbers"),
    ("bspf(entries=0)", "entries"),
    ("bspf(size=0)", "positive int"),
    ("bspf(keep=1.5)", "keep"),
])
def test_bad_specs_name_the_problem(spec, match):
    with pytest.raises(tr.SpecError, match=match):
        tr.apply(make_host("deit"), spec)


def test_token_scores_are_row_plus_column_of_kept_entries():
    e = torch.arange(9.0).view(1, 3, 3)
    m = entry_mask(e, 0.5)  # 5 of 9 entries: 4..8
    assert m.sum() == 5 and m[0, 1, 1] and not m[0, 1, 0]
    torch.testing.assert_close(token_scores(e, m), torch.tensor([[6.0, 4 + 5 + 4 + 7.0, 6 + 7 + 8 + 5 + 8.0]]))


# ----- tied weights ----------------------------------------------------------------------------------


def test_bspf_runs_on_a_tied_model(images):
    model = apply_transform("tie_qk", make_host("qknorm"))
    tr.apply(model, "bspf(size=16, keep=0.5, locs=(1, 2), path='mirrored')")
    with torch.no_grad():
        out = model(images)
    assert torch.isfinite(out).all() and tr.get_info(model).tokens_per_block == [65, 33, 17, 17]


def test_a_tied_fine_tune_starts_from_an_untied_checkpoint(tmp_path: Path):
    """--init CKPT --transform tie_qk: the checkpoint's model, tied on top of its weights (W = (W_q + W_k)/2)."""
    from tokenreduce.cli import build_parser
    from tokenreduce.commands.train import command_line, config_from_args
    from tokenreduce.models import build_model

    cfg = {"name": "vit_tiny_patch16_224", "kwargs": {**TINY, "img_size": 28, "in_chans": 1}}
    torch.manual_seed(0)
    ref = build_model(cfg)
    path = str(tmp_path / "ref.safetensors")
    save_checkpoint(path, ref, meta={"model": cfg})
    args = build_parser().parse_args(["train", "--init", path, "--transform", "tie_qk", "--spec",
                                      "bspf(size=7, locs=(1,))", "--out", str(tmp_path / "run")])
    train_cfg = config_from_args(args)
    assert train_cfg.model == {**cfg, "transforms": ["tie_qk"]}
    assert "--transform tie_qk --spec" in command_line(args)  # the command recorded with results
    model, model_cfg, spec = make_model(train_cfg)
    assert model_cfg["transforms"] == ["tie_qk(init='mean')"] and spec.startswith("bspf(")
    qkv = ref.blocks[0].attn.qkv.weight
    torch.testing.assert_close(model.blocks[0].attn.qkv.q.weight, (qkv[:64] + qkv[64:128]) / 2)
    torch.testing.assert_close(model.blocks[0].attn.qkv.v.weight, qkv[128:])
    other = {**cfg, "kwargs": {**cfg["kwargs"], "depth": 2}, "transforms": ["tie_qk"]}
    with pytest.raises(tr.TokenReduceError, match="differs from the model"):
        make_model(TrainConfig(init=path, model=other))


# ----- the symmetry experiment -----------------------------------------------------------------------


def test_the_symmetry_experiment_measures_both_kernels(tmp_path: Path):
    from tokenreduce.probes import RunContext, build_experiment

    exp = build_experiment("bspf_symmetry(spec='bspf(size=16, keep=0.5, locs=(1, 2))', tiny=True, images=6, batch=3)")
    result = exp.run(RunContext(threads=1, out_dir=tmp_path, log=lambda m: None))
    assert result["tied"] and result["images"] == 6 and "path='exact'" in result["spec"]
    loaded, asym = result["variants"]
    assert loaded["kernel_asymmetry"] == 0 and asym["kernel_asymmetry"] == pytest.approx(0.25)
    assert [b["block"] for b in loaded["blocks"]] == [1, 2]
    for b in loaded["blocks"]:
        assert b["attn_asym_max"] > 0 and 0 <= b["token_agreement"] <= 100 and 0 <= b["entry_agreement"] <= 100
    assert "| non-symmetric |" in exp.report(result)
    with pytest.raises(tr.SpecError, match="path"):
        build_experiment("bspf_symmetry(spec='tome(r=2)', tiny=True, images=2)").run(
            RunContext(threads=1, out_dir=tmp_path, log=lambda m: None))

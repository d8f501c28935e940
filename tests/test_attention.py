"""Open attention: core.attention.attend against explicit references, chunked attention and its
MACs, the probabilities a method asks for, gradient checkpointing and dense outputs of a patched model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, make_host
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import tokenreduce as tr
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.core import ops
from tokenreduce.core.attention import ChunkedProbs, attend, attention_macs
from tokenreduce.core.method import Reducer, build_reducer
from tokenreduce.core.schedule import compile_schedule

B, H, D = 2, 2, 8
SCALE = D**-0.5


def qkv(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g) for _ in range(3))


def make_bias(kind: str | None, n: int) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(7)
    if kind == "key":  # proportional attention's log-size shape
        return torch.rand(B, 1, 1, n, generator=g).add(0.5).log()
    if kind == "full":
        return torch.randn(B, H, n, n, generator=g)
    return None


def make_policy(n: int, p: int) -> torch.Tensor:
    policy = torch.rand(B, n, generator=torch.Generator().manual_seed(3))
    policy[:, :p] = 1.0
    policy[:, p + 2] = 0.0  # a dropped token: hidden from the others, still sees itself
    return policy


def allowed(n: int, p: int, chunk: int | None) -> torch.Tensor:
    """(n, n) bool: which key each query may see (prefix rows and columns everything, patches their chunk)."""
    if chunk is None:
        return torch.ones(n, n, dtype=torch.bool)
    a = torch.zeros(n, n, dtype=torch.bool)
    a[:p], a[:, :p] = True, True
    for s in range(p, n, chunk):
        a[s:s + chunk, s:s + chunk] = True
    return a


def reference(q, k, v, *, p=0, chunk=None, bias=None, policy=None, eps=1e-6):
    """Explicit attention over the full (N, N) matrix, masked to the allowed pattern (the dense
    definition that attend computes block-wise). The policy formula is policy_softmax's with
    N = the keys a row may see."""
    n = q.shape[-2]
    mask = allowed(n, p, chunk)
    logits = (q * SCALE) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    logits = logits.masked_fill(~mask, float("-inf"))
    if policy is None:
        probs = logits.softmax(-1)
    else:
        gate = torch.where(torch.eye(n, dtype=torch.bool), 1.0, policy[:, None, None, :]) * mask
        e = (logits - logits.amax(-1, keepdim=True)).exp() * gate
        seen = mask.sum(-1, keepdim=True)
        probs = (e + mask * eps / seen) / (e.sum(-1, keepdim=True) + eps)
    return probs @ v, probs


# ----- attend ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bias_kind", [None, "key", "full"])
@pytest.mark.parametrize("with_policy", [False, True])
def test_attend_equals_explicit_softmax_attention(bias_kind, with_policy):
    n, p = 9, 1
    q, k, v = qkv(n)
    bias = make_bias(bias_kind, n)
    policy = make_policy(n, p) if with_policy else None
    o, probs = attend(q, k, v, scale=SCALE, bias=bias, policy=policy, num_prefix=p)
    ref_o, ref_probs = reference(q, k, v, bias=bias, policy=policy)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-6)
    assert probs is None
    if policy is not None:  # the policy path is DynamicViT's policy_softmax, unchanged
        logits = (q * SCALE) @ k.transpose(-2, -1) + (0 if bias is None else bias)
        torch.testing.assert_close(o, ops.policy_softmax(logits, policy) @ v, rtol=0, atol=1e-6)
    o2, probs2 = attend(q, k, v, scale=SCALE, bias=bias, policy=policy, num_prefix=p, need_probs=True)
    torch.testing.assert_close(o2, ref_o, rtol=0, atol=1e-6)
    torch.testing.assert_close(probs2, ref_probs, rtol=0, atol=1e-6)


def test_attend_dropout_drops_the_probabilities():
    q, k, v = qkv(9)
    _, probs = reference(q, k, v)
    torch.manual_seed(5)
    o, returned = attend(q, k, v, scale=SCALE, dropout_p=0.5, need_probs=True)
    torch.manual_seed(5)
    torch.testing.assert_close(o, F.dropout(probs, 0.5) @ v, rtol=0, atol=1e-6)
    torch.testing.assert_close(returned, probs, rtol=0, atol=1e-6)  # probabilities before dropout
    assert not torch.allclose(o, probs @ v)


def test_training_dropout_is_timms():
    """A patched model at zero reduction in training mode (attention dropout, drop path) draws the
    same random numbers as timm's own forward: identical outputs under one seed."""
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, attn_drop_rate=0.3, drop_path_rate=0.2).train()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(1)
    ref = model(x)
    tr.apply(model, "chunked(size=64)")
    torch.manual_seed(1)
    torch.testing.assert_close(model(x), ref, rtol=0, atol=1e-6)
    torch.manual_seed(2)
    assert not torch.allclose(model(x), ref)


@pytest.mark.parametrize("chunk", [16, 40])
def test_one_chunk_is_full_attention(chunk):
    q, k, v = qkv(17)
    full, _ = attend(q, k, v, scale=SCALE, num_prefix=1)
    one, _ = attend(q, k, v, scale=SCALE, num_prefix=1, chunk=chunk)
    torch.testing.assert_close(one, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("p", [0, 1, 3])
@pytest.mark.parametrize("chunk", [1, 4, 5, 15])
@pytest.mark.parametrize("bias_kind", [None, "key", "full"])
@pytest.mark.parametrize("with_policy", [False, True])
def test_chunks_equal_a_masked_dense_reference(p, chunk, bias_kind, with_policy):
    n = p + 16  # chunk 5 or 15 leaves a partial last chunk
    q, k, v = qkv(n, seed=chunk)
    bias = make_bias(bias_kind, n)
    policy = make_policy(n, p) if with_policy else None
    ref_o, ref_probs = reference(q, k, v, p=p, chunk=chunk, bias=bias, policy=policy)
    o, probs = attend(q, k, v, scale=SCALE, bias=bias, policy=policy, chunk=chunk, num_prefix=p)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-6)
    assert probs is None
    o, probs = attend(q, k, v, scale=SCALE, bias=bias, policy=policy, chunk=chunk, num_prefix=p, need_probs=True)
    torch.testing.assert_close(o, ref_o, rtol=0, atol=1e-6)
    check_chunked_probs(probs, ref_probs, p, chunk)
    dense = probs.dense()
    torch.testing.assert_close(dense, ref_probs, rtol=0, atol=1e-6)
    assert (dense[..., ~allowed(n, p, chunk)] == 0).all(), "zeros outside the chunk pattern"
    torch.testing.assert_close(dense.sum(-1), torch.ones(B, H, n))


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias_kind", [None, "key"])
def test_warm_chunked_attention_builds_no_index_tensor(bias_kind):
    """The chunks' key positions depend only on shapes: cached after the first call, not rebuilt in every block."""
    n, p = 1 + 16, 1
    q, k, v = qkv(n)
    bias = make_bias(bias_kind, n)
    attend(q, k, v, scale=SCALE, bias=bias, chunk=5, num_prefix=p)  # warm
    with _Ops() as ops_seen:
        attend(q, k, v, scale=SCALE, bias=bias, chunk=5, num_prefix=p)
    assert ops_seen.names and "aten.arange" not in ops_seen.names, ops_seen.names


def check_chunked_probs(probs: ChunkedProbs, ref: torch.Tensor, p: int, chunk: int) -> None:
    """Chunked probabilities stay per chunk: the prefix rows (B, H, p, N) and (B, H, n_g, c_g, p + c_g) per
    group of equal chunks, equal to the reference's prefix and own-chunk columns; no (N, N) tensor."""
    n = ref.shape[-1]
    assert isinstance(probs, ChunkedProbs) and probs.num_prefix == p
    full, rest = divmod(n - p, chunk)
    assert list(probs.groups) == [(p, full, chunk)] + ([(p + full * chunk, 1, rest)] if rest else [])
    if p:
        torch.testing.assert_close(probs.prefix, ref[:, :, :p], rtol=0, atol=1e-6)
    else:
        assert probs.prefix is None
    for (start, count, size), a, diag in zip(probs.groups, probs.chunks, probs.diagonal(), strict=True):
        assert a.shape == (B, H, count, size, p + size) and diag.shape == (B, H, count, size, size)
        for m in range(count):
            rows = ref[:, :, start + m * size:start + (m + 1) * size]  # (B, H, size, n)
            own = rows[..., start + m * size:start + (m + 1) * size]
            torch.testing.assert_close(a[:, :, m], torch.cat([rows[..., :p], own], -1), rtol=0, atol=1e-6)
            torch.testing.assert_close(diag[:, :, m], own, rtol=0, atol=1e-6)


def test_chunked_gradients_match_the_reference():
    q, k, v = (t.requires_grad_(True) for t in qkv(13))
    bias = make_bias("key", 13).requires_grad_(True)
    attend(q, k, v, scale=SCALE, bias=bias, chunk=5, num_prefix=1)[0].square().sum().backward()
    got = [t.grad.clone() for t in (q, k, v, bias)]
    for t in (q, k, v, bias):
        t.grad = None
    reference(q, k, v, p=1, chunk=5, bias=bias)[0].square().sum().backward()
    for g, t in zip(got, (q, k, v, bias), strict=True):
        torch.testing.assert_close(g, t.grad, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    ({"chunk": 0}, "positive int"),
    ({"bias": torch.zeros(B, 1, 9)}, "4-D"),
    ({"bias": torch.zeros(B, 1, 3, 9)}, "broadcastable"),
])
def test_attend_rejects_bad_contributions(kwargs, match):
    q, k, v = qkv(9)
    with pytest.raises(tr.TokenReduceError, match=match):
        attend(q, k, v, scale=SCALE, num_prefix=1, **kwargs)


# ----- MACs -----------------------------------------------------------------------------------


def test_attention_macs_formula():
    assert attention_macs(65, 64, 1) == 2 * 65 * 65 * 64
    assert attention_macs(65, 64, 1, chunk=64) == attention_macs(65, 64, 1, chunk=500) == 2 * 65 * 65 * 64
    # prefix row over all 65 keys, chunks of 24, 24, 16 patch queries over 1 + their chunk's keys
    assert attention_macs(65, 64, 1, chunk=24) == 2 * 64 * (65 + 2 * 24 * 25 + 16 * 17)
    assert attention_macs(64, 64, 0, chunk=16) == 2 * 64 * 4 * 16 * 16


@pytest.mark.parametrize("host", ["deit", "registers", "avgpool"])
@pytest.mark.parametrize("size", [16, 24])
def test_chunked_macs_match_the_flop_counter(host, size):
    """The chunked forward really computes less, and exactly what attention_macs says."""
    full = count_macs(make_host(host))
    model = tr.apply(make_host(host), f"chunked(size={size})")
    report = count_macs(model)
    assert report.total == flop_counter_macs(model)
    p = model.num_prefix_tokens
    assert [b.attn for b in report.blocks] == [attention_macs(64 + p, 64, p, chunk=size)] * 4
    assert report.total < full.total and report.tokens_per_block == full.tokens_per_block


# ----- the adapter: contributions and probabilities --------------------------------------------


@dataclass(frozen=True)
class ProbeConfig:
    chunk: int | None = None
    biased: bool = True


class Probe(Reducer):
    """A test method (not registered): asks for the probabilities at block 1, declares a bias and a
    chunk at every block, and prunes to 48 patches by the CLS row of the probabilities."""

    name = "probe"
    Config = ProbeConfig
    needs = frozenset({"probs"})
    needs_class_token = True

    def bind(self, host):
        self.seen = {}
        return compile_schedule(host.num_patches, host.depth, "probe", where="attn", counts=(48,), locs=(1,))

    def attention_chunk(self, block):
        return self.cfg.chunk

    def attn_bias(self, state, block):
        if not self.cfg.biased:
            return None
        return (state.index % 5).float()[:, None, None, :] * -0.4  # (B, 1, 1, N)

    def reduce(self, x, state, info, count):
        self.seen[state.block] = info
        rows = info.probs.prefix if isinstance(info.probs, ChunkedProbs) else info.probs  # prefix rows: every key
        keep, _ = ops.keep_topk(rows[:, :, 0, state.num_prefix:].mean(1), count, state.num_prefix)
        return state.gather(x, keep)


@pytest.mark.parametrize("chunk", [None, 24])
def test_probabilities_and_declared_contributions_reach_the_method(chunk, images):
    model = make_host("layerscale")
    probe = Probe(ProbeConfig(chunk=chunk))
    tr.apply(model, probe)
    inputs = {}
    model.blocks[1].norm1.register_forward_hook(lambda m, a, out: inputs.setdefault("x", out))
    with torch.no_grad():
        model(images)
    probs = probe.seen[1].probs
    n = 65
    if chunk is not None:  # per chunk as computed; the dense layout only on request
        assert isinstance(probs, ChunkedProbs)
        assert [a.shape for a in probs.chunks] == [(3, 2, 2, 24, 25), (3, 2, 1, 16, 17)]
        probs = probs.dense()
    assert probs.shape == (3, 2, n, n)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 2, n))
    # the same probabilities computed densely from the block's input, the declared bias and chunks
    attn = model.blocks[1].attn
    q, k, v = attn.qkv(inputs["x"]).reshape(3, n, 3, 2, 32).permute(2, 0, 3, 1, 4)
    bias = (torch.arange(n) % 5).float().expand(3, 1, 1, n) * -0.4
    logits = (q * attn.scale) @ k.transpose(-2, -1) + bias
    want = logits.masked_fill(~allowed(n, 1, chunk), float("-inf")).softmax(-1)
    torch.testing.assert_close(probs, want, rtol=0, atol=1e-5)
    assert tr.get_info(model).tokens_per_block == [65, 49, 49, 49]


def test_a_method_bias_changes_the_attention(images):
    model = make_host("deit")
    with torch.no_grad():
        biased = tr.apply(model, Probe(ProbeConfig(biased=True)))(images)
        plain = tr.apply(model, Probe(ProbeConfig(biased=False)))(images)
    assert not torch.allclose(biased, plain)


# ----- gradient checkpointing -------------------------------------------------------------------


def _train_step(model, images, seed):
    torch.manual_seed(seed)
    model.zero_grad()
    with tr.capture(model) as seen:  # the live record: its auxiliary losses keep their graph
        out = model(images)
    loss = out.square().mean() + sum(seen.last.aux_losses.values(), torch.tensor(0.0))
    loss.backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("spec", [
    "topk(keep=0.5, locs=(1,))",
    "tome(r=(8, 0, 8, 0))",  # log-size bias passed into the checkpointed blocks
    "chunked(size=24)",
    "dynamicvit(keep=0.5, locs=(1,))",  # keep policy passed into the checkpointed blocks
    "diffrate(prune=(60, 50, 40, 30), merge=(52, 52, 36, 20))",  # the similarity-weighted mass passed along
])
def test_grad_checkpointing_gives_equal_outputs_and_gradients(spec, images):
    torch.manual_seed(0)
    model = VisionTransformer(**TINY, init_values=0.1, attn_drop_rate=0.1, drop_path_rate=0.1).train()
    tr.apply(model, spec)
    calls = []
    for blk in model.blocks:
        blk.norm1.register_forward_hook(lambda m, a, out: calls.append(1))
    out, grads = _train_step(model, images, seed=3)
    plain_calls = len(calls)
    model.set_grad_checkpointing(True)
    calls.clear()
    out_ckpt, grads_ckpt = _train_step(model, images, seed=3)
    assert len(calls) > plain_calls, "no block was recomputed: checkpointing did not run"
    torch.testing.assert_close(out_ckpt, out, rtol=0, atol=1e-6)
    assert grads_ckpt.keys() == grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(grads_ckpt[name], g, rtol=1e-5, atol=1e-6, msg=name)
    with torch.no_grad():  # nothing to checkpoint without gradients; still the same forward
        model.eval()
        assert torch.isfinite(model(images)).all()


# ----- dense outputs ------------------------------------------------------------------------------


DENSE = [("topk(keep=0.5, locs=(1, 2))", "topk(keep=1.0, locs=(1,))"), ("tome(r=8)", "tome(r=0)")]


@pytest.mark.parametrize("host", ["deit", "registers", "avgpool"])
@pytest.mark.parametrize("spec,zero", DENSE)
def test_dense_returns_one_token_per_original_position(spec, zero, host, images):
    model = make_host(host)
    if tr.get_method(tr.parse_spec(spec)[0]).needs_class_token and model.cls_token is None:
        pytest.skip("needs a class token")
    p = model.num_prefix_tokens
    with torch.no_grad():
        ref = model.forward_features(images)
        tr.apply(model, zero, dense=True)
        torch.testing.assert_close(model.forward_features(images), ref, rtol=1e-5, atol=1e-5)
        tr.apply(model, spec, trace=True)
        plain = model.forward_features(images)  # (3, N, C): the reduced tokens
        info = tr.get_info(model)
        tr.apply(model, spec, trace=True, dense=True)
        dense = model.forward_features(images)
        logits = model(images)
    assert dense.shape == (3, p + 64, 64) and plain.shape[1] < p + 64
    assert logits.shape == (3, 10) and torch.isfinite(dense).all()
    assert tr.get_info(model).tokens_per_block == info.tokens_per_block
    # every original position a final token holds carries that token (merged ones are copied)
    source = info.snapshots[max(info.snapshots)]  # (3, N, p + 64)
    held = source.sum(1) > 0
    expected = source.transpose(1, 2) @ plain  # (3, p + 64, C)
    torch.testing.assert_close(dense[held], expected[held], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense[:, :p], plain[:, :p])
    if build_reducer(spec).conserves_patches:
        assert held.all()
    else:  # pruned positions come back with the values they had when pruned, not as copies
        assert not held.all()


# ----- stems --------------------------------------------------------------------------------------


class _Stem(nn.Sequential):
    """A projection that is not a Conv2d, like the models' conv stem."""


def test_input_channels_are_read_from_the_projection_attribute(images):
    model = make_host("deit")
    model.patch_embed.proj = _Stem(model.patch_embed.proj)
    tr.apply(model, "tome(r=8)")
    assert model(images).shape == (3, 10)  # no in_channels: not checked, and not assumed
    model.patch_embed.proj.in_channels = 3
    with pytest.raises(tr.TokenReduceError, match="3 input channels"):
        model(images[:, :1])

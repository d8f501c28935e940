"""A key-only attention bias folded into q and k (core.attention, ``FOLD_KEY_BIAS``): the algebra, equal
to the float-mask path in fp32 (outputs and gradients), SDPA called without a mask, the paths that keep
theirs, reduced precision, and every registered method whose example passes a key bias (found by
watching SDPA, no name), patched-model logits and gradients with the fold on and off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from conftest import make_host, supplied

import tokenreduce as tr
from tokenreduce.core import attention
from tokenreduce.core.attention import attend, fold_key_bias, key_bias_folding
from tokenreduce.core.method import format_spec

B, H, N = 2, 3, 11
TOL = dict(rtol=0, atol=1e-5)  # outputs: the bound the fold is held to in fp32
GRAD_TOL = dict(rtol=1e-5, atol=1e-5)  # gradients: as large as ~20 here, so relative too


def tensors(d: int, bias_shape: tuple[int, ...], seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g) for _ in range(3))
    bias = torch.rand(bias_shape, generator=g).mul(40).add(1).log()  # log(size), sizes 1..41
    return q, k, v, bias


@contextmanager
def sdpa_masks() -> Iterator[list[torch.Tensor | None]]:
    """Record the ``attn_mask`` of every SDPA call (None for none)."""
    seen: list[torch.Tensor | None] = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return original(*args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        yield seen
    finally:
        F.scaled_dot_product_attention = original


def key_only(mask: torch.Tensor | None) -> bool:
    return mask is not None and mask.shape[-2] == 1


KEY_SHAPES = [(B, 1, 1, N), (1, 1, 1, N), (B, H, 1, N), (1, H, 1, N)]


# ----- the algebra --------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [7, 8, 32, 64])
def test_the_folded_dot_products_are_the_biased_logits(d):
    q, k, v, bias = tensors(d, (B, 1, 1, N))
    s = d**-0.5
    qf, kf, vf = fold_key_bias(q, k, v, bias, s)
    width = qf.shape[-1]
    assert width % 8 == 0 and d < width <= d + 8 and kf.shape == vf.shape == qf.shape
    torch.testing.assert_close(s * qf @ kf.transpose(-2, -1), s * q @ k.transpose(-2, -1) + bias, **TOL)
    assert torch.equal(vf[..., :d], v) and not vf[..., d:].any()
    assert torch.equal(qf[..., :d], q) and torch.equal(kf[..., :d], k)


@pytest.mark.parametrize("d", [7, 8, 32, 64])
@pytest.mark.parametrize("shape", KEY_SHAPES)
def test_folding_equals_the_mask_path(d, shape):
    q, k, v, bias = tensors(d, shape, seed=d)
    args = dict(scale=d**-0.5, num_prefix=1)
    with key_bias_folding(True), sdpa_masks() as masks:
        folded, _ = attend(q, k, v, bias=bias, **args)
    assert masks == [None], "the folded path hands SDPA no mask"
    with key_bias_folding(False), sdpa_masks() as masks:
        masked, _ = attend(q, k, v, bias=bias, **args)
    assert len(masks) == 1 and key_only(masks[0])
    assert folded.shape == masked.shape == (B, H, N, d)
    torch.testing.assert_close(folded, masked, **TOL)
    # and the explicit softmax, the definition
    explicit = ((q * args["scale"]) @ k.transpose(-2, -1) + bias).softmax(-1) @ v
    torch.testing.assert_close(folded, explicit, **TOL)


def test_folding_carries_the_same_gradients():
    q, k, v, bias = (t.requires_grad_(True) for t in tensors(32, (B, H, 1, N)))
    grads = []
    for fold in (True, False):
        with key_bias_folding(fold):
            attend(q, k, v, scale=32**-0.5, bias=bias)[0].square().sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v, bias)])
        for t in (q, k, v, bias):
            t.grad = None
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **GRAD_TOL)


def test_the_setting_is_read_at_every_call_and_restored():
    assert attention.FOLD_KEY_BIAS == "cuda", "the default folds on CUDA only"
    q, k, v, bias = tensors(8, (B, 1, 1, N))
    with sdpa_masks() as masks:  # the default on the CPU: the mask, as SDPA's CPU kernel takes it
        attend(q, k, v, scale=0.3, bias=bias)
    assert key_only(masks[0])
    with key_bias_folding(True):
        assert attention.FOLD_KEY_BIAS is True
        with sdpa_masks() as masks:
            attend(q, k, v, scale=0.3, bias=bias)
        assert masks == [None]
    assert attention.FOLD_KEY_BIAS == "cuda"
    with pytest.raises(RuntimeError), key_bias_folding(False):
        raise RuntimeError
    assert attention.FOLD_KEY_BIAS == "cuda"
    with pytest.raises(tr.TokenReduceError, match="True, False or 'cuda'"), key_bias_folding("cpu"):
        pass


# ----- what keeps its path ----------------------------------------------------------------------------


def test_full_biases_policies_probabilities_and_chunks_keep_their_paths():
    q, k, v, key_bias = tensors(8, (B, 1, 1, N))
    full_bias = torch.randn(B, H, N, N, generator=torch.Generator().manual_seed(4))
    with key_bias_folding(True):
        with sdpa_masks() as masks:
            attend(q, k, v, scale=0.3, bias=full_bias)
        assert masks[0] is full_bias or torch.equal(masks[0], full_bias), "a full bias stays a mask"
        with sdpa_masks() as masks:  # the explicit softmax adds the bias itself: no SDPA call
            attend(q, k, v, scale=0.3, bias=key_bias, policy=torch.ones(B, N))
            attend(q, k, v, scale=0.3, bias=key_bias, need_probs=True)
        assert masks == []
        with sdpa_masks() as masks:  # chunked attention: the prefix rows and each group keep the mask
            attend(q, k, v, scale=0.3, bias=key_bias, chunk=4, num_prefix=1)
        assert len(masks) == 3 and all(key_only(m) for m in masks)  # prefix rows, chunks 4 + 4, chunk 2


def test_reduced_precision_stays_within_its_rounding():
    """In bf16 the folded channels are rounded as the mask is: both paths are as far from the fp32
    result as bf16 arithmetic allows (the attention itself in bf16)."""
    q, k, v, bias = tensors(32, (B, 1, 1, N))
    s = 32**-0.5
    want, _ = attend(q, k, v, scale=s, bias=bias)
    low = [t.bfloat16() for t in (q, k, v, bias)]
    for fold in (True, False):
        with key_bias_folding(fold):
            got, _ = attend(*low[:3], scale=s, bias=low[3])
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=0, atol=0.05)


# ----- every registered method with a key bias ----------------------------------------------------


def _key_biased(model: torch.nn.Module, images: torch.Tensor) -> bool:
    """Whether an eval forward of ``model`` hands SDPA a key-only mask when nothing is folded."""
    with key_bias_folding(False), supplied(model), torch.no_grad(), sdpa_masks() as masks:
        model.eval()(images)
    return any(key_only(m) for m in masks)


def _run(model: torch.nn.Module, images: torch.Tensor, fold: bool) -> tuple[torch.Tensor, list, dict]:
    """Eval logits, the SDPA masks of that forward, and the parameters' gradients of a training step."""
    with key_bias_folding(fold), supplied(model):
        with torch.no_grad(), sdpa_masks() as masks:
            logits = model.eval()(images)
        model.train().zero_grad()
        model(images).logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits, masks, grads


EXTRA = ["bspf(size=24, keep=0.5, locs=(1, 2), prop_attn=True)"]  # a key bias that only an option turns on
SPECS = [format_spec(m, tr.get_method(m).example) for m in tr.list_methods()] + EXTRA


@pytest.mark.parametrize("host", ["deit", "registers"])
@pytest.mark.parametrize("spec", SPECS)
def test_patched_models_with_a_key_bias_agree_folded_and_masked(spec, host, images):
    model = tr.apply(make_host(host), spec)
    if not _key_biased(model, images):
        pytest.skip(f"{spec} passes no key-only bias to the attention")
    masked, _, masked_grads = _run(model, images, fold=False)
    folded, fold_masks, folded_grads = _run(model, images, fold=True)
    torch.testing.assert_close(folded, masked, **TOL)
    assert folded_grads.keys() == masked_grads.keys()
    for name, g in masked_grads.items():
        torch.testing.assert_close(folded_grads[name], g, **GRAD_TOL, msg=name)
    reducer = tr.reducer_of(model)
    if all(reducer.attention_chunk(b) is None for b in range(len(model.blocks))):
        assert not any(key_only(m) for m in fold_masks), "an unchunked key bias still reached SDPA as a mask"


# ----- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_on_cuda_the_folded_bias_runs_on_the_flash_kernel(dtype):
    """By default a key bias is folded on CUDA; the folded inputs run on the flash kernel alone, which
    refuses the float mask; both agree with the fp32 mask path to the precision of ``dtype``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, bias = (t.cuda() for t in tensors(64, (B, 1, 1, N)))
    s = 64**-0.5
    with key_bias_folding(False):
        want, _ = attend(q, k, v, scale=s, bias=bias)
    low = [t.to(dtype) for t in (q, k, v, bias)]
    with sdpa_masks() as masks:
        default, _ = attend(*low[:3], scale=s, bias=low[3])
    assert masks == [None], "the default folds on CUDA"
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash, _ = attend(*low[:3], scale=s, bias=low[3])
        with pytest.raises(RuntimeError), key_bias_folding(False):
            attend(*low[:3], scale=s, bias=low[3])
    for got in (default, flash):
        torch.testing.assert_close(got.float(), want, rtol=0, atol=0.05)

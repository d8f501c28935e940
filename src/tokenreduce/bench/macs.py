"""Analytic MACs of a timm ViT forward, from the real per-block token counts.

MACs are multiply-accumulates (one MAC = two FLOPs); every number here is MACs, per image.
With N tokens entering a block (prefix included), D the embedding width, A = heads * head_dim
the attention width (A = D in every standard ViT) and the MLP's linear layers of sizes
(D -> hidden -> D):

    qkv   = N * D * 3A                      (the fused q, k, v projection)
    attn  = 2 * N^2 * A                     (Q K^T and (softmax) V)
    proj  = N * A * D
    mlp   = N' * (D * hidden + hidden * D)  (N' = tokens the MLP sees)

A reducer with ``where='attn'`` runs after attention, so the MLP sees N' = the reduced count; with
``where='block'`` it runs after the MLP (N' = N) and only the next block sees the reduction.
Linear sizes are read from the modules themselves (qkv, proj, every nn.Linear of the MLP), so
GLU MLPs and non-standard widths are counted as they are. Once per image:

    stem  = patches * in_chans * ph * pw * D   (timm's PatchEmbed convolution)
    head  = D * num_classes                    (and the distillation head, if any)

Scoring side products, only in blocks where a reduction happens (M = N - prefix patch tokens):

    cls_attn   = N * A              the CLS attention row q_cls K^T (EViT, top-k, CTP)
    head_norms = N * A              ||A_h V_h||_2 per token and head (CTP)
    tome       = ceil(M/2) * floor(M/2) * head_dim   cosine matching of set A against set B
    evit       = (dropped tokens) * D   the attention-weighted fused token
    dynamicvit = M * (D*D + D*D/2 + D/2*D/4 + D/4*2)   the stage's keep predictor (its Linears)

A method may define ``scoring_macs(block, tokens_in, count, host) -> int`` to declare its own cost
(a learned predictor must, or have an entry in the table below). Norms, softmax, GELU,
residual adds, gathers and size-weighted averages are not MACs and are not counted - the same
convention as torch.utils.flop_counter and fvcore. :func:`flop_counter_macs` measures a real
forward with torch.utils.flop_counter for cross-checking (FLOPs / 2 = MACs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..adapters import timm_vit
from ..core.errors import TokenReduceError
from ..core.method import Host, Reducer

#: Cost of a method's own scoring beyond the attention side products, keyed by registry id:
#: f(reducer, block, tokens_in, count, host) -> MACs. A ``scoring_macs`` method on the reducer wins.
ScoringCost = Callable[[Reducer, int, int, int, Host], int]
_SCORING: dict[str, ScoringCost] = {}

#: MACs per token of each attention side product a method may ask for (core.method.NEEDS), as a
#: multiple of the attention width A. The keys are reused as they are, so they cost nothing.
_NEEDS: dict[str, int] = {"cls_attn": 1, "head_norms": 1, "keys": 0}


def register_scoring_cost(name: str) -> Callable[[ScoringCost], ScoringCost]:
    """Decorator: declare the scoring MACs of method ``name`` (for methods without ``scoring_macs``)."""

    def deco(fn: ScoringCost) -> ScoringCost:
        _SCORING[name] = fn
        return fn

    return deco


@register_scoring_cost("tome")
def _tome_matching(reducer: Reducer, block: int, tokens_in: int, count: int, host: Host) -> int:
    m = tokens_in - host.num_prefix
    return math.ceil(m / 2) * (m // 2) * (host.dim // host.num_heads)


@register_scoring_cost("evit")
def _evit_fusion(reducer: Reducer, block: int, tokens_in: int, count: int, host: Host) -> int:
    if not getattr(reducer.cfg, "fuse", False):
        return 0
    dropped = tokens_in - host.num_prefix - (count - 1)
    return dropped * host.dim


@register_scoring_cost("dynamicvit")
def _dynamicvit_predictor(reducer: Reducer, block: int, tokens_in: int, count: int, host: Host) -> int:
    # every stage's predictor has the same layers (KeepPredictor(dim)), so the first one's cost is any stage's
    return (tokens_in - host.num_prefix) * _linear_macs(reducer.predictors[0])


@dataclass(frozen=True)
class BlockMacs:
    """MACs of one block for one image; tokens include the prefix tokens."""

    block: int
    tokens_in: int
    tokens_mlp: int
    tokens_out: int
    qkv: int
    attn: int
    proj: int
    mlp: int
    scoring: int

    @property
    def total(self) -> int:
        return self.qkv + self.attn + self.proj + self.mlp + self.scoring


@dataclass(frozen=True)
class MacsReport:
    """MACs per image of one forward: stem, every block, head."""

    spec: str | None
    img_size: tuple[int, int]
    stem: int
    blocks: tuple[BlockMacs, ...]
    head: int

    @property
    def total(self) -> int:
        return self.stem + sum(b.total for b in self.blocks) + self.head

    @property
    def scoring(self) -> int:
        return sum(b.scoring for b in self.blocks)

    @property
    def tokens_per_block(self) -> list[int]:
        """Total tokens (prefix included) leaving each block."""
        return [b.tokens_out for b in self.blocks]

    def as_dict(self) -> dict:
        return {
            "spec": self.spec, "img_size": list(self.img_size), "macs": self.total, "stem": self.stem,
            "head": self.head, "scoring": self.scoring, "tokens_per_block": self.tokens_per_block,
            "blocks": [asdict(b) | {"total": b.total} for b in self.blocks],
        }


def _linear_macs(module: nn.Module) -> int:
    """Multiply-accumulates per token of every nn.Linear inside ``module`` (sum of in * out)."""
    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def input_shape(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> tuple[int, int, int]:
    """(C, H, W) of the images ``model`` takes; ``img_size`` overrides the model's own size."""
    pe = model.patch_embed
    proj = getattr(pe, "proj", None)
    chans = proj.in_channels if isinstance(proj, nn.Conv2d) else 3
    if img_size is None:
        img_size = pe.img_size
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    return chans, int(h), int(w)


def _stem_macs(model: nn.Module, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(MACs, patches) of the stem for one image of ``shape`` (C, H, W)."""
    pe = model.patch_embed
    proj = getattr(pe, "proj", None)
    if isinstance(proj, nn.Conv2d) and proj.kernel_size == proj.stride:
        ph, pw = proj.stride
        patches = (shape[1] // ph) * (shape[2] // pw)
        return patches * (proj.in_channels // proj.groups) * ph * pw * proj.out_channels, patches
    # An alternative stem (e.g. the local-coherence conv stem) has no closed form here; its cost
    # does not depend on the reduction, so measuring it once is as good as deriving it.
    ref = next(model.parameters())
    x = torch.zeros(1, *shape, device=ref.device, dtype=ref.dtype)
    with torch.inference_mode(), _flop_mode() as fc:
        out = pe(x)
    return fc.get_total_flops() // 2, out.shape[1] if out.dim() == 3 else out.shape[1] * out.shape[2]


def _block_tokens(model: nn.Module, patches: int) -> tuple[Reducer | None, Host, list[tuple[int, int, int, bool]]]:
    """The reducer (None when unpatched) and, per block, (tokens in, tokens the MLP sees,
    tokens out, reduced here), all including the prefix tokens."""
    host = timm_vit.check_host(model)
    p = host.num_prefix
    if not hasattr(model, timm_vit._ATTR):
        return None, host, [(patches + p, patches + p, patches + p, False)] * host.depth
    patch = timm_vit.get_patch(model)
    sched, host = patch.schedule, patch.host
    if patches != sched.num_patches:
        raise TokenReduceError(
            f"the schedule was compiled for {sched.num_patches} patches, the image size gives {patches}; "
            "apply the method to a model created for this image size"
        )
    rows, n = [], sched.num_patches
    for i in range(host.depth):
        count = sched.count_at(i)
        active = count is not None and count < n  # the adapter's rule: a no-op block is skipped
        out = count if active else n
        mid = out if active and patch.reducer.where == "attn" else n
        rows.append((n + p, mid + p, out + p, active))
        n = out
    return patch.reducer, host, rows


def _scoring(reducer: Reducer, block: int, tokens_in: int, count: int, host: Host, attn_width: int) -> int:
    macs = sum(_NEEDS[need] * attn_width * tokens_in for need in reducer.needs)
    own = getattr(reducer, "scoring_macs", None)
    if own is not None:
        return macs + int(own(block, tokens_in, count, host))
    cost = _SCORING.get(reducer.name)
    return macs + (cost(reducer, block, tokens_in, count, host) if cost else 0)


def count_macs(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> MacsReport:
    """Analytic MACs per image of ``model``'s forward (patched or not) at ``img_size``.

    A patched model is counted from its compiled schedule (``get_info(model).schedule``), which
    is what its forward runs; an unpatched one runs every block on all tokens.
    """
    shape = input_shape(model, img_size)
    stem, patches = _stem_macs(model, shape)
    reducer, host, rows = _block_tokens(model, patches)
    blocks = []
    for i, (blk, (n, mid, out, active)) in enumerate(zip(model.blocks, rows, strict=True)):
        attn = blk.attn
        width = attn.num_heads * attn.head_dim
        scoring = _scoring(reducer, i, n, out - host.num_prefix, host, width) if active else 0
        blocks.append(BlockMacs(
            block=i, tokens_in=n, tokens_mlp=mid, tokens_out=out,
            qkv=n * _linear_macs(attn.qkv), attn=2 * n * n * width, proj=n * _linear_macs(attn.proj),
            mlp=mid * _linear_macs(blk.mlp), scoring=scoring,
        ))
    head = _linear_macs(model.head) + _linear_macs(getattr(model, "head_dist", None) or nn.Identity())
    spec = reducer.spec() if reducer is not None else None
    return MacsReport(spec, shape[1:], stem, tuple(blocks), head)


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flop_mode():
    """FlopCounterMode that also counts the CPU fused-attention kernel (unregistered in torch)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    custom = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        custom[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops
    return FlopCounterMode(display=False, custom_mapping=custom)


def flop_counter_macs(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> int:
    """MACs per image measured by torch.utils.flop_counter on a real forward (FLOPs / 2)."""
    shape = input_shape(model, img_size)
    ref = next(model.parameters())
    x = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0)).to(ref.device, ref.dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), _flop_mode() as fc:
            model(x)
    finally:
        model.train(was_training)
    return fc.get_total_flops() // 2

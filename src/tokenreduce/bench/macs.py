"""Analytic MACs of a ViT forward (any host), from the real per-block token counts.

MACs are multiply-accumulates (one MAC = two FLOPs); every number here is MACs, per image.
With N tokens entering a block (prefix included), p of them prefix tokens, D the embedding width,
A = heads * head_dim the attention width (A = D in every standard ViT) and the MLP's linear layers
of sizes (D -> hidden -> D):

    qkv   = N * D * 3A                      (the fused q, k, v projection)
    attn  = 2 * N^2 * A                     (Q K^T and (softmax) V; core.attention.attention_macs,
                                             less when the reducer declares chunked attention)
    proj  = N * A * D
    mlp   = N' * (D * hidden + hidden * D)  (N' = tokens the MLP sees)

A reducer whose ``where`` is 'attn' runs after attention, so the MLP sees N' = the reduced count;
with 'block' it runs after the MLP (N' = N) and only the next block sees the reduction; a composite
at both points (core/compose.py) says N' itself (``Schedule.mlp_count``). A block
counts as reduced exactly when ``Schedule.active(block, tokens)`` says so (the adapter's rule).
Linear sizes are read from the modules themselves (qkv, proj, every nn.Linear of the MLP), so
GLU MLPs and non-standard widths are counted as they are; the modules are the host's own, named
by its adapter (``adapters.hosts.parts``: a fused qkv Linear or separate q, k, v ones). Once per image:

    stem  = patches * in_chans * ph * pw * D   (the patch-embedding convolution, or SigLIP 2's Linear on
                                                patchified images)
    head  = D * num_classes                    (every head the host has: a distillation head, a pooler)

Scoring, only in blocks where the schedule is active: what the reducer declares,
``reducer.scoring_macs(block, tokens_in, count, host)`` - the attention side products it asked for
(core.method.NEED_MACS) plus its own scoring (a matching, a learned predictor). This module knows
no method. Norms, softmax, GELU, residual adds, gathers and weighted sums are not MACs and are not
counted - the convention of torch.utils.flop_counter, which :func:`flop_counter_macs` runs on a real
forward for cross-checking (FLOPs / 2 = MACs). One difference: SigLIP 2's resize of its position
embeddings to the input's grid, which transformers computes as an (N, G) x (G, D) matmul (G: its
embedding grid), the counter sees and this module does not (an interpolation, the same in every case).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from ..adapters import hosts
from ..core.attention import attention_macs
from ..core.errors import TokenReduceError
from ..core.method import Host, Reducer


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
    parts = hosts.parts(model)
    # the input channels, whatever the stem's projection is (a Conv2d, or a stem that sets it)
    chans = parts.in_chans
    if img_size is None:
        img_size = parts.img_size
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    return chans, int(h), int(w)


def _stem_macs(model: nn.Module, shape: tuple[int, int, int]) -> tuple[int, int]:
    """(MACs, patches) of the stem for one image of ``shape`` (C, H, W)."""
    parts = hosts.parts(model)
    pe, proj = parts.stem, parts.stem_proj
    if isinstance(proj, nn.Conv2d) and proj.kernel_size == proj.stride:
        ph, pw = proj.stride
        patches = (shape[1] // ph) * (shape[2] // pw)
        return patches * (proj.in_channels // proj.groups) * ph * pw * proj.out_channels, patches
    if isinstance(proj, nn.Linear) and proj is pe:  # a Linear on patchified images (SigLIP 2): in_features = C p p
        patches = shape[0] * shape[1] * shape[2] // proj.in_features
        return patches * proj.in_features * proj.out_features, patches
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
    host = hosts.check_host(model)
    p = host.num_prefix
    if not hosts.is_patched(model):
        return None, host, [(patches + p, patches + p, patches + p, False)] * host.depth
    info = hosts.info(model)
    sched, host, reducer = info.schedule, info.host, hosts.reducer_of(model)
    if patches != sched.num_patches:
        raise TokenReduceError(
            f"the schedule was compiled for {sched.num_patches} patches, the image size gives {patches}; "
            "apply the method to a model created for this image size"
        )
    rows, n = [], sched.num_patches
    for i in range(host.depth):
        active = sched.active(i, n)
        out = sched.count_at(i) if active else n
        mid = sched.mlp_count(i, n)  # the attention point's count where a reducer acts there
        rows.append((n + p, mid + p, out + p, active))
        n = out
    return reducer, host, rows


def count_macs(model: nn.Module, img_size: int | tuple[int, int] | None = None) -> MacsReport:
    """Analytic MACs per image of ``model``'s forward (patched or not) at ``img_size``.

    A patched model is counted from its compiled schedule (``get_info(model).schedule``) and its
    reducer's declarations (``where``, ``attention_chunk``, ``scoring_macs``), which is what its
    forward runs; an unpatched one runs every block on all tokens.
    """
    shape = input_shape(model, img_size)
    stem, patches = _stem_macs(model, shape)
    reducer, host, rows = _block_tokens(model, patches)
    p = host.num_prefix
    blocks = []
    parts = hosts.parts(model)
    for i, (blk, (n, mid, out, active)) in enumerate(zip(parts.blocks, rows, strict=True)):
        attn = blk.attn
        width = attn.num_heads * attn.head_dim
        chunk = reducer.attention_chunk(i) if reducer is not None else None
        scoring = int(reducer.scoring_macs(i, n, out - p, host)) if active else 0
        blocks.append(BlockMacs(
            block=i, tokens_in=n, tokens_mlp=mid, tokens_out=out,
            qkv=n * sum(_linear_macs(m) for m in attn.inputs), attn=attention_macs(n, width, p, chunk=chunk),
            proj=n * _linear_macs(attn.output), mlp=mid * _linear_macs(blk.mlp), scoring=scoring,
        ))
    head = sum(_linear_macs(h) for h in parts.heads)
    if parts.pool is not None:  # an attention-pooling head over the tokens the last block leaves
        head += parts.pool.macs(rows[-1][2])
    spec = reducer.spec() if reducer is not None else None
    return MacsReport(spec, shape[1:], stem, tuple(blocks), head)


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _flop_mode():
    """FlopCounterMode that also counts the CPU fused-attention kernel (unregistered in torch)."""
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
    # the counter's module hooks fail on a parameter handed to a module as its input (timm's attention-pool
    # latent): no parameter requires grad while it counts
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    try:
        for p in trainable:
            p.requires_grad_(False)
        with torch.inference_mode(), _flop_mode() as fc:
            hosts.feed(model, x)(model)
    finally:
        model.train(was_training)
        for p in trainable:
            p.requires_grad_(True)
    return fc.get_total_flops() // 2

"""Patch a timm VisionTransformer in place, reversibly, to run a token reducer.

The patch replaces ``model.forward_features`` (an instance attribute; ``remove`` deletes it) with the
block loop every host shares (adapters/common.py, each block a :class:`TimmBlock` view) that calls
timm's own sub-modules by name: patch_embed, _pos_embed, patch_drop, norm_pre,
and per block norm1, attn.qkv, attn.q_norm, attn.k_norm, attn.norm, attn.proj, attn.proj_drop,
ls1, drop_path1, norm2, mlp, ls2, drop_path2, then norm. Attention is
:func:`tokenreduce.core.attention.attend` with the contributions declared for the block: the
log-size bias (``TokenState.attn_bias``), the reducer's own bias (``Reducer.attn_bias``), the keep
policy (``TokenState.keep_mask``), chunked attention (``Reducer.attention_chunk``) and the
probabilities when the method needs them; fused SDPA wherever nothing needs the probabilities.
The other side products a method asked for (CLS row, keys, head-output norms, the mean attention
received, a branch's representation shift) are computed beside it. The head (``forward_head``: pooling,
an attention-pool ``map`` head as SigLIP's, ``fc_norm``, ``head``) is timm's own, unpatched, on the
tokens the reduction left; a model without a class token (SigLIP, ``global_pool='avg'``) has
``num_prefix`` 0.

Behaving like timm's own forward:

- hooks: each Block is entered through its own ``__call__`` (``apply`` installs a forward on each
  block, :func:`tokenreduce.adapters.common.block_forward`, that runs the reduced block inside a
  patched forward and timm's ``Block.forward`` when the block is called on its own; ``remove``
  deletes it). A forward pre-hook on a block sees ``(x,)``, the tokens entering it (B, N_in, C), a
  forward hook its output (B, N_out, C), after the block's reduction; hooks with ``with_kwargs=True``
  also see the keyword ``tokenreduce`` (the forward's block loop). They fire once per forward, with
  checkpointing too (the checkpoint is inside the block's forward, where timm's own checkpoint_seq
  would call the block again in the backward pass). Hooks on norm1, attn.qkv, q_norm, k_norm,
  attn.norm, attn.proj, ls1, drop_path1, norm2, mlp, ls2, drop_path2 fire as they are called (again in
  a recomputation); a hook on ``attn`` itself does not fire (its projections are called instead);
- gradient checkpointing: with ``model.set_grad_checkpointing()`` every block, reducing or not, runs
  through timm's ``checkpoint`` (torch.utils.checkpoint, timm's reentrant setting), the reducer's work
  inside it and replayed exactly by the recomputation (:func:`tokenreduce.adapters.common.checkpointed`);
- hybrids (``vit_*_r*_*``, ``vit_*_resnet*``: timm's HybridEmbed, a CNN before the projection): the
  images have the CNN's channels and a token covers the CNN's stride times the projection's patch;
- any resolution: a model built with ``dynamic_img_size=True`` runs any input size, the schedule
  compiled for the input's grid (``Patch.at_grid``); a model built without it takes its own size only
  and other sizes are refused here, naming the option.
A reducer with parameters or buffers (a deployed Cropr's q) is attached as ``model.tokenreduce``
(its own state_dict keys); a training-free one adds no keys.

timm's other ways into the blocks run the same reduced loop or refuse, never the unreduced blocks:
``forward_intermediates`` is replaced too (``get_intermediate_layers`` and a features_only
``FeatureGetterNet`` call it; :func:`_forward_intermediates` says what it returns), a
FeatureGetterNet itself is refused at apply time (apply to its ``.model``), and
``torch.jit.script`` of a patched model raises (``__prepare_scriptable__``): TorchScript would
compile the class's own forward_features, the unpatched model. What is stored on the model is
picklable (module-level functions bound with functools.partial, no bound methods or closures), so
``torch.save(model)`` / pickle / deepcopy give a patched model again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from timm.layers import Attention, AttentionPoolLatent, HybridEmbed
from timm.models import checkpoint
from timm.models._features import FeatureGetterNet, feature_take_indices
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from ..core.errors import TokenReduceError, UnsupportedModelError
from ..core.method import AttnInfo, Host, Reducer
from ..core.state import TokenState
from .common import ATTR as _ATTR
from .common import (
    AttentionView,
    BlockView,
    Feed,
    HostParts,
    Patch,
    PoolCost,
    RefuseScript,
    attach,
    attend_view,
    contributions,
    detach,
    enter_blocks,
    guard_forward,
    hold_static,
    leave_blocks,
    run_blocks,
)
from .common import get_patch as get_patch

#: What the host registry (adapters/hosts.py) says this adapter patches.
DESCRIPTION = "timm VisionTransformer models (vit_*, deit_*, ...)"
#: The instance attributes ``apply`` sets, beside the Patch, and ``remove`` deletes.
def _timm_requirement() -> str:
    """The package metadata's timm requirement (pyproject.toml is its one home), e.g. 'timm>=1.0.23'."""
    from importlib.metadata import requires

    return next((r for r in requires("tokenreduce") or [] if r.replace(" ", "").startswith("timm")), "a newer timm")


_PATCHED_ATTRS = ("forward_features", "forward_intermediates", "__prepare_scriptable__")


def accepts(model: nn.Module) -> bool:
    """Whether ``model`` is for this adapter: a timm VisionTransformer, or a features_only wrapper of
    one (``check_host`` refuses that, naming its ``.model``, and says the rest)."""
    return isinstance(model, VisionTransformer) or (
        isinstance(model, FeatureGetterNet) and isinstance(model.model, VisionTransformer))


def check_host(model: nn.Module) -> Host:
    """Raise UnsupportedModelError unless ``model`` is a timm ViT this adapter can drive."""
    if isinstance(model, FeatureGetterNet) and isinstance(model.model, VisionTransformer):
        raise UnsupportedModelError(
            f"{type(model).__name__} (timm features_only) wraps a VisionTransformer: apply tokenreduce to its .model "
            "(tokenreduce.apply(net.model, spec)); net(x) then returns the reduced forward's intermediates"
        )
    if not isinstance(model, VisionTransformer):
        raise UnsupportedModelError(
            f"tokenreduce patches timm VisionTransformer models (vit_*, deit_*, ...); got "
            f"{type(model).__name__}"
        )
    for i, blk in enumerate(model.blocks):
        if type(blk) is not Block:
            raise UnsupportedModelError(
                f"block {i} is a {type(blk).__name__}; supported: timm's pre-norm Block"
            )
        if type(blk.attn) is not Attention:
            raise UnsupportedModelError(
                f"block {i} uses {type(blk.attn).__name__}; supported: timm's Attention"
            )
        if not hasattr(blk.attn, "attn_dim"):  # the attention's width, a separate attribute since timm 1.0.23
            raise UnsupportedModelError(
                f"block {i}'s Attention has no attn_dim: tokenreduce needs {_timm_requirement()} (pip install -U timm)"
            )
    pool = getattr(model, "attn_pool", None)
    if pool is not None and type(pool) is not AttentionPoolLatent:
        raise UnsupportedModelError(f"attention-pool head {type(pool).__name__} is not supported; supported: "
                                    "AttentionPoolLatent (global_pool='map', SigLIP's), or 'token', 'avg', ''")
    if not isinstance(model.patch_drop, nn.Identity):
        raise UnsupportedModelError("patch dropout changes the token count; build the model with patch_drop_rate=0")
    grid = tuple(model.patch_embed.grid_size)
    return Host(
        depth=len(model.blocks), dim=model.embed_dim, num_heads=model.blocks[0].attn.num_heads,
        num_prefix=model.num_prefix_tokens, num_patches=grid[0] * grid[1], grid=grid,
        has_class_token=model.cls_token is not None,
    )


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch ``model`` in place to run ``spec`` (e.g. ``'tome(r=13)'``); returns the model.

    ``trace=True`` records which original patches each token holds after every reduction
    (``get_info(model).snapshots``), for visualisation; it costs a (B, N, N) map per forward.
    ``dense=True``: ``forward_features`` returns one token per original position, (B, p + N0, C)
    in the original order (pruned tokens restored, merged ones copied to every position they
    hold: ``TokenState.dense``), for dense tasks.
    """
    patch = attach(model, spec, check_host(model), trace=trace, dense=dense, undo=remove)
    # partial, not a bound method: a bound method pickles as getattr(model, '_forward_features')
    model.forward_features = partial(_forward_features, model)
    model.forward_intermediates = partial(_forward_intermediates, model)
    model.__prepare_scriptable__ = RefuseScript(patch.reducer.spec())
    enter_blocks(model.blocks)
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply``: the model is again exactly timm's. Raises if it was not patched."""
    if not hasattr(model, _ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; nothing to remove")
    detach(model)
    for name in _PATCHED_ATTRS:  # the class's own methods again
        model.__dict__.pop(name, None)
    leave_blocks(model.blocks)
    return model


def _grid(model: nn.Module, x: Tensor) -> tuple[int, int]:
    """The patch grid (gh, gw) of images x (B, C, H, W), as timm's patch embedding makes it; a model
    built without ``dynamic_img_size`` takes only its own size (refused here, before timm's assert)."""
    if x.dim() != 4:
        raise TokenReduceError(f"expected images (B, C, H, W), got a tensor of shape {tuple(x.shape)}")
    pe = model.patch_embed
    chans = _in_chans(pe)
    if chans is not None and x.shape[1] != chans:
        raise TokenReduceError(f"model expects {chans} input channels, got {x.shape[1]}")
    hold_static(x.shape[2], x.shape[3])  # the grid is a constant of a compiled graph (common.hold_static)
    grid = tuple(pe.dynamic_feat_size((x.shape[2], x.shape[3])))
    if not getattr(model, "dynamic_img_size", False):
        ph, pw = pe.feat_ratio(as_scalar=False)  # pixels per token: a hybrid's CNN stride times its patch
        own = tuple(pe.grid_size)
        if grid != own or x.shape[2] % ph or x.shape[3] % pw:
            raise TokenReduceError(
                f"input resolution {x.shape[2]}x{x.shape[3]} does not match the {own[0] * ph}x{own[1] * pw} this "
                "model was built for; build it with dynamic_img_size=True to run any size (the schedule follows "
                "the input's grid), or resize the input"
            )
    return grid


def _in_chans(pe: nn.Module) -> int | None:
    """The image channels the patch embedding takes: a hybrid's (HybridEmbed: a CNN backbone, then a
    projection of its feature map, whose ``in_channels`` is the CNN's width), else its projection's (a
    Conv2d, or a stem that declares it); None where nothing says."""
    if isinstance(pe, HybridEmbed):
        return int(pe.in_chans)
    return getattr(pe.proj, "in_channels", None)


def _forward_features(self: nn.Module, x: Tensor, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    patch = getattr(self, _ATTR)
    x, grid = _embed(self, patch, x, attn_mask, is_causal)
    # dense: (B, p + N0, C), one token per original position (common.run_blocks)
    x, _ = run_blocks(_views(self), x, patch, grid)
    return self.norm(x)


def _forward_intermediates(
    self: nn.Module, x: Tensor, indices: int | list[int] | None = None, return_prefix_tokens: bool = False,
    norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False,
    output_dict: bool = False, attn_mask: Tensor | None = None, is_causal: bool = False,
) -> Any:
    """timm's ``VisionTransformer.forward_intermediates`` (same arguments, same return forms: a list,
    (final, list) or a dict) through the reduced forward. The intermediate after block i:

    - ``output_fmt='NCHW'`` (timm's default, a features_only model's): one token per original
      position (``TokenState.unmerge``: a merged token copied to every position it stands for, a
      pruned one as it was when pruned), (B, C, H, W) as without reduction;
    - ``output_fmt='NLC'``: the tokens leaving block i as the reduced forward has them, patch
      tokens (B, N_i - p, C) with N_i = ``get_info(model).tokens_per_block[i]`` (merged tokens
      where their destination was), different per block; with ``apply(..., dense=True)`` one per
      position, (B, N0 - p, C), as for NCHW.

    Prefix tokens (B, p, C) are split off as timm does; ``norm`` applies the final norm to each.
    The final features are ``forward_features``'s (up to the last index with ``stop_early``).
    """
    if output_fmt not in ("NCHW", "NLC"):
        raise TokenReduceError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
    patch = getattr(self, _ATTR)
    reshape = output_fmt == "NCHW"
    B, _, height, width = x.shape
    take, max_index = feature_take_indices(len(self.blocks), indices)
    x, grid = _embed(self, patch, x, attn_mask, is_causal)
    x, taken = run_blocks(_views(self), x, patch, grid, take=frozenset(take), dense_taken=reshape,
                          stop=max_index + 1 if stop_early else None)
    p = self.num_prefix_tokens
    taken = [self.norm(y) if norm else y for y in taken]
    prefix = [y[:, :p] for y in taken] if p else None
    out = [y[:, p:] for y in taken]
    if reshape:
        H, W = grid
        out = [y.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous() for y in out]  # (B, C, H, W)
    final = None if intermediates_only else self.norm(x)  # one per position with patch.dense (run_blocks)
    if output_dict:
        result: dict[str, Any] = {"image_intermediates": out}
        if prefix is not None and return_prefix_tokens:
            result["image_intermediates_prefix"] = prefix
        if final is not None:
            result["image_features"] = final
        return result
    if return_prefix_tokens and prefix is not None:
        out = list(zip(out, prefix, strict=True))
    return out if final is None else (final, out)


def _embed(self: nn.Module, patch: Patch, x: Tensor, attn_mask: Tensor | None,
           is_causal: bool) -> tuple[Tensor, tuple[int, int]]:
    """The checks and timm's embedding: images (B, C, H, W) -> tokens (B, p + N0, C) and the patch
    grid (gh, gw), N0 = gh * gw (any grid with ``dynamic_img_size``: timm resamples the position
    embedding)."""
    guard_forward(patch, x)  # first: under torch.fx attn_mask is a proxy too
    if attn_mask is not None or is_causal:
        raise TokenReduceError("attention masks are not supported with token reduction")
    grid = _grid(self, x)
    x = self.patch_embed(x)
    x = self._pos_embed(x)
    x = self.patch_drop(x)
    return self.norm_pre(x), grid


def _views(self: nn.Module) -> list[BlockView]:
    # timm's set_grad_checkpointing() sets this flag; its forward_features then checkpoints every block
    ckpt = bool(getattr(self, "grad_checkpointing", False)) and torch.is_grad_enabled()
    return [TimmBlock(blk, ckpt) for blk in self.blocks]


class TimmAttention(AttentionView):
    """timm's Attention: the fused qkv projection, q_norm, k_norm, then norm, gate, proj, proj_drop."""

    def __init__(self, attn: nn.Module) -> None:
        self.m = attn
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale
        self.inputs, self.output = (attn.qkv,), attn.proj

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        attn, (B, N, _) = self.m, x.shape
        qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, N, d) each
        return attn.q_norm(q), attn.k_norm(k), v

    def out(self, o: Tensor, x: Tensor) -> Tensor:
        attn, (B, _, N, _) = self.m, o.shape
        out = attn.norm(o.transpose(1, 2).reshape(B, N, attn.attn_dim))
        if getattr(attn, "gate", None) is not None:
            out = out * attn.gate(x).sigmoid()
        return attn.proj_drop(attn.proj(out))

    def dropout_p(self) -> float:
        return self.m.attn_drop.p if self.m.training else 0.0


class TimmBlock(BlockView):
    """timm's Block: norm1, attn, ls1, drop_path1, then norm2, mlp, ls2, drop_path2. ``ckpt``: the
    model's ``grad_checkpointing`` is on and gradients are recorded (timm then checkpoints the block
    with its ``checkpoint``: torch.utils.checkpoint with timm's reentrant setting)."""

    def __init__(self, blk: nn.Module, ckpt: bool = False) -> None:
        self.m, self.attn, self.mlp, self.module = blk, TimmAttention(blk.attn), blk.mlp, blk
        self.ckpt = ckpt

    def checkpointing(self) -> Callable[..., Any] | None:
        return checkpoint if self.ckpt else None

    def norm1(self, x: Tensor) -> Tensor:
        return self.m.norm1(x)

    def attn_branch(self, a: Tensor) -> Tensor:
        return self.m.drop_path1(self.m.ls1(a))

    def mlp_branch(self, x: Tensor) -> Tensor:
        return self.m.drop_path2(self.m.ls2(self.m.mlp(self.m.norm2(x))))


def parts(model: nn.Module) -> HostParts:
    """The model's sub-modules under host-neutral names (bench/macs.py, inspect)."""
    check_host(model)
    pe = model.patch_embed
    # a hybrid's projection is not the stem: the CNN before it is measured with it (bench/macs.py)
    proj = None if isinstance(pe, HybridEmbed) else getattr(pe, "proj", None)
    prefix = (("cls", int(model.cls_token is not None)), ("dist", int(getattr(model, "dist_token", None) is not None)),
              ("registers", int(getattr(model, "num_reg_tokens", 0) or 0)))
    return HostParts(
        stem=pe, stem_proj=proj, in_chans=_in_chans(pe) or 3, img_size=tuple(pe.img_size),
        blocks=tuple(TimmBlock(b) for b in model.blocks),
        heads=tuple(h for h in (model.head, getattr(model, "head_dist", None)) if h is not None),
        prefix=tuple((kind, n) for kind, n in prefix if n), pool=_pool_cost(model.attn_pool),
    )


def feed(model: nn.Module, images: Tensor) -> Feed:
    """Images (B, C, H, W) as ``model``'s forward takes them: the images themselves."""
    return Feed((images,))


def _pool_cost(pool: nn.Module | None) -> PoolCost | None:
    """timm's AttentionPoolLatent ('map'): kv over every token; q, proj and the MLP per latent query."""
    if pool is None:
        return None
    kv = pool.kv.in_features * pool.kv.out_features
    linear = sum(m.in_features * m.out_features for m in pool.modules() if isinstance(m, nn.Linear))
    return PoolCost(per_token=kv, fixed=pool.latent_len * (linear - kv), width=pool.kv.out_features // 2,
                    probes=pool.latent_len)


def _attention(attn: nn.Module, x: Tensor, state: TokenState, needs: frozenset[str],
               reducer: Reducer | None = None) -> tuple[Tensor, AttnInfo]:
    """timm Attention with the contributions ``state`` and ``reducer`` declare for the current block."""
    return attend_view(TimmAttention(attn), x, needs, **contributions(state, reducer))

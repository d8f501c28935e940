"""Patch a timm VisionTransformer in place, reversibly, to run a token reducer.

The patch replaces ``model.forward_features`` (an instance attribute; ``remove`` deletes it) with a
loop that calls timm's own sub-modules by name: patch_embed, _pos_embed, patch_drop, norm_pre,
and per block norm1, attn.qkv, attn.q_norm, attn.k_norm, attn.norm, attn.proj, attn.proj_drop,
ls1, drop_path1, norm2, mlp, ls2, drop_path2, then norm. Attention runs through fused SDPA; the
side products a method asked for (CLS row, keys, head-output norms) are computed beside it. Only
while a learned pruner trains with a soft keep policy (``TokenState.keep_mask``) is attention
computed explicitly, by :func:`tokenreduce.core.ops.policy_softmax`.
A reducer with parameters is attached as ``model.tokenreduce`` (its own state_dict keys); a
training-free one adds no keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import TokenReduceError, UnsupportedModelError
from ..core.method import AttnInfo, Host, Reducer, build_reducer
from ..core.ops import cls_attention, policy_softmax
from ..core.schedule import Schedule
from ..core.state import TokenState

_ATTR = "_tokenreduce_patch"


@dataclass
class Patch:
    """What ``apply`` left on a model: the reducer, its compiled schedule and the last forward."""

    reducer: Reducer
    schedule: Schedule
    host: Host
    trace: bool
    last: TokenState | None = field(default=None, repr=False)


def _timm_classes():
    from timm.layers import Attention
    from timm.models.vision_transformer import Block, VisionTransformer

    return VisionTransformer, Block, Attention


def check_host(model: nn.Module) -> Host:
    """Raise UnsupportedModelError unless ``model`` is a timm ViT this adapter can drive."""
    VisionTransformer, Block, Attention = _timm_classes()
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
    if not isinstance(model.patch_drop, nn.Identity):
        raise UnsupportedModelError("patch dropout changes the token count; build the model with patch_drop_rate=0")
    if getattr(model, "attn_pool", None) is not None:
        raise UnsupportedModelError("attention-pool heads (global_pool='map') are not supported; use 'token' or 'avg'")
    grid = tuple(model.patch_embed.grid_size)
    return Host(
        depth=len(model.blocks), dim=model.embed_dim, num_heads=model.blocks[0].attn.num_heads,
        num_prefix=model.num_prefix_tokens, num_patches=grid[0] * grid[1], grid=grid,
        has_class_token=model.cls_token is not None,
    )


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False) -> nn.Module:
    """Patch ``model`` in place to run ``spec`` (e.g. ``'tome(r=13)'``); returns the model.

    ``trace=True`` records which original patches each token holds after every reduction
    (``get_info(model).snapshots``), for visualisation; it costs a (B, N, N) map per forward.
    """
    host = check_host(model)
    reducer = build_reducer(spec)
    if reducer.needs_class_token and not host.has_class_token:
        raise UnsupportedModelError(
            f"{reducer.name} scores tokens by class-token attention but this model has no class "
            "token; use a model with one, or a method that needs none (random, tome)"
        )
    schedule = reducer.bind(host)
    if hasattr(model, _ATTR):  # only now: a failed apply leaves the previous patch in place
        remove(model)
    ref = next(model.parameters())
    reducer.to(device=ref.device, dtype=ref.dtype)
    reducer.train(model.training)  # later model.train()/eval() calls reach it as a submodule
    if any(True for _ in reducer.parameters()):
        model.tokenreduce = reducer
    setattr(model, _ATTR, Patch(reducer, schedule, host, trace))
    model.forward_features = _forward_features.__get__(model)
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply``: the model is again exactly timm's. Raises if it was not patched."""
    if not hasattr(model, _ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; nothing to remove")
    delattr(model, _ATTR)
    del model.forward_features  # falls back to the class method
    if "tokenreduce" in model._modules:
        del model._modules["tokenreduce"]
    return model


def get_patch(model: nn.Module) -> Patch:
    if not hasattr(model, _ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; call tokenreduce.apply first")
    return getattr(model, _ATTR)


def _check_input(model: nn.Module, x: Tensor, host: Host) -> None:
    if x.dim() != 4:
        raise TokenReduceError(f"expected images (B, C, H, W), got a tensor of shape {tuple(x.shape)}")
    pe = model.patch_embed
    if x.shape[1] != pe.proj.in_channels:
        raise TokenReduceError(f"model expects {pe.proj.in_channels} input channels, got {x.shape[1]}")
    ph, pw = pe.patch_size
    grid = (x.shape[2] // ph, x.shape[3] // pw)
    if grid != host.grid or x.shape[2] % ph or x.shape[3] % pw:
        h, w = host.grid[0] * ph, host.grid[1] * pw
        raise TokenReduceError(
            f"input resolution {x.shape[2]}x{x.shape[3]} does not match the {h}x{w} the schedule "
            f"was compiled for ({host.num_patches} patches); resize the input or apply the method "
            f"to a model created with img_size=({x.shape[2]}, {x.shape[3]})"
        )


def _forward_features(self: nn.Module, x: Tensor, attn_mask: Tensor | None = None,
                      is_causal: bool = False) -> Tensor:
    if attn_mask is not None or is_causal:
        raise TokenReduceError("attention masks are not supported with token reduction")
    patch = getattr(self, _ATTR)
    _check_input(self, x, patch.host)
    x = self.patch_embed(x)
    x = self._pos_embed(x)
    x = self.patch_drop(x)
    x = self.norm_pre(x)
    reducer, schedule = patch.reducer, patch.schedule
    state = TokenState.start(
        x, patch.host.num_prefix, trace=patch.trace, prop_attn=reducer.proportional,
        keep_pruned=reducer.keep_pruned,
    )
    for i, blk in enumerate(self.blocks):
        state.block = i
        x = _run_block(blk, x, state, reducer, schedule.count_at(i))
    patch.last = state
    return self.norm(x)


def _run_block(blk: nn.Module, x: Tensor, state: TokenState, reducer: Reducer,
               count: int | None) -> Tensor:
    """One timm Block with the reducer where the schedule puts it. x (B, N, C)."""
    active = count is not None and count < x.shape[1] - state.num_prefix
    needs = reducer.needs if active else frozenset()
    attn_out, info = _attention(blk.attn, blk.norm1(x), state, needs)
    x = x + blk.drop_path1(blk.ls1(attn_out))
    if active and reducer.where == "attn":
        x = reducer.reduce(x, state, info, count)
    x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    if active and reducer.where == "block":
        x = reducer.reduce(x, state, info, count)
    state.record(state.block, x.shape[1], active)
    return x


def _attention(attn: nn.Module, x: Tensor, state: TokenState, needs: frozenset[str]
               ) -> tuple[Tensor, AttnInfo]:
    """timm Attention through fused SDPA, plus the side products in ``needs``. x (B, N, C)."""
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, H, N, d) each
    q, k = attn.q_norm(q), attn.k_norm(k)
    bias = state.attn_bias()  # (B, 1, 1, N) or None
    if bias is not None:
        bias = bias.to(q.dtype)
    probs = None
    if state.keep_mask is None:
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=attn.attn_drop.p if attn.training else 0.0
        )  # (B, H, N, d)
    else:
        logits = (q * attn.scale) @ k.transpose(-2, -1)  # (B, H, N, N)
        if bias is not None:
            logits = logits + bias
        probs = policy_softmax(logits, state.keep_mask)
        o = attn.attn_drop(probs) @ v  # (B, H, N, d)
    info = AttnInfo()
    if "cls_attn" in needs:
        info.cls_attn = cls_attention(q, k, attn.scale, bias) if probs is None else probs[:, :, 0]
    if "keys" in needs:
        info.keys = k
    if "head_norms" in needs:
        info.head_norms = o.norm(dim=-1)  # (B, H, N)
    out = attn.norm(o.transpose(1, 2).reshape(B, N, attn.attn_dim))
    if getattr(attn, "gate", None) is not None:
        out = out * attn.gate(x).sigmoid()
    return attn.proj_drop(attn.proj(out)), info


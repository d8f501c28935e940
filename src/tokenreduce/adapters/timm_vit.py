"""Patch a timm VisionTransformer in place, reversibly, to run a token reducer.

The patch replaces ``model.forward_features`` (an instance attribute; ``remove`` deletes it) with a
loop that calls timm's own sub-modules by name: patch_embed, _pos_embed, patch_drop, norm_pre,
and per block norm1, attn.qkv, attn.q_norm, attn.k_norm, attn.norm, attn.proj, attn.proj_drop,
ls1, drop_path1, norm2, mlp, ls2, drop_path2, then norm. Attention is
:func:`tokenreduce.core.attention.attend` with the contributions declared for the block: the
log-size bias (``TokenState.attn_bias``), the reducer's own bias (``Reducer.attn_bias``), the keep
policy (``TokenState.keep_mask``), chunked attention (``Reducer.attention_chunk``) and the
probabilities when the method needs them; fused SDPA wherever nothing needs the probabilities.
The other side products a method asked for (CLS row, keys, head-output norms) are computed beside it.
With ``model.set_grad_checkpointing()`` the blocks where the reducer does not act run through
torch.utils.checkpoint (their attention contributions are computed first and passed in, so the
recomputation in the backward pass sees the same ones).
A reducer with parameters or buffers (a deployed Cropr's q) is attached as ``model.tokenreduce``
(its own state_dict keys); a training-free one adds no keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..core.attention import attend
from ..core.errors import TokenReduceError, UnsupportedModelError
from ..core.method import AttnInfo, Host, Reducer, build_reducer
from ..core.ops import cls_attention
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
    dense: bool = False
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


def apply(model: nn.Module, spec: str | Reducer, *, trace: bool = False, dense: bool = False) -> nn.Module:
    """Patch ``model`` in place to run ``spec`` (e.g. ``'tome(r=13)'``); returns the model.

    ``trace=True`` records which original patches each token holds after every reduction
    (``get_info(model).snapshots``), for visualisation; it costs a (B, N, N) map per forward.
    ``dense=True``: ``forward_features`` returns one token per original position, (B, p + N0, C)
    in the original order (pruned tokens restored, merged ones copied to every position they
    hold: ``TokenState.dense``), for dense tasks.
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
    if next(reducer.parameters(), None) is not None or next(reducer.buffers(), None) is not None:
        model.tokenreduce = reducer
    setattr(model, _ATTR, Patch(reducer, schedule, host, trace, dense))
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
    chans = getattr(pe.proj, "in_channels", None)  # a Conv2d, or a stem that declares it
    if chans is not None and x.shape[1] != chans:
        raise TokenReduceError(f"model expects {chans} input channels, got {x.shape[1]}")
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
    if isinstance(x, torch.fx.Proxy):  # symbolic_trace passes proxies for every argument, attn_mask too
        raise TokenReduceError(
            "torch.fx symbolic tracing (symbolic_trace, create_feature_extractor) cannot follow a token-reduced "
            "forward: it checks the input's shape and chooses tokens by their values, Python decisions on "
            "numbers a symbolic trace does not have; use torch.compile or torch.export (tokenreduce export for ONNX)"
        )
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
        keep_pruned=reducer.keep_pruned, dense=patch.dense,
    )
    # timm's set_grad_checkpointing() sets this flag; its own forward_features is not called here
    ckpt = bool(getattr(self, "grad_checkpointing", False)) and torch.is_grad_enabled()
    for i, blk in enumerate(self.blocks):
        state.block = i
        x = _run_block(blk, x, state, reducer, schedule, ckpt)
    patch.last = state
    if patch.dense:
        # (B, p + N0, C), one token per original position: the values of state.dense(x), without
        # restoring the state's fields, so get_info still describes the tokens the last block made
        x = state.unmerge(x)
    return self.norm(x)


def _contributions(state: TokenState, reducer: Reducer | None) -> dict[str, Any]:
    """The attention contributions declared for the current block: the log-size bias plus the
    reducer's bias, the keep policy, the chunk size, as keyword arguments of :func:`attend`."""
    bias = state.attn_bias()  # (B, 1, 1, N) or None
    chunk = None
    if reducer is not None:
        extra = reducer.attn_bias(state, state.block)
        if extra is not None:
            bias = extra if bias is None else bias + extra
        chunk = reducer.attention_chunk(state.block)
    return dict(bias=bias, policy=state.keep_mask, chunk=chunk, num_prefix=state.num_prefix)


def _run_block(blk: nn.Module, x: Tensor, state: TokenState, reducer: Reducer, schedule: Schedule,
               ckpt: bool = False) -> Tensor:
    """One timm Block with the reducer at the points the schedule names (``Schedule.point_counts``:
    after attention + residual, after the MLP, or both for a composite). x (B, N, C)."""
    at_attn, at_block = schedule.point_counts(state.block, x.shape[1] - state.num_prefix)
    active = at_attn is not None or at_block is not None
    contrib = _contributions(state, reducer)
    watch = reducer.observes(state.block)  # side products read without reducing (Reducer.observes)
    if not active and not watch:  # the plain block: a pure function of x and the contributions
        if ckpt:
            x = checkpoint(_plain_block, blk, x, use_reentrant=False, **contrib)
        else:
            x = _plain_block(blk, x, **contrib)
        state.record(state.block, x.shape[1], False)
        return x
    needs = (reducer.needs_at(state.block) if active else frozenset()) | watch
    attn_out, info = _attend(blk.attn, blk.norm1(x), needs, **contrib)
    if watch:
        reducer.observe(state, info)
    x = x + blk.drop_path1(blk.ls1(attn_out))
    if at_attn is not None:
        state.point = "attn"
        x = reducer.reduce(x, state, info, at_attn)
    x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
    if at_block is not None:
        state.point = "block"
        x = reducer.reduce(x, state, info, at_block)
    state.record(state.block, x.shape[1], active)
    return x


def _plain_block(blk: nn.Module, x: Tensor, **contrib: Any) -> Tensor:
    """timm's Block.forward with the attention contributions, nothing asked of it. x (B, N, C)."""
    x = x + blk.drop_path1(blk.ls1(_attend(blk.attn, blk.norm1(x), frozenset(), **contrib)[0]))
    return x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))


def _attention(attn: nn.Module, x: Tensor, state: TokenState, needs: frozenset[str],
               reducer: Reducer | None = None) -> tuple[Tensor, AttnInfo]:
    """timm Attention with the contributions ``state`` and ``reducer`` declare for the current block."""
    return _attend(attn, x, needs, **_contributions(state, reducer))


def _attend(attn: nn.Module, x: Tensor, needs: frozenset[str], *, bias: Tensor | None,
            policy: Tensor | None, chunk: int | None, num_prefix: int) -> tuple[Tensor, AttnInfo]:
    """timm Attention through :func:`attend`, plus the side products in ``needs``. x (B, N, C)."""
    B, N, _ = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, H, N, d) each
    q, k = attn.q_norm(q), attn.k_norm(k)
    if bias is not None:
        bias = bias.to(q.dtype)
    o, probs = attend(
        q, k, v, scale=attn.scale, bias=bias, policy=policy, chunk=chunk, num_prefix=num_prefix,
        dropout_p=attn.attn_drop.p if attn.training else 0.0,
        # the CLS row under a keep policy is the first row of the explicit probabilities
        need_probs="probs" in needs or ("cls_attn" in needs and policy is not None),
    )  # o (B, H, N, d), probs (B, H, N, N) or None
    info = AttnInfo()
    if "cls_attn" in needs:
        # prefix tokens attend to every token, with chunks too: this is the full row
        row_bias = bias if bias is None or bias.shape[-2] == 1 else bias[:, :, :1]  # a key bias is already a row
        info.cls_attn = cls_attention(q, k, attn.scale, row_bias) if probs is None else probs[:, :, 0]
    if "keys" in needs:
        info.keys = k
    if "head_norms" in needs:
        info.head_norms = o.norm(dim=-1)  # (B, H, N)
    if "probs" in needs:
        info.probs = probs
    out = attn.norm(o.transpose(1, 2).reshape(B, N, attn.attn_dim))
    if getattr(attn, "gate", None) is not None:
        out = out * attn.gate(x).sigmoid()
    return attn.proj_drop(attn.proj(out)), info

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

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..core.attention import attend
from ..core.errors import TokenReduceError, UnsupportedModelError
from ..core.method import AttnInfo, Host, Reducer, build_reducer
from ..core.onnx import check_onnx, classic_export_opset
from ..core.ops import cls_attention
from ..core.schedule import Schedule
from ..core.state import TokenState

_ATTR = "_tokenreduce_patch"
#: The instance attributes ``apply`` sets, beside the Patch, and ``remove`` deletes.
_PATCHED_ATTRS = ("forward_features", "forward_intermediates", "__prepare_scriptable__")


@dataclass
class Patch:
    """What ``apply`` left on a model: the reducer, its compiled schedule and the last forward."""

    reducer: Reducer
    schedule: Schedule
    host: Host
    trace: bool
    dense: bool = False
    last: TokenState | None = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # the last forward's record stays behind: a copy or a saved model has run no forward, and
        # the record may hold tensors of a training graph (deepcopy refuses non-leaf tensors)
        return {**self.__dict__, "last": None}


def _timm_classes():
    from timm.layers import Attention
    from timm.models.vision_transformer import Block, VisionTransformer

    return VisionTransformer, Block, Attention


def check_host(model: nn.Module) -> Host:
    """Raise UnsupportedModelError unless ``model`` is a timm ViT this adapter can drive."""
    from timm.models._features import FeatureGetterNet

    VisionTransformer, Block, Attention = _timm_classes()
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
    # partial, not a bound method: a bound method pickles as getattr(model, '_forward_features')
    model.forward_features = partial(_forward_features, model)
    model.forward_intermediates = partial(_forward_intermediates, model)
    model.__prepare_scriptable__ = _RefuseScript(reducer.spec())
    return model


def remove(model: nn.Module) -> nn.Module:
    """Undo ``apply``: the model is again exactly timm's. Raises if it was not patched."""
    if not hasattr(model, _ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; nothing to remove")
    delattr(model, _ATTR)
    for name in _PATCHED_ATTRS:  # the class's own methods again
        model.__dict__.pop(name, None)
    if "tokenreduce" in model._modules:
        del model._modules["tokenreduce"]
    return model


class _RefuseScript:
    """``torch.jit.script`` calls a module's ``__prepare_scriptable__`` first (on every submodule
    too): TorchScript compiles the class's methods, so it would script the unpatched model."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __call__(self) -> nn.Module:
        raise UnsupportedModelError(
            f"torch.jit.script cannot compile a model patched with {self.spec}: TorchScript compiles the class's "
            "own forward, the unreduced model; use torch.compile, torch.jit.trace or an ONNX export (tokenreduce "
            "export), or tokenreduce.remove(model) to script the unpatched one"
        )


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
    patch = getattr(self, _ATTR)
    x, state = _embed(self, patch, x, attn_mask, is_causal, patch.dense)
    x, _ = _run_blocks(self, patch, x, state)
    patch.last = state
    if patch.dense:
        # (B, p + N0, C), one token per original position: the values of state.dense(x), without
        # restoring the state's fields, so get_info still describes the tokens the last block made
        x = state.unmerge(x)
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
    from timm.models._features import feature_take_indices

    if output_fmt not in ("NCHW", "NLC"):
        raise TokenReduceError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
    patch = getattr(self, _ATTR)
    reshape = output_fmt == "NCHW"
    B, _, height, width = x.shape
    take, max_index = feature_take_indices(len(self.blocks), indices)
    x, state = _embed(self, patch, x, attn_mask, is_causal, patch.dense or reshape)
    x, taken = _run_blocks(self, patch, x, state, take=frozenset(take), dense=patch.dense or reshape,
                           stop=max_index + 1 if stop_early else None)
    patch.last = state
    p = self.num_prefix_tokens
    taken = [self.norm(y) if norm else y for y in taken]
    prefix = [y[:, :p] for y in taken] if p else None
    out = [y[:, p:] for y in taken]
    if reshape:
        H, W = self.patch_embed.dynamic_feat_size((height, width))
        out = [y.reshape(B, H, W, -1).permute(0, 3, 1, 2).contiguous() for y in out]  # (B, C, H, W)
    final = None if intermediates_only else self.norm(state.unmerge(x) if patch.dense else x)
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


def _embed(self: nn.Module, patch: Patch, x: Tensor, attn_mask: Tensor | None, is_causal: bool,
           dense: bool) -> tuple[Tensor, TokenState]:
    """The checks and timm's embedding: images (B, C, H, W) -> tokens (B, N0, C) and their new state."""
    if isinstance(x, torch.fx.Proxy):  # symbolic_trace passes proxies for every argument, attn_mask too
        raise TokenReduceError(
            "torch.fx symbolic tracing (symbolic_trace, create_feature_extractor) cannot follow a token-reduced "
            "forward: it checks the input's shape and chooses tokens by their values, Python decisions on "
            "numbers a symbolic trace does not have; use torch.compile or torch.export (tokenreduce export for ONNX)"
        )
    if attn_mask is not None or is_causal:
        raise TokenReduceError("attention masks are not supported with token reduction")
    opset = classic_export_opset()
    if opset is not None:  # torch.onnx.export(dynamo=False) is tracing this forward
        check_onnx(patch.reducer, exporter="classic", opset=opset)
    _check_input(self, x, patch.host)
    x = self.patch_embed(x)
    x = self._pos_embed(x)
    x = self.patch_drop(x)
    x = self.norm_pre(x)
    reducer = patch.reducer
    state = TokenState.start(
        x, patch.host.num_prefix, trace=patch.trace, prop_attn=reducer.proportional,
        keep_pruned=reducer.keep_pruned, dense=dense,
    )
    return x, state


def _run_blocks(self: nn.Module, patch: Patch, x: Tensor, state: TokenState, *, take: frozenset[int] = frozenset(),
                dense: bool = False, stop: int | None = None) -> tuple[Tensor, list[Tensor]]:
    """The blocks (the first ``stop``) with the reducer: x (B, N0, C) -> (B, N, C), and the tokens
    after each block in ``take`` (one per original position with ``dense``)."""
    # timm's set_grad_checkpointing() sets this flag; its own forward_features is not called here
    ckpt = bool(getattr(self, "grad_checkpointing", False)) and torch.is_grad_enabled()
    taken = []
    for i, blk in enumerate(self.blocks[:stop] if stop is not None else self.blocks):
        state.block = i
        x = _run_block(blk, x, state, patch.reducer, patch.schedule, ckpt)
        if i in take:
            taken.append(state.unmerge(x) if dense else x)
    return x, taken


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

"""What every host adapter shares: the patch record, the block loop and its attention.

A host adapter (timm_vit.py, hf_vit.py) knows where its library keeps the parts of a pre-norm
transformer block and describes each block as a :class:`BlockView`: the block's own sub-modules,
called by name, in the one order every pre-norm ViT block has,

    x = x + attn_branch(out(attend(qkv(norm1(x)))))        (attention: core.attention.attend)
    [reducer at the 'attn' point]
    x = x + mlp_branch(x)                                  (norm2, MLP, layer scale, drop path / dropout)
    [reducer at the 'block' point]

This module runs those views: :func:`run_blocks` binds the reducer to the input's patch grid
(:meth:`Patch.at_grid`: any resolution, the schedule compiled for each grid), carries a fresh
``TokenState`` through the blocks of one forward, entering each block through its host module's
``__call__`` (:func:`enter_blocks` installs :func:`block_forward` on it: forward hooks and pre-hooks
fire once per block, as unpatched), computes the attention contributions declared for each block
(log-size bias, the reducer's bias, keep policy, chunk), asks the attention only for the side
products the reducer needs there (fused SDPA wherever nothing needs the probabilities) and calls the
reducer at the points the schedule names; where the host checkpoints a block
(:meth:`BlockView.checkpointing`) the whole block, reducer included, runs inside the host's checkpoint
function, replayed exactly by the recomputation (:func:`checkpointed`). It can also hand back the
tokens after chosen blocks and stop early (timm's ``forward_intermediates``).

:func:`guard_forward` is what every patched forward refuses first (torch.fx symbolic tracing; the
classic ONNX exporter where the method declares it cannot be exported by it). :func:`attach` /
:func:`detach` are the host-neutral halves of ``apply`` / ``remove``: the reducer built, checked against
the host and bound, the record left on the model; :class:`Forward` is what a forward leaves behind:
detached on the patch (the model holds no tensor of an autograd graph between calls), live in a
:class:`Capture` for the caller that trains on it; :class:`RefuseScript` is the
``__prepare_scriptable__`` an adapter installs so that ``torch.jit.script`` refuses a patched model.
What an adapter stores on a model must pickle (module-level functions bound with functools.partial, no
bound methods or closures), so pickle, ``torch.save(model)`` and deepcopy give a patched model again;
the last forward's record (``Patch.last``) and open captures are not copied. :class:`HostParts` names a
host's sub-modules for what counts their cost (bench/macs.py); :class:`Feed` is a batch of images as a
host's forward takes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from ..core.attention import ChunkedProbs, attend, received_attention
from ..core.errors import SpecError, TokenReduceError, UnsupportedModelError
from ..core.method import AttnInfo, Host, Reducer, build_reducer, get_method, list_methods
from ..core.onnx import check_onnx, classic_export_opset
from ..core.ops import cls_attention
from ..core.schedule import Schedule
from ..core.state import TokenState

#: The attribute ``apply`` leaves on a patched model (a :class:`Patch`); its presence means "patched".
ATTR = "_tokenreduce_patch"


@dataclass
class Forward:
    """What one forward did (``get_info``'s per-forward fields; ``TokenState`` for their meaning).

    Attributes:
        tokens_per_block: total tokens (prefix included) leaving each block.
        sizes: (B, N) patches each final token stands for; None where nothing merged (read as ones).
        index: (B, N) original sequence position of each final token.
        snapshots: block -> (B, N_block, N0) membership after that block's reduction (``trace=True``).
        aux_losses: named auxiliary losses a learned reducer emitted.
        keep_mask: (B, N) keep policy of the final tokens (a soft-policy pruner in training), or None.
        aux_outputs: named auxiliary predictions (B, Q, K) a learned reducer emitted.
    """

    tokens_per_block: list[int]
    sizes: Tensor | None
    index: Tensor
    snapshots: dict[int, Tensor]
    aux_losses: dict[str, Tensor]
    keep_mask: Tensor | None
    aux_outputs: dict[str, Tensor]

    @classmethod
    def of(cls, state: TokenState, *, live: bool) -> Forward:
        """The record of ``state`` after the last block: its tensors themselves (``live``: they keep
        their autograd graph, for a loss) or detached (the same values, no graph)."""

        def d(t: Tensor | None) -> Tensor | None:  # a tensor made without grad has no graph to drop
            return t if live or t is None or not t.requires_grad else t.detach()

        return cls(list(state.tokens_per_block), d(state.size), d(state.index),
                   {k: d(v) for k, v in state.snapshots.items()}, {k: d(v) for k, v in state.aux_losses.items()},
                   d(state.keep_mask), {k: d(v) for k, v in state.aux_outputs.items()})


class Capture:
    """The live record of the forwards run inside ``hosts.capture(model)`` (``last``: the latest, or
    None before one, or for a model that is not patched). Only the capture holds it: the patch drops
    the capture when the block ends."""

    def __init__(self) -> None:
        self.last: Forward | None = None


@dataclass
class Patch:
    """What ``apply`` left on a model: the reducer, the host and the schedule compiled for it at the
    grid of the last input (:meth:`at_grid`; the model's own grid before any forward) and the last
    forward, detached (:class:`Forward`); ``captures``: the open ``hosts.capture`` blocks, handed the
    live record."""

    reducer: Reducer
    schedule: Schedule
    host: Host
    trace: bool
    dense: bool = False
    last: Forward | None = field(default=None, repr=False)
    captures: list[Capture] = field(default_factory=list, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        # a copy or a saved model has run no forward, and holds no other caller's capture
        return {**self.__dict__, "last": None, "captures": []}

    def at_grid(self, grid: tuple[int, int]) -> None:
        """Follow the input's patch grid (gh, gw): when it differs from the one the reducer is bound to,
        re-bind the reducer to the host at that grid (``Reducer.bind``: its schedule and per-grid tables,
        a random pruner's draw, a composite's plan; learned weights are kept, they depend on the width
        only) and make it the patch's ``host`` and ``schedule``. A forward at the bound grid does nothing
        here, so a model run at one size binds once and compiles or exports one static graph. A budget
        given as keep ratios or a per-block r is compiled again for the grid's token count; explicit
        counts that do not fit the grid raise SpecError naming it (the reducer stays bound as before)."""
        if grid != self.host.grid:
            self._bind(grid)

    @torch.compiler.disable  # a re-bind is Python book-keeping: never traced into a compiled graph
    def _bind(self, grid: tuple[int, int]) -> None:
        host = dataclasses.replace(self.host, grid=grid, num_patches=grid[0] * grid[1])
        try:
            schedule = self.reducer.bind(host)
        except SpecError as e:
            self.reducer.bind(self.host)  # back to the grid it was bound to, whatever the failed bind left
            raise SpecError(f"{self.reducer.spec()} does not fit this input's {grid[0]}x{grid[1]} patch grid "
                            f"({host.num_patches} patches): {e}") from None
        self.host, self.schedule = host, schedule


class AttentionView:
    """One host attention module, driven by its own projections. Subclasses set ``num_heads``,
    ``head_dim``, ``scale``, ``inputs`` (the modules that compute q, k, v: one fused qkv Linear or
    three) and ``output`` (the output projection), and implement :meth:`qkv` and :meth:`out`."""

    num_heads: int
    head_dim: int
    scale: float
    inputs: tuple[nn.Module, ...]
    output: nn.Module

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, N, C) -> q, k, v (B, H, N, d), after any q/k normalisation the host applies."""
        raise NotImplementedError

    def out(self, o: Tensor, x: Tensor) -> Tensor:
        """The attention output o (B, H, N, d) -> (B, N, C) through the host's output projection
        (x: the attention's input, for a host that gates its output by it)."""
        raise NotImplementedError

    def dropout_p(self) -> float:
        """Dropout on the attention probabilities in this mode (0 in eval)."""
        return 0.0


class BlockView:
    """One pre-norm block of a host (module docstring): ``norm1``, ``attn`` (an AttentionView),
    ``attn_branch`` (what the host applies to the attention output before the residual add),
    ``mlp_branch`` (the whole MLP residual branch), ``mlp`` (the MLP module, for MACs), ``module``
    (the host's block itself, entered through its ``__call__``: :func:`enter_blocks`) and
    :meth:`checkpointing` (the host's own gradient checkpointing of the block, when it is on)."""

    attn: AttentionView
    mlp: nn.Module
    module: nn.Module

    def checkpointing(self) -> Callable[..., Any] | None:
        """The host's checkpoint function for this block in the current forward, called as
        ``fn(function, *tensors)`` like ``torch.utils.checkpoint.checkpoint``; None where the host
        would not checkpoint the block now (checkpointing off, eval mode, no gradients)."""
        return None

    def norm1(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def attn_branch(self, a: Tensor) -> Tensor:
        raise NotImplementedError

    def mlp_branch(self, x: Tensor) -> Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class Feed:
    """A batch of images as a host's forward takes it (each adapter's ``feed``): ``feed(model)`` runs
    ``model(*args, **kwargs)``. Most hosts take the images themselves; SigLIP 2 takes them patchified,
    with their grid and a mask (adapters/hf_vit.py)."""

    args: tuple[Tensor, ...]
    kwargs: dict[str, Tensor] = field(default_factory=dict)

    def __call__(self, model: Callable[..., Any]) -> Any:
        return model(*self.args, **self.kwargs)


@dataclass(frozen=True)
class PoolCost:
    """The MACs of an attention-pooling head (SigLIP's MAP head) over the N tokens the blocks leave: the
    key and value projections of every token, ``probes`` queries attending over them (their own
    projections, output projection and MLP fixed), 2 * width * probes * N for the attention.

    Attributes:
        per_token: MACs per pooled token (its key and value projections).
        fixed: MACs that do not depend on N (the probes' query, output projection, MLP).
        width: the attention width (heads * head_dim).
        probes: the query tokens.
    """

    per_token: int
    fixed: int
    width: int
    probes: int

    def macs(self, tokens: int) -> int:
        """MACs over ``tokens`` pooled tokens."""
        return self.per_token * tokens + self.fixed + 2 * self.width * self.probes * tokens


@dataclass(frozen=True)
class HostParts:
    """A host's sub-modules under host-neutral names: what bench/macs.py counts and inspect shows.

    Attributes:
        stem: images (B, C, H, W) -> patch tokens (B, N, D) or a grid (B, D, h, w).
        stem_proj: the stem's projection; a Conv2d with kernel = stride is counted in closed form,
            any other stem is measured.
        in_chans, img_size: the images the host takes.
        blocks: one view per block.
        heads: the modules after the blocks that count (classifier heads, a pooler, a projection), each
            applied to one token.
        prefix: (kind, count) of the prefix tokens, e.g. (('cls', 1), ('dist', 1)).
        pool: an attention-pooling head over every final token, or None.
    """

    stem: nn.Module
    stem_proj: nn.Module | None
    in_chans: int
    img_size: tuple[int, int]
    blocks: tuple[BlockView, ...]
    heads: tuple[nn.Module, ...]
    prefix: tuple[tuple[str, int], ...]
    pool: PoolCost | None = None


# ----- apply / remove, host-neutral halves ---------------------------------------------------------


def attach(model: nn.Module, spec: str | Reducer, host: Host, *, trace: bool, dense: bool,
           undo: Callable[[nn.Module], Any], model_name: str | None = None) -> Patch:
    """Build ``spec``, check it against ``host``, bind it and leave the :class:`Patch` on ``model``
    (replacing a previous patch, taken off with ``undo``, the calling adapter's ``remove``, only once
    everything succeeded). The adapter then installs its forward. A reducer with parameters or buffers
    becomes ``model.tokenreduce`` (its own keys)."""
    reducer = build_reducer(spec)
    refuse(reducer, host, model_name or type(model).__name__)
    schedule = reducer.bind(host)
    if hasattr(model, ATTR):  # only now: a failed apply leaves the previous patch in place
        undo(model)
    ref = next(model.parameters())
    reducer.to(device=ref.device, dtype=ref.dtype)
    reducer.train(model.training)  # later model.train()/eval() calls reach it as a submodule
    if next(reducer.parameters(), None) is not None or next(reducer.buffers(), None) is not None:
        model.tokenreduce = reducer
    patch = Patch(reducer, schedule, host, trace, dense)
    setattr(model, ATTR, patch)
    return patch


def refuse(reducer: Reducer, host: Host, model_name: str) -> None:
    """UnsupportedModelError if ``reducer`` declares it cannot run on ``host``: it needs a class
    token the host lacks, or it runs on other host families only (``Reducer.hosts``)."""
    if reducer.needs_class_token and not host.has_class_token:
        substitute = reducer.class_token_substitute()
        free = [n for n in list_methods() if not get_method(n).needs_class_token]
        instead = (f"give it {substitute} instead, which needs none" if substitute
                   else f"use a method that needs none ({', '.join(free)})")
        raise UnsupportedModelError(
            f"{reducer.name} scores tokens by class-token attention but {model_name} has no class token; {instead}"
        )
    families = reducer.hosts
    if families is not None and host.family not in families:
        raise UnsupportedModelError(
            f"{reducer.name} runs on {', '.join(sorted(families))} models only, and {model_name} is a "
            f"{host.family} model; choose another method or a {' or '.join(sorted(families))} model"
        )


def detach(model: nn.Module) -> Patch:
    """Remove the :class:`Patch` (and a learned reducer's ``model.tokenreduce``) from ``model``;
    the adapter then uninstalls its forward. Raises if the model is not patched."""
    patch = get_patch(model)
    delattr(model, ATTR)
    if "tokenreduce" in model._modules:
        del model._modules["tokenreduce"]
    return patch


def get_patch(model: nn.Module) -> Patch:
    if not hasattr(model, ATTR):
        raise TokenReduceError("this model is not patched by tokenreduce; call tokenreduce.apply first")
    return getattr(model, ATTR)


class RefuseScript:
    """A patched module's ``__prepare_scriptable__``: ``torch.jit.script`` calls it first (on every
    submodule too), and TorchScript compiles the class's methods, so it would script the unpatched
    model. Picklable (a plain object holding the spec)."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __call__(self) -> nn.Module:
        raise UnsupportedModelError(
            f"torch.jit.script cannot compile a model patched with {self.spec}: TorchScript compiles the class's "
            "own forward, the unreduced model; use torch.compile, torch.jit.trace or an ONNX export (tokenreduce "
            "export), or tokenreduce.remove(model) to script the unpatched one"
        )


def guard_forward(patch: Patch, x: Any) -> None:
    """What every patched forward refuses before it looks at its input: torch.fx symbolic tracing,
    and a classic ONNX export (``torch.onnx.export(dynamo=False)``) the method cannot take."""
    if isinstance(x, torch.fx.Proxy):  # symbolic_trace passes proxies for every argument, masks too
        raise TokenReduceError(
            "torch.fx symbolic tracing (symbolic_trace, create_feature_extractor) cannot follow a token-reduced "
            "forward: it checks the input's shape and chooses tokens by their values, Python decisions on "
            "numbers a symbolic trace does not have; use torch.compile or torch.export (tokenreduce export for ONNX)"
        )
    opset = classic_export_opset()
    if opset is not None:  # torch.onnx.export(dynamo=False) is tracing this forward
        check_onnx(patch.reducer, exporter="classic", opset=opset)


# ----- one forward through the blocks ---------------------------------------------------------------


def run_blocks(blocks: Sequence[BlockView], x: Tensor, patch: Patch, grid: tuple[int, int], *,
               take: Collection[int] = (), dense_taken: bool = False,
               stop: int | None = None) -> tuple[Tensor, list[Tensor]]:
    """x (B, p + N0, C), the embedded tokens of an input on the patch ``grid`` (gh, gw), N0 = gh * gw,
    through the blocks (the first ``stop``) with ``patch``'s reducer bound to that grid
    (:meth:`Patch.at_grid`); records the forward as ``patch.last`` (detached) and in each open capture
    (live). Each block is entered through its host module's ``__call__`` (forward hooks and pre-hooks
    fire once per block, outside any checkpoint), which runs :meth:`Blocks.step` (:func:`enter_blocks`).
    Returns the last block's tokens, one per original position (B, p + N0, C) with ``patch.dense``
    (``TokenState.unmerge``), else the reduced ones, and the tokens leaving each block in ``take``,
    in block order: one per original position with ``patch.dense`` or ``dense_taken``, else as reduced."""
    patch.at_grid(grid)
    host, schedule = patch.host, patch.schedule
    hold_static(x.shape[1], host.num_prefix, host.num_patches, *host.grid, *schedule.counts, *schedule.locs,
                *(schedule.mid or ()))
    if x.shape[1] != patch.host.num_prefix + patch.host.num_patches:
        raise TokenReduceError(f"the embeddings gave {x.shape[1]} tokens for a {grid[0]}x{grid[1]} patch grid and "
                               f"{patch.host.num_prefix} prefix tokens; tokenreduce expects one token per patch")
    reducer = patch.reducer
    dense = patch.dense or dense_taken
    state = TokenState.start(
        x, patch.host.num_prefix, trace=patch.trace, prop_attn=reducer.proportional,
        keep_pruned=reducer.keep_pruned, dense=dense,
    )
    run = Blocks(blocks, state, reducer, patch.schedule)
    taken = []
    for i, blk in enumerate(blocks[:stop] if stop is not None else blocks):
        run.state.block = i
        x = blk.module(x, tokenreduce=run)  # the host block's __call__: its hooks, then Blocks.step
        if i in take:
            taken.append(run.state.unmerge(x) if dense else x)
    state = run.state
    patch.last = Forward.of(state, live=False)
    for c in patch.captures:
        c.last = Forward.of(state, live=True)
    if patch.dense:
        # the values of state.dense(x), without restoring the state's fields, so get_info still
        # describes the tokens the last block made
        x = state.unmerge(x)
    return x, taken


def hold_static(*numbers: int) -> None:
    """Under torch.compile, make each of ``numbers`` a constant of the graph (guarded by its value; a new
    value recompiles): the input's size and the grid, token counts and schedule bound to it. dynamo's
    automatic dynamic shapes otherwise turn numbers that changed since the last compile (a second
    resolution) into symbols, and a reducer's per-block arithmetic on them (ToMe's matching sizes) nests
    them block after block until tracing takes longer than any user waits. A no-op in eager mode."""
    if not torch.compiler.is_compiling():
        return
    from torch._dynamo.comptime import comptime  # dynamo is loaded while it compiles (importing it costs seconds)

    for n in numbers:
        comptime.force_static(n)


@dataclass
class Blocks:
    """One forward through the blocks, handed to each host block as its ``tokenreduce`` keyword
    argument (:func:`block_forward`): the blocks' views, the forward's TokenState (``state.block``: the
    block being run), the reducer and its schedule at this input's grid."""

    views: Sequence[BlockView]
    state: TokenState
    reducer: Reducer
    schedule: Schedule

    def step(self, x: Tensor) -> Tensor:
        """Block ``state.block`` on x (B, N, C) -> (B, N', C), N' = N where the reducer does not act:
        :func:`run_block`, inside the host's checkpointing where it is on (:func:`checkpointed`)."""
        view = self.views[self.state.block]
        fn = view.checkpointing()
        if fn is None:
            return run_block(view, x, self.state, self.reducer, self.schedule)
        x, self.state = checkpointed(fn, view, x, self.state, self.reducer, self.schedule)
        return x


def block_forward(module: nn.Module, x: Tensor, *args: Any, tokenreduce: Blocks | None = None, **kwargs: Any) -> Any:
    """The forward :func:`enter_blocks` installs on a host block (an instance attribute, bound with
    functools.partial): inside a patched forward (``tokenreduce`` given) the block of the token-reduced
    loop, :meth:`Blocks.step`; called on its own (no ``tokenreduce``), the host class's own forward,
    unchanged. Hooks on the block see x (B, N, C) entering it and the tokens leaving it (after the
    block's reduction)."""
    if tokenreduce is None:
        return type(module).forward(module, x, *args, **kwargs)
    return tokenreduce.step(x)


def enter_blocks(modules: Sequence[nn.Module]) -> None:
    """Install :func:`block_forward` on each host block (``apply``), so that the patched forward calls
    the blocks as modules, through ``__call__``."""
    for module in modules:
        module.forward = partial(block_forward, module)


def leave_blocks(modules: Sequence[nn.Module]) -> None:
    """Undo :func:`enter_blocks` (``remove``): each block's class forward again."""
    for module in modules:
        module.__dict__.pop("forward", None)


# ----- a block inside the host's gradient checkpointing ---------------------------------------------


class _Leaf:
    """Where a tensor stood in a structure :func:`_split` took apart: its place in the leaves."""

    def __init__(self, at: int) -> None:
        self.at = at


def _rebuild(obj: Any, swap: Callable[[Any], Any]) -> Any:
    """A fresh copy of ``obj`` (dataclasses, lists, tuples, dicts: new containers, so writes to the copy
    never reach the original) with every other value passed through ``swap``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _rebuild(getattr(obj, f.name), swap)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(v, swap) for v in obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, swap) for k, v in obj.items()}
    return swap(obj)


def _split(obj: Any, leaves: list[Tensor]) -> Any:
    """``obj`` (a TokenState) with every tensor appended to ``leaves`` and replaced by its :class:`_Leaf`."""

    def take(v: Any) -> Any:
        if not isinstance(v, Tensor):
            return v
        leaves.append(v)
        return _Leaf(len(leaves) - 1)

    return _rebuild(obj, take)


def _join(template: Any, leaves: Sequence[Tensor]) -> Any:
    """A fresh copy of what :func:`_split` took apart, its tensors taken from ``leaves``."""
    return _rebuild(template, lambda v: leaves[v.at] if isinstance(v, _Leaf) else v)


class _ReducerState:
    """The reducer's own state at one moment: every module's attributes (shallow) and its buffers'
    values, to replay a recomputation from the state the first run saw (a step counter advanced, a
    rate chosen) and to leave the state the first run left."""

    def __init__(self, reducer: nn.Module) -> None:
        self.attrs = [(m, dict(vars(m))) for m in reducer.modules()]
        self.buffers = {name: b.clone() for name, b in reducer.named_buffers()}
        self.reducer = reducer

    def restore(self) -> None:
        for m, attrs in self.attrs:
            vars(m).update(attrs)
        with torch.no_grad():
            for name, value in self.buffers.items():
                self.reducer.get_buffer(name).copy_(value)


def checkpointed(fn: Callable[..., Any], blk: BlockView, x: Tensor, state: TokenState, reducer: Reducer,
                 schedule: Schedule) -> tuple[Tensor, TokenState]:
    """:func:`run_block` inside the host's checkpoint function ``fn`` (``fn(function, *tensors)``), the
    reducer's work included; returns the block's tokens (B, N', C) and the TokenState after it.

    The checkpointed function is a pure function of its tensor arguments, x and every tensor of
    ``state`` at the block's entry, so that the backward pass's recomputation reproduces the first
    run exactly and reentrant (``use_reentrant=True``) and non-reentrant checkpointing both carry
    gradients through the state (a keep policy, an auxiliary loss, tokens kept aside):

    - it runs on a fresh copy of the entry state and returns x and every tensor of the state after
      the block; the state after the block is rebuilt from the returned tensors, so that what a
      recomputation writes goes to a copy nobody reads (TokenState writes are idempotent);
    - a recomputation starts from the reducer's own state at the block's entry (module attributes
      and buffers: a step counter, a rate) and puts back the state the first run left;
    - random draws inside the block (dropout, a Gumbel keep policy) are replayed by the checkpoint
      function's RNG handling (``preserve_rng_state=True``, torch's and both hosts' default).
    """
    leaves: list[Tensor] = []
    entry = _split(state, leaves)
    at_entry = _ReducerState(reducer)
    after: list[Any] = []  # the first run's state after the block, taken apart (its structure)

    def block(x: Tensor, *entry_leaves: Tensor) -> tuple[Tensor, ...]:
        again = bool(after)
        now = _ReducerState(reducer) if again else None
        if again:
            at_entry.restore()
        try:
            s = _join(entry, entry_leaves)
            y = run_block(blk, x, s, reducer, schedule)
        finally:
            if now is not None:
                now.restore()
        out: list[Tensor] = []
        shape = _split(s, out)
        if not again:
            after.append(shape)
        return (y, *out)

    y, *out = fn(block, x, *leaves)
    return y, _join(after[0], out)


def contributions(state: TokenState, reducer: Reducer | None) -> dict[str, Any]:
    """The attention contributions declared for the current block: the log-size bias plus the
    reducer's bias, the keep policy, the chunk size, as keyword arguments of :func:`attend_view`."""
    bias = state.attn_bias()  # (B, 1, 1, N) or None
    chunk = None
    if reducer is not None:
        extra = reducer.attn_bias(state, state.block)
        if extra is not None:
            bias = extra if bias is None else bias + extra
        chunk = reducer.attention_chunk(state.block)
    return dict(bias=bias, policy=state.keep_mask, chunk=chunk, num_prefix=state.num_prefix)


def run_block(blk: BlockView, x: Tensor, state: TokenState, reducer: Reducer, schedule: Schedule) -> Tensor:
    """One block with the reducer at the points the schedule names (``Schedule.point_counts``:
    after attention + residual, after the MLP, or both for a composite). x (B, N, C)."""
    at_attn, at_block = schedule.point_counts(state.block, x.shape[1] - state.num_prefix)
    active = at_attn is not None or at_block is not None
    contrib = contributions(state, reducer)
    watch = reducer.observes(state.block)  # side products read without reducing (Reducer.observes)
    if not active and not watch:  # the plain block: a pure function of x and the contributions
        x = plain_block(blk, x, **contrib)
        state.record(state.block, x.shape[1], False)
        return x
    needs = (reducer.needs_at(state.block) if active else frozenset()) | watch
    attn_out, info = attend_view(blk.attn, blk.norm1(x), needs, **contrib)
    if watch:
        reducer.observe(state, info)
    branch = blk.attn_branch(attn_out)
    if "shift" in needs and at_attn is not None:  # the representation shift ||F(x) - x|| of the branch just run
        info.shift = branch.norm(dim=-1)  # (B, N)
    x = x + branch
    if at_attn is not None:
        state.point = "attn"
        x = reducer.reduce(x, state, info, at_attn)
    branch = blk.mlp_branch(x)
    if "shift" in needs and at_block is not None:
        info.shift = branch.norm(dim=-1)
    x = x + branch
    if at_block is not None:
        state.point = "block"
        x = reducer.reduce(x, state, info, at_block)
    state.record(state.block, x.shape[1], active)
    return x


def plain_block(blk: BlockView, x: Tensor, **contrib: Any) -> Tensor:
    """The host block's own computation with the attention contributions, nothing asked of it."""
    x = x + blk.attn_branch(attend_view(blk.attn, blk.norm1(x), frozenset(), **contrib)[0])
    return x + blk.mlp_branch(x)


def attend_view(attn: AttentionView, x: Tensor, needs: frozenset[str], *, bias: Tensor | None,
                policy: Tensor | None, chunk: int | None, num_prefix: int) -> tuple[Tensor, AttnInfo]:
    """A host attention through :func:`attend`, plus the side products in ``needs``. x (B, N, C)."""
    q, k, v = attn.qkv(x)  # (B, H, N, d) each
    if bias is not None:
        bias = bias.to(q.dtype)
    o, probs = attend(
        q, k, v, scale=attn.scale, bias=bias, policy=policy, chunk=chunk, num_prefix=num_prefix,
        dropout_p=attn.dropout_p(),
        # the CLS row under a keep policy is the first row of the explicit probabilities
        need_probs="probs" in needs or ("cls_attn" in needs and policy is not None),
    )  # o (B, H, N, d), probs (B, H, N, N), ChunkedProbs (with chunks) or None
    info = AttnInfo()
    if "cls_attn" in needs:
        # prefix tokens attend to every token, with chunks too: this is the full row
        row_bias = bias if bias is None or bias.shape[-2] == 1 else bias[:, :, :1]  # a key bias is already a row
        rows = probs.prefix if isinstance(probs, ChunkedProbs) else probs  # (B, H, p|N, N)
        info.cls_attn = cls_attention(q, k, attn.scale, row_bias) if rows is None else rows[:, :, 0]
    if "keys" in needs:
        info.keys = k
    if "head_norms" in needs:
        info.head_norms = o.norm(dim=-1)  # (B, H, N)
    if "probs" in needs:
        info.probs = probs
    if "received" in needs:  # over every key, as full attention; the attention itself stays fused
        info.received = received_attention(q, k, attn.scale, bias)
    return attn.out(o, x), info


def heads_view(o: Tensor) -> Tensor:
    """(B, H, N, d) -> (B, N, H * d): the heads side by side, as every host's output projection takes them."""
    B, H, N, d = o.shape
    return o.transpose(1, 2).reshape(B, N, H * d)


def split_heads(t: Tensor, head_dim: int) -> Tensor:
    """(B, N, H * d) -> (B, H, N, d)."""
    B, N, _ = t.shape
    return t.view(B, N, -1, head_dim).transpose(1, 2)


"""The method contract and the method registry (spec strings: core/registry.py).

A method is a small ``nn.Module`` (a *reducer*) built from a frozen dataclass config. It declares
what it needs from attention (``needs``) and where it runs (``where``), compiles its schedule for
a host (``bind``) and implements ``reduce(x, state, info, count) -> x``.

It also declares what the rest of the package needs to know about it, so that no method name is
spelled outside ``methods/``: whether it is ``learned`` (trained parameters: fine-tune it first),
whether it ``conserves_patches`` (token sizes always sum to the patch count: merging), what its
scoring costs (``scoring_macs``, read by bench/macs.py) and its candidate specs for a target
speed-up (``budget_family``, read by bench/budgets.py). The contract in full, grouped, with what
a method must implement and what it may declare: :class:`Reducer`'s docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from .errors import SpecError
from .registry import Registry, config_spec, format_spec, split_stages
from .registry import parse_spec as parse_spec  # re-exported: the method API's spec parser
from .schedule import Schedule
from .state import TokenState


@dataclass
class AttnInfo:
    """What the adapter computed in the attention of the current block (only what was asked)."""

    cls_attn: Tensor | None = None
    keys: Tensor | None = None
    head_norms: Tensor | None = None
    #: (B, H, N, N); under chunked attention a ``core.attention.ChunkedProbs`` (per chunk, as computed)
    probs: Any = None
    #: (B, N) representation shift ||F(x) - x||_2 of the branch just run (attention at 'attn', MLP at 'block')
    shift: Tensor | None = None
    #: (B, H, N) mean attention each token receives (``core.attention.received_attention``)
    received: Tensor | None = None


@dataclass(frozen=True)
class Host:
    """What a method may know about the model it is applied to. ``restore_at``: set by a composite
    (core/compose.py) for the stages before one that ``restores`` pruned tokens, the block after which
    they come back (a pruner's default placement ends before it); None otherwise."""

    depth: int
    dim: int
    num_heads: int
    num_prefix: int
    num_patches: int
    grid: tuple[int, int]
    has_class_token: bool
    restore_at: int | None = None
    #: the model library the adapter drives ('timm', 'transformers'), read by ``Reducer.hosts``
    family: str = "timm"


#: The side products a method may ask of the attention (the keys of this table), with the MACs each
#: costs as (per token, per query-key pair) entering the attention, in units
#: of the attention width A = heads * head_dim (A = D in timm's VisionTransformer). MACs follow
#: torch.utils.flop_counter's convention, so that the count can be checked against it: products
#: of two matrices (Linear, convolution, matmul, attention) count; elementwise work, sums, norms,
#: softmax and gathers do not.
#:   cls_attn    1, 0  the CLS row q_cls K^T, a (1 x d) @ (d x N) product per head; free when 'probs'
#:                     are needed too (it is then read off the probabilities)
#:   keys        0, 0  the keys the attention computes anyway
#:   head_norms  0, 0  ||A_h V_h||_2 of the output the attention computes anyway: a norm, not a product
#:   probs       0, 0  the explicit Q K^T, softmax and A V are the 2 N^2 A MACs of the attention itself
#:                     (counted there, as for fused SDPA); the softmax is not a MAC. Their price is the
#:                     lost fused kernel: time and memory, which bench/speed.py measures, not MACs. Under
#:                     chunked attention they come per chunk (core.attention.ChunkedProbs), never (B, H, N, N).
#:   shift       0, 0  ||F(x) - x||_2 of the branch the block computes anyway: a norm (core/scores.py)
#:   received    0, 1  the column means of softmax(Q K^T), Q K^T again in query chunks, N^2 A
#:                     (core.attention.received_attention); the attention itself keeps its fused kernel
NEED_MACS: dict[str, tuple[int, int]] = {"cls_attn": (1, 0), "keys": (0, 0), "head_norms": (0, 0), "probs": (0, 0),
                                         "shift": (0, 0), "received": (0, 1)}
#: Side products a method may ask of the attention (``Reducer.needs``; ``AttnInfo`` carries them): the
#: CLS attention row (B, H, N), the keys (B, H, N, d), the per-head output norms ||A_h V_h||_2 (B, H, N),
#: the full attention probabilities (B, H, N, N) (they take the block off the fused SDPA kernel), the
#: representation shift of the branch before the reduction (B, N), the mean attention received (B, H, N).
NEEDS = frozenset(NEED_MACS)

#: The default budget family (``Reducer.budget_family`` of a config with ``keep`` and ``locs``):
#: kept fractions 0.95, 0.90, ..., 0.20, mildest first, at blocks (3, 6, 9) of 12 moved to the
#: host's depth (the published 12-block placement of attention-score pruning).
BUDGET_KEEPS = tuple(round(0.95 - 0.05 * i, 2) for i in range(16))
BUDGET_LOCS = (3, 6, 9)


def needs_macs(needs: frozenset[str], dim: int, tokens: int) -> int:
    """MACs per image of the attention side products ``needs`` for ``tokens`` tokens of width ``dim``
    (``NEED_MACS``; the CLS row is free when the probabilities are computed)."""
    needs = set(needs)
    if "probs" in needs:
        needs.discard("cls_attn")  # read off the probabilities
    return sum(token * tokens + pair * tokens * tokens for token, pair in map(NEED_MACS.get, needs)) * dim


def scaled_locs(locs: Sequence[int], depth: int) -> tuple[int, ...]:
    """Blocks ``locs`` of a 12-block model moved to a ``depth``-block one: floor(l * depth / 12),
    clipped to the last block, duplicates merged (sorted)."""
    return tuple(sorted({min(depth - 1, (loc * depth) // 12) for loc in locs}))


class Reducer(nn.Module):
    """Base class of every method: the contract between a method and the rest of the package.

    How members are declared (one way for each kind): a *declaration* is an attribute, a class
    attribute for what the method always is, set on the instance in ``__init__`` where the config
    decides (EViT's ``conserves_patches`` follows ``fuse``; a composite derives every one from its
    stages); what depends on the block or the host is a method; what is known before an instance
    exists (its spec family) is a classmethod.

    MUST implement (and set):
        ``Config``              frozen dataclass of the spec's parameters (``name(...)`` in specs).
        ``bind(host)``          compile the :class:`Schedule` for a :class:`Host` (and build any
                                learned parts; a re-bind to a like host keeps them); SpecError on
                                parameters the host cannot take.
        ``reduce(x, state, info, count)``  x (B, N, C) -> (B, p + count, C) through ``state``'s update
                                path (``TokenState.gather/merge/gather_and_fuse``).
        ``zero``, ``example``   spec parameters that reduce nothing (the contract tests check the
                                patched model then equals the unpatched one) / that reduce tokens on
                                a 4-block model (the contract tests run them on tiny hosts).
        ``name`` is set by :func:`register_method`.

    MAY declare, with the defaults below:

    - Attention needs: ``needs`` (side products in ``NEEDS``, at every active block; ``needs_at(block)``
      narrows it per block), ``needs_class_token`` (and ``class_token_substitute()``, the option that
      needs none), ``where`` ('attn' after attention + residual,
      or 'block' after the MLP; a config field ``where`` is the user's choice), ``proportional``
      (log-mass attention bias: the size, or a mass the reducer passes to ``TokenState.merge``),
      ``attn_bias(state, block)``, ``attention_chunk(block)``,
      ``observes(block)`` / ``observe(state, info)`` (side products read without reducing).
    - Token bookkeeping: ``keep_pruned`` (pruned tokens kept aside), ``conserves_patches`` (sizes always
      sum to the patch count), ``restores`` / ``stage_only`` (Last Layer Fusion inside a composite),
      ``compose_step(...)`` (its count as a later stage of ``'A + B'``).
    - Costs: ``scoring_macs(block, tokens_in, count, host)`` (default: the side products, ``NEED_MACS``).
    - Budget search family: ``budget_family(host)`` (candidate specs for a target speed-up),
      ``replay_spec(schedule, seed)`` (a scoring-free spec with the same counts, or None),
      ``schedule_origin()`` (the model a published schedule was searched for, which tables name).
    - Training: ``learned`` (trained parameters: fine-tune first), ``dynamic_schedule`` (counts follow
      the input: no static shapes), ``for_inference()`` (the deployed form without training-only parts).
    - Export and hosts: ``exportable``, ``min_onnx_opset``, ``classic_onnx`` (core/onnx.py reads them),
      ``hosts`` (the host families it runs on, None for every one).
    - Dense tasks: the auxiliary predictions a reducer emits (``TokenState.aux_outputs``) are scored by
      the task; ``restores``/``keep_pruned`` bring pruned tokens back (``apply(..., dense=True)``).
    """

    # ----- identity and registry
    name: ClassVar[str] = ""
    Config: ClassVar[type]
    zero: ClassVar[dict[str, Any]] = {}
    example: ClassVar[dict[str, Any]] = {}
    # ----- attention needs
    needs: ClassVar[frozenset[str]] = frozenset()
    needs_class_token: ClassVar[bool] = False
    #: where the reducer runs: 'attn' (after attention + residual, before the MLP) or 'block' (after
    #: the MLP); a config with a ``where`` field sets it per instance (a user choice). The one place the
    #: adapter, bind and bench read it.
    where: ClassVar[str] = "attn"
    #: add log(size) to the attention logits (methods that merge tokens)
    proportional: ClassVar[bool] = False
    # ----- token bookkeeping
    #: keep pruned tokens aside in the TokenState (for methods that bring them back, e.g. LLF)
    keep_pruned: ClassVar[bool] = False
    #: token sizes always sum to the patch count: nothing is dropped, tokens are only merged or fused
    #: into others (merging; pruning that fuses what it drops). Pruners: False.
    conserves_patches: ClassVar[bool] = False
    #: brings back, at the blocks of its schedule, every token the earlier stages of a composite pruned
    #: (Last Layer Fusion): a composite refuses it where no stage acts before it, and binds the stages
    #: before it with ``Host.restore_at`` (their default placement ends before it)
    restores: ClassVar[bool] = False
    #: acts only on what earlier stages of a composite did (Last Layer Fusion brings back what they
    #: pruned): alone it is the identity, so the contract tests check it alone for that and as a stage
    #: in compositions (tests/test_compose.py)
    stage_only: ClassVar[bool] = False
    # ----- training
    #: has trained parameters: an untrained instance is useless, so fine-tune it first (budgets and
    #: the training-free benchmarks leave it out)
    learned: ClassVar[bool] = False
    #: token counts that follow the input rather than the compiled schedule: no static shapes, so
    #: no torch.compile(fullgraph=True) and no export (the compile tests leave such a method out)
    dynamic_schedule: ClassVar[bool] = False
    # ----- export and hosts
    #: can be exported to ONNX (bench/export.py refuses a method that declares False, naming it)
    exportable: ClassVar[bool] = True
    #: the host families (``Host.family``: 'timm', 'transformers') the method runs on, or None for
    #: every host; ``apply`` refuses any other host, saying so (UnsupportedModelError). A method
    #: that reaches past the host-neutral interface (AttnInfo, TokenState) into one library's
    #: modules declares that library here.
    hosts: ClassVar[frozenset[str] | None] = None
    #: the lowest ONNX opset whose operators compute the forward exactly (0: any). Summing several
    #: tokens into one (``scatter_add_``, a merge) is a ScatterElements with a reduction, opset 16:
    #: below it torch's classic exporter writes one without, and only one of the merged tokens
    #: survives. core/onnx.py refuses an export below it
    min_onnx_opset: ClassVar[int] = 0
    #: torch's classic (TorchScript-tracing) ONNX exporter, ``torch.onnx.export(dynamo=False)``, can
    #: export the forward; False where the forward uses what that exporter cannot trace or translate
    #: (a stable sort, ``torch.sort(stable=True)``; Python arithmetic on a traced size): core/onnx.py
    #: then refuses and names the dynamo exporter
    classic_onnx: ClassVar[bool] = True

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.cfg = cfg
        if hasattr(cfg, "where"):  # the user's choice of point
            self.where = cfg.where

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """MACs per image the reduction at ``block`` adds to the block (its scoring).

        Args:
            block: the block where the schedule is active (``Schedule.active``); called only there.
            tokens_in: N, tokens entering the block (prefix included).
            count: non-prefix tokens after the reduction.
            host: the model.
        The base class prices the attention side products in ``needs`` (``NEED_MACS`` x A x N,
        A = host.dim); a method adds what its own ``reduce`` computes (a matching, a predictor).
        Same convention as ``NEED_MACS``: the contract tests hold the sum to torch.utils.flop_counter.
        """
        return needs_macs(self.needs, host.dim, tokens_in)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """Candidate specs for a target speed-up on ``host``, mildest first ([] = no budgets).

        May hold specs the host rejects (bench/budgets.py drops them). Default, from the config's
        fields: ``keep`` + ``locs`` -> keep in ``BUDGET_KEEPS`` at ``BUDGET_LOCS`` scaled to the depth;
        else ``r`` -> r = 1, 2, ... (one per block); else none.
        """
        fields = {f.name for f in dataclasses.fields(cls.Config)}
        if {"keep", "locs"} <= fields:
            locs = scaled_locs(BUDGET_LOCS, host.depth)
            return [format_spec(cls.name, {"keep": k, "locs": locs}) for k in BUDGET_KEEPS]
        if "r" in fields:
            return [format_spec(cls.name, {"r": r}) for r in range(1, host.num_patches)]
        return []

    @classmethod
    def replay_spec(cls, schedule: Schedule, seed: int = 0) -> str | None:
        """A spec of this method that runs exactly ``schedule`` (the same per-block counts and
        ``where``) with no scoring - the speed limit of that schedule - or None if it cannot."""
        return None

    def schedule_origin(self) -> str | None:
        """The model this instance's schedule was searched for, in words, when it is a published
        schedule found for one model (a table names it beside a pick, so a schedule searched for another
        model is not read as one fitted to this one); None when the method's own rule fits the schedule
        to the host."""
        return None

    def attention_chunk(self, block: int) -> int | None:
        """Chunked attention at ``block``: patch tokens per chunk (core.attention.attend), or None
        for full attention. Asked at every block, whether or not the reducer acts there."""
        return None

    def attn_bias(self, state: TokenState, block: int) -> Tensor | None:
        """An additive attention-logit bias at ``block``, broadcastable to (B, H, N, N) (4-D), added to
        the log-size bias; or None. Asked at every block, before its attention."""
        return None

    def observes(self, block: int) -> frozenset[str]:
        """Side products (``NEEDS``) to read at ``block`` whether or not the reducer acts there;
        the adapter computes them beside that block's attention and hands them to :meth:`observe`.
        Default none (a probe that reduces nothing uses it, e.g. EET's teacher importance)."""
        return frozenset()

    def observe(self, state: TokenState, info: AttnInfo) -> None:
        """Receive the side products :meth:`observes` asked for at block ``state.block``."""

    def class_token_substitute(self) -> str | None:
        """Where this reducer ``needs_class_token``: the option of the same method that needs none (e.g.
        "score='shift'"), named when a host without a class token refuses it; None where there is none."""
        return None

    def for_inference(self) -> Reducer:
        """The reducer to deploy: the same inference-time computation without what only training
        needs (auxiliary heads, an aggregator), its spec saying so, so that a checkpoint saved from
        it holds no training-only tensors and reloads to the same form (``models.deploy``). Call on
        a bound reducer. Default: ``self`` (nothing is training-only)."""
        return self

    def needs_at(self, block: int) -> frozenset[str]:
        """What the reducer needs from the attention of ``block`` (asked where its schedule is active).
        Default ``needs``; a composite (core/compose.py) asks only for the stages acting there."""
        return self.needs

    def compose_step(self, block: int, entering: int, aside: int, alone: Schedule) -> tuple[int, int]:
        """This reducer as a stage of a composite (``'A + B'``, core/compose.py) at ``block``, one of
        its own locs: (non-prefix tokens it leaves, tokens kept aside after it) when ``entering``
        non-prefix tokens reach it and ``aside`` pruned tokens are kept aside (since the start, by
        every stage). ``alone`` is its schedule bound alone on the host.

        Default: it keeps the fraction of the tokens reaching it that it keeps alone at ``block``,
        rounded up, ``ceil(entering * after / before)`` (exactly its own count where the tokens
        reaching it are those it would see alone); the removed tokens are pruned (kept aside)
        unless it ``conserves_patches``. A stage that brings tokens back (Last Layer Fusion) returns
        ``(entering + aside, 0)``; one that merges and prunes (ImagePiece) counts only the pruned.
        """
        before = alone.counts[block - 1] if block else alone.num_patches
        count = -(-entering * alone.counts[block] // before)  # integer ceil: exact, no float rounding
        return count, aside + (0 if self.conserves_patches else entering - count)

    def bind(self, host: Host) -> Schedule:
        """Compile the schedule for ``host`` (and build any learned parts). Raises SpecError."""
        raise NotImplementedError

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        """Reduce x (B, N, C) to ``count`` non-prefix tokens, keeping ``state`` aligned."""
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical spec string of this reducer."""
        return config_spec(self.name, self.cfg)

    def extra_repr(self) -> str:
        return self.spec()


_METHODS: Registry[type[Reducer]] = Registry("method")
#: What runs the stages of ``'A + B'`` as one reducer (core/compose.py's Compose, which builds on
#: this module and so registers itself here instead of being imported by it).
_COMPOSITE: Callable[[list[Reducer]], Reducer] | None = None


def register_composite(cls: type[Reducer]) -> type[Reducer]:
    """Class decorator: ``cls(stages)`` builds the composite of a spec with a top-level ``+``."""
    global _COMPOSITE
    _COMPOSITE = cls
    return cls


def register_method(name: str) -> Callable[[type[Reducer]], type[Reducer]]:
    """Class decorator: make a Reducer subclass addressable as ``name(...)`` in specs."""

    return _METHODS.register_class(name)


def list_methods() -> list[str]:
    """Names of all registered methods."""
    return _METHODS.names()


def matched_spec(schedule: Schedule, seed: int = 0) -> str:
    """The spec of the first registered method (by name) that replays ``schedule`` with no scoring
    (``Reducer.replay_spec``): the matched baseline of any method's schedule."""
    for name in list_methods():
        spec = get_method(name).replay_spec(schedule, seed)
        if spec is not None:
            return spec
    raise SpecError(f"no registered method replays this schedule (tokens after each block {list(schedule.counts)}, "
                    f"acting at {schedule.where!r}): the random pruner replays one whose token count only falls, "
                    "acting at one point of a block ('attn' or 'block'); a schedule that brings tokens back (LLF) "
                    "or acts at both points (a composite) has no matched random baseline")


def get_method(name: str) -> type[Reducer]:
    """The Reducer class registered under ``name``."""
    return _METHODS.get(name)


def build_reducer(spec: str | Reducer) -> Reducer:
    """A Reducer from a spec string (or the Reducer itself). ``'A + B'`` (a top-level '+') builds
    the composite of the stages A, B (core/compose.py)."""
    if isinstance(spec, Reducer):
        return spec
    stages = split_stages(spec)
    if len(stages) > 1:
        built = [build_reducer(s) for s in stages]  # loads the built-in methods, and with them the composite
        if _COMPOSITE is None:  # a packaging bug, not the user's: tokenreduce/methods imports core/compose.py
            raise RuntimeError("no composite reducer is registered (tokenreduce.core.compose registers it)")
        return _COMPOSITE(built)
    _, cls, cfg = _METHODS.resolve(spec)
    return cls(cfg)

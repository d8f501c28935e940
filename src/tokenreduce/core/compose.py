"""Composition: the spec ``'A + B'`` runs reducer A, then reducer B, as one reducer.

Interface (what a stage author needs to know):

- Spec: stages are joined by a top-level ``+`` (outside parentheses and quotes), e.g.
  ``'imagepiece() + evit(keep=0.7, locs=(3, 6, 9))'`` or ``'topk(keep=0.7) + llf()'``.
  ``build_reducer`` returns a :class:`Compose`; its canonical spec is the stages' canonical specs
  joined by ``' + '``. Any number of stages; a composite inside a composite is flattened.
- Order: at each block, the stages acting at the attention point ('attn') run in spec order, then
  the MLP, then the stages acting at the block point ('block') in spec order. The adapter calls
  ``Compose.reduce`` once per point that acts, with ``state.point`` set to 'attn' or 'block'
  (``Schedule.point_counts``); a composite whose stages sit at different points has
  ``where == 'both'`` and a schedule with ``mid`` (tokens after the attention point).
- Schedule rule: every stage is bound alone on the host first (``stage.bind(host)``: its own
  checks, its learned parts). The composite then walks the blocks in the order above and asks each
  stage, at each of its own locs, ``stage.compose_step(block, entering, aside, alone)`` ->
  ``(count, aside)``: the non-prefix tokens it leaves when ``entering`` reach it, and the tokens
  kept aside (pruned) afterwards. The default (``Reducer.compose_step``) keeps the fraction of
  the tokens reaching it that the stage keeps alone at that block, rounded up:
  ``ceil(entering * after_alone / before_alone)`` - exactly its own count wherever the tokens
  reaching it are those it would see alone (the first stage always), close to its own rule
  elsewhere (EViT's ceil(keep * n) + 1; ToMe's r shrinks with the tokens left) - and counts the
  removed tokens as pruned unless the stage ``conserves_patches``. So each later stage is bound on
  the counts the earlier stages leave, in proportion, and never exceeds the share it removes alone
  (removing a fixed number instead would leave nothing: 'imagepiece() + evit(keep=0.7)' on DeiT-S).
- A stage that GROWS the count declares it in ``compose_step``: Last Layer Fusion returns
  ``(entering + aside, 0)`` (every pruned token back), so ``'topk(keep=0.7) + llf()'`` and
  ``'cropr(...) + llf()'`` compile exactly, whatever the pruner and its point. It must also set
  ``keep_pruned`` (the composite keeps pruned tokens aside if any stage asks), and ``restores``:
  the stages before it are then bound with ``Host.restore_at`` (the first block where a later stage
  brings the tokens back; a pruner's default placement ends before it, as Cropr's official schedule
  with LLF), and it is refused where no stage acts before it since the start or since the last
  restoring stage (``'llf() + llf()'`` brings nothing back). A stage that merges and prunes
  overrides ``compose_step`` to count only the pruned ones as aside (ImagePiece).
- A stage that needs BOTH points is simply two stages, or one stage whose ``where`` is one point:
  the composite is what spans both points of a block.
- Attention side products (``AttnInfo``) are computed once per block, for the tokens entering it
  (``needs_at``: the union of the needs of the stages acting there). A stage that runs after
  another one in the same block reads them for the tokens that reach it: a kept token its own, a
  merged or fused token that of the token whose position it keeps (``state.index``). A stage
  that needs side products cannot follow, in the same block, a stage that brings tokens back
  (their side products were never computed): SpecError.
- Declarations: ``needs`` the union; ``keep_pruned``, ``learned``, ``needs_class_token``,
  ``dynamic_schedule`` and ``proportional`` if any stage; ``conserves_patches``, ``exportable`` and
  ``classic_onnx`` if all; ``min_onnx_opset`` the highest; ``hosts`` the host families every
  stage runs on; ``scoring_macs`` the side products once plus each acting stage's own scoring for
  the tokens that reach it; ``attn_bias`` the sum;
  ``attention_chunk`` the stages' common value (SpecError if two differ); ``observes`` the union.
  ``replay_spec``: the registered replayer's spec (the random pruner) for a schedule acting at
  one point and never growing, else None. ``budget_family``: [] - a composite is not a candidate
  of the registry's budget search; choose the stages' parameters (the ``imagepiece`` study
  matches budgets explicitly).
- Training with a soft keep policy (DynamicViT keeps every token and masks attention): a later
  stage is asked to remove the same number of tokens from the tokens actually present.
- Limits: a later stage's own limits on the counts it is given (ToMe merges at most half the
  tokens) are met by the proportional rule in practice and checked in every eval forward (an
  error naming the stage). ``random`` draws its kept sets at bind for the counts it sees alone, so
  it can only be the first stage (``'random(...) + llf()'``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import ChunkedProbs
from .errors import SpecError, TokenReduceError
from .method import AttnInfo, Host, Reducer, matched_spec, needs_macs, register_composite
from .ops import positions
from .registry import split_stages as split_stages  # the spec grammar's top-level '+'
from .schedule import Schedule
from .state import TokenState

#: The two points of a block where a reducer runs, in the order they come.
POINTS = ("attn", "block")


@dataclass(frozen=True)
class ComposeConfig:
    """The canonical specs of the stages, in order."""

    stages: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """One stage acting at one point of a block: ``entering`` -> ``count`` non-prefix tokens;
    ``realign``: the side products later stages of the same block read, which follow the tokens."""

    stage: int
    point: str
    entering: int
    count: int
    realign: frozenset[str] = frozenset()


@register_composite
class Compose(Reducer):
    """Stages run in order at each block (see the module docstring). Not registered: built by
    ``build_reducer`` from a spec with a top-level ``+``."""

    Config = ComposeConfig

    def __init__(self, stages: Sequence[Reducer]) -> None:
        flat: list[Reducer] = []
        for s in stages:
            flat += list(s.stages) if isinstance(s, Compose) else [s]
        if len(flat) < 2:
            raise SpecError(f"a composite needs at least two stages joined by '+', got {len(flat)}")
        super().__init__(ComposeConfig(tuple(s.spec() for s in flat)))
        self.stages = nn.ModuleList(flat)
        self.name = " + ".join(s.name for s in flat)
        self.needs = frozenset().union(*(s.needs for s in flat))
        self.needs_class_token = any(s.needs_class_token for s in flat)
        self.keep_pruned = any(s.keep_pruned for s in flat)
        self.learned = any(s.learned for s in flat)
        self.dynamic_schedule = any(s.dynamic_schedule for s in flat)
        self.exportable = all(s.exportable for s in flat)
        limited = [s.hosts for s in flat if s.hosts is not None]
        self.hosts = frozenset.intersection(*limited) if limited else None
        self.min_onnx_opset = max(s.min_onnx_opset for s in flat)
        self.classic_onnx = all(s.classic_onnx for s in flat)
        self.conserves_patches = all(s.conserves_patches for s in flat)
        self.proportional = any(s.proportional for s in flat)
        points = {s.where for s in flat}
        self.where = points.pop() if len(points) == 1 else "both"
        self._plan: dict[int, tuple[Step, ...]] = {}

    # ----- declarations -------------------------------------------------------------------------

    def spec(self) -> str:
        return " + ".join(s.spec() for s in self.stages)

    def needs_at(self, block: int) -> frozenset[str]:
        return frozenset().union(*(self.stages[st.stage].needs_at(block) for st in self._plan.get(block, ())))

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """The side products once (for the tokens entering the block), plus each acting stage's own
        scoring (its ``scoring_macs`` less the side-product part) for the tokens that reach it."""
        total = needs_macs(self.needs_at(block), host.dim, tokens_in)
        for st in self._plan.get(block, ()):
            stage, n = self.stages[st.stage], st.entering + host.num_prefix
            total += stage.scoring_macs(block, n, st.count, host) - needs_macs(stage.needs, host.dim, n)
        return total

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """None: a composite is not a candidate of the registry's budget search (choose its stages'
        parameters; the ``imagepiece`` study matches budgets explicitly)."""
        return []

    def schedule_origin(self) -> str | None:
        """The stages' origins (``Reducer.schedule_origin``), joined; None when no stage has one."""
        return "; ".join(o for s in self.stages if (o := s.schedule_origin()) is not None) or None

    @classmethod
    def replay_spec(cls, schedule: Schedule, seed: int = 0) -> str | None:
        """The registered replayer's spec (``core.method.matched_spec``: the random pruner at the same
        counts) for a schedule that acts at one point and never grows; None otherwise (a pruner cannot
        bring tokens back, and no single replayer acts at both points of a block)."""
        if schedule.where not in POINTS:
            return None
        try:
            return matched_spec(schedule, seed)
        except SpecError:
            return None

    def attention_chunk(self, block: int) -> int | None:
        chunks = {c for s in self.stages if (c := s.attention_chunk(block)) is not None}
        if len(chunks) > 1:
            raise SpecError(f"{self.spec()}: the stages ask for different attention chunks at block {block} "
                            f"({sorted(chunks)}); compose at most one chunked stage")
        return chunks.pop() if chunks else None

    def attn_bias(self, state: TokenState, block: int) -> Tensor | None:
        biases = [b for s in self.stages if (b := s.attn_bias(state, block)) is not None]
        return sum(biases[1:], biases[0]) if biases else None

    def observes(self, block: int) -> frozenset[str]:
        return frozenset().union(*(s.observes(block) for s in self.stages))

    def observe(self, state: TokenState, info: AttnInfo) -> None:
        for s in self.stages:
            if s.observes(state.block):
                s.observe(state, info)

    def for_inference(self) -> Reducer:
        deployed = [s.for_inference() for s in self.stages]
        if all(d is s for d, s in zip(deployed, self.stages, strict=True)):
            return self
        out = Compose(deployed)
        out._plan = dict(self._plan)
        return out

    # ----- schedule -------------------------------------------------------------------------------

    def _bind_stages(self, host: Host) -> list[Schedule]:
        """Each stage bound alone; a stage before one that ``restores`` pruned tokens is bound with
        ``host.restore_at`` = the first block where a later stage brings them back, so that its default
        placement ends before it ('cropr(...) + llf()': Cropr's modules after blocks 0 .. depth - 3, as
        the official model with Last Layer Fusion)."""
        alone: dict[int, Schedule] = {i: s.bind(host) for i, s in enumerate(self.stages) if s.restores}
        for i, stage in enumerate(self.stages):
            if i not in alone:
                back = [alone[j].locs[0] for j in alone if j > i and alone[j].locs]
                alone[i] = stage.bind(dataclasses.replace(host, restore_at=min(back)) if back else host)
        return [alone[i] for i in range(len(self.stages))]

    def bind(self, host: Host) -> Schedule:
        alone = self._bind_stages(host)
        n = host.num_patches
        cur, aside = n, 0
        counts: list[int] = []
        mid: list[int] = []
        plan: dict[int, list[Step]] = {}
        acted = False  # a stage acted since the start or since the last restoring stage
        last_restore: tuple[str, int] | None = None
        for block in range(host.depth):
            for point in POINTS:
                for i, (stage, sched) in enumerate(zip(self.stages, alone, strict=True)):
                    if stage.where != point or block not in sched.locs:
                        continue
                    if stage.restores:
                        self._check_restore(stage, block, acted, last_restore)
                        acted, last_restore = False, (stage.name, block)
                    else:
                        acted = True
                    new, new_aside = stage.compose_step(block, cur, aside, sched)
                    if not 1 <= new <= n:
                        raise SpecError(
                            f"{self.spec()}: stage {stage.name} would leave {new} tokens at block {block} "
                            f"({cur} reach it); a count must lie in [1, {n}]; choose milder stages")
                    if new != cur:
                        plan.setdefault(block, []).append(Step(i, point, cur, new))
                    cur, aside = new, new_aside
                if point == "attn":
                    mid.append(cur)
            counts.append(cur)
            self.attention_chunk(block)  # two different chunk sizes: SpecError now, not in a forward
        self._plan = {b: self._check_reads(b, steps) for b, steps in plan.items()}
        where = self.where
        return Schedule(n, tuple(counts), tuple(sorted(self._plan)), where,
                        tuple(mid) if where == "both" else None)

    def _check_restore(self, stage: Reducer, block: int, acted: bool, last: tuple[str, int] | None) -> None:
        """Refuse a stage that brings pruned tokens back where no stage acted before it: it would do
        nothing (``'llf() + llf()'``, or a restoring stage at a block before every pruner's)."""
        if acted:
            return
        if last is None:
            raise SpecError(f"{self.spec()}: {stage.name} brings back the tokens that earlier stages pruned, but "
                            f"no stage acts before block {block}, where it runs; put a pruning stage before it")
        raise SpecError(f"{self.spec()}: {stage.name} at block {block} would bring nothing back: {last[0]} already "
                        f"brought every pruned token back at block {last[1]} and no stage acts in between; drop one")

    def _check_reads(self, block: int, steps: list[Step]) -> tuple[Step, ...]:
        """Mark the steps after which the side products must follow the tokens; refuse a stage that
        reads them after a stage that brought tokens back in the same block."""
        out = []
        for k, st in enumerate(steps):
            later = [self.stages[s.stage] for s in steps[k + 1:] if self.stages[s.stage].needs_at(block)]
            if later and st.count > st.entering:
                raise SpecError(
                    f"{self.spec()}: {later[0].name} reads attention scores at block {block} after "
                    f"{self.stages[st.stage].name} brought tokens back there (their scores were never "
                    "computed); move one of them to another block")
            reads = frozenset().union(*(s.needs_at(block) for s in later))
            out.append(Step(st.stage, st.point, st.entering, st.count, realign=reads))
        return tuple(out)

    # ----- forward ---------------------------------------------------------------------------------

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p, block = state.num_prefix, state.block
        steps = [st for st in self._plan.get(block, ()) if st.point == state.point]
        if not steps:
            if self.training:  # a training-time keep policy kept tokens the plan counts as gone, so the
                return x  # adapter saw a count change at a point where no stage acts: nothing to do
            raise TokenReduceError(f"{self.spec()}: called at the {state.point} point of block {block}, "
                                   "where no stage acts (the adapter asks Schedule.point_counts)")
        # tokens a training-time keep policy kept although the plan drops them (0 in eval): a later
        # stage removes the same number from the tokens present
        surplus = x.shape[1] - p - steps[0].entering
        for st in steps:
            stage = self.stages[st.stage]
            before = state.index
            x = stage.reduce(x, state, info, st.count + surplus)
            if not self.training and x.shape[1] - p != st.count:
                raise TokenReduceError(
                    f"{self.spec()}: stage {stage.spec()} left {x.shape[1] - p} tokens at block {block} where "
                    f"the composite's schedule says {st.count} ({st.entering} reached it); as a later stage it "
                    "removes what it removes alone, which its own limits do not allow here: choose milder stages")
            if st.realign:
                _realign(info, before, state.index, state.num_original, st.realign)
        return x


def _realign(info: AttnInfo, before: Tensor, after: Tensor, n0: int, reads: frozenset[str] | None = None) -> None:
    """Make ``info`` describe the tokens ``after`` (B, K) instead of ``before`` (B, N), in place: each
    token takes the side products of the token with its ``index`` value (its own; for a merged or
    fused token, the token whose position it keeps). Every value of ``after`` is in ``before``.
    Only the side products in ``reads`` (those the later stages read; None: all) are moved: the
    others are no longer read in this block, and gathering them costs operators."""
    B, N = before.shape
    table = torch.full((B, n0), -1, dtype=torch.long, device=before.device)
    table.scatter_(1, before, positions(0, N, 1, before.device).expand(B, N))
    pos = table.gather(1, after)  # (B, K) position of each new token among the old ones

    def take(t: Tensor, dim: int) -> Tensor:  # t (B, H, ..., N, ...) gathered along dim
        shape = [1] * t.dim()
        shape[0], shape[dim] = B, pos.shape[1]
        idx = pos.reshape(shape).expand(*t.shape[:dim], pos.shape[1], *t.shape[dim + 1:])
        return t.gather(dim, idx)

    def wanted(name: str) -> bool:
        return getattr(info, name) is not None and (reads is None or name in reads)

    if wanted("cls_attn"):
        info.cls_attn = take(info.cls_attn, 2)  # (B, H, K)
    if wanted("head_norms"):
        info.head_norms = take(info.head_norms, 2)  # (B, H, K)
    if wanted("received"):
        info.received = take(info.received, 2)  # (B, H, K)
    if wanted("shift"):
        info.shift = take(info.shift, 1)  # (B, K)
    if wanted("keys"):
        info.keys = take(info.keys, 2)  # (B, H, K, d)
    if wanted("probs"):
        # chunked attention's per-chunk probabilities describe the chunks of the tokens before this stage;
        # the tokens after it are chunked otherwise, so a later stage reads them laid out in full, as computed
        # (zeros outside each chunk), a (B, H, N, N) tensor only in this case
        probs = info.probs.dense() if isinstance(info.probs, ChunkedProbs) else info.probs
        info.probs = take(take(probs, 2), 3)  # (B, H, K, K)

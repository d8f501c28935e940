"""TokenState: what travels with the tokens through the blocks of one forward.

Built fresh at the start of every forward and never stored on the model between calls.
Every token-aligned tensor (``index``, ``size``, ``source``, ``keep_mask``, ``mass``) is kept in the same
order as the tokens ``x`` (B, N, C), prefix tokens first, and ``members`` maps every original
position to the token holding it. All of them change in ONE place, :meth:`TokenState._reduce`,
which :meth:`gather` (prune), :meth:`merge` (merge plans, any positive weight) and
:meth:`gather_and_fuse` (EViT) go through, so no reduction can leave a field misaligned.
:meth:`restore` brings pruned tokens back in place (Last Layer Fusion); :meth:`unmerge` copies
each token to every original position it holds; :meth:`dense` does both, for dense tasks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import ops
from .errors import TokenReduceError

#: The token-aligned fields and how a field combines when tokens merge into one: "first" keeps the
#: destination token's value (a merged token keeps the original position of the token merged
#: into), "sum" adds the values (sizes, source memberships), "max" takes the largest (a merged token
#: is kept by the keep policy as much as its most-kept member). Adding a field = one entry here.
ALIGNED: dict[str, str] = {"index": "first", "size": "sum", "source": "sum", "keep_mask": "max", "mass": "sum"}

#: Fields that may be None, and what None stands for: all ones (a token of size 1, a fully kept token),
#: or another field's values (a mass nobody weighs otherwise is the size).
_WHEN_NONE: dict[str, str | None] = {"size": None, "keep_mask": None, "mass": "size"}


@dataclass
class Pruned:
    """Tokens set aside by one reduction: x (B, D, C) as they were when pruned, their aligned
    fields at that moment (``fields[name]`` (B, D, ...), missing when not tracked then), and, with
    dense tracking, ``held`` (B, N0): the index value of the pruned token holding each original
    position it took away from ``members``, -1 elsewhere."""

    x: Tensor
    fields: dict[str, Tensor]
    held: Tensor | None = None


@dataclass
class TokenState:
    """Book-keeping for one forward pass.

    Attributes:
        num_prefix: prefix tokens (cls, dist, registers) at the front, never reduced.
        num_patches: patch tokens at the start of the forward; N0 = num_prefix + num_patches.
        block: index of the block being run (set by the adapter).
        point: where in the block a reduction runs, 'attn' or 'block' (set by the adapter before
            each call of ``Reducer.reduce``; a composite, core/compose.py, runs its stages there).
        index: (B, N) long, original sequence position each token stems from (for a merged
            token: the position of the token it was merged into). Values are unique among the
            tokens present and the pruned ones kept aside, so they name tokens.
        size: (B, N) float, patches each token stands for, or None while every size is 1.
        source: (B, N, N0) float 0/1 membership of original tokens, only when tracing.
        keep_mask: (B, N) keep policy in [0, 1] aligned with the tokens (prefix entries 1), or
            None. While set, the attention of the following blocks weights key j by
            keep_mask[:, j] (a token always sees itself) instead of dropping tokens: the
            differentiable stand-in for pruning that learned pruners train with (DynamicViT).
            A merged token's keep_mask is the max over its members.
        members: (B, N0) long, only with ``dense=True``: for each ORIGINAL position j, the
            ``index`` value of the present token that holds j (itself, or the token it was merged
            or fused into), -1 while that token is pruned (kept aside in ``pruned``; restore
            gives the positions back). Not token-aligned but updated by the same path.
        mass: (B, N) float, the weight of each token in proportional attention where a reducer weighs a
            merged token otherwise than by the patches it holds (DiffRate: each merged-in token by its
            similarity to its destination), or None: the size. Merges sum it unless the merging
            reducer passes the new values (:meth:`merge`).
        prop_attn: add log(mass) (the size unless a reducer set a mass) to the attention logits
            (proportional attention).
        keep_pruned: keep pruned tokens aside in ``pruned`` (Last Layer Fusion, unmerge).
        pruned: the tokens set aside since the start, one entry per pruning reduction; read and
            emptied by :meth:`restore`, read by :meth:`unmerge`.
        aux_losses: name -> scalar loss a learned reducer computes itself (DynamicViT's ratio).
        aux_outputs: name -> auxiliary PREDICTION (B, Q, K) in the task's output space, which the
            task scores with its own criterion as the loss ``aux/<name>`` (Cropr's auxiliary heads):
            Q = 1 for an image-level prediction (classification: K class logits), Q = gh * gw for a
            dense one (one prediction per cell of the patch grid, row-major; segmentation scores it
            against its target taken at that grid). Emitted in training forwards only.
    """

    num_prefix: int
    num_patches: int
    index: Tensor
    block: int = -1
    point: str = "attn"
    size: Tensor | None = None
    source: Tensor | None = None
    prop_attn: bool = False
    keep_pruned: bool = False
    keep_mask: Tensor | None = None
    members: Tensor | None = None
    mass: Tensor | None = None
    pruned: list[Pruned] = field(default_factory=list)
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    aux_outputs: dict[str, Tensor] = field(default_factory=dict)
    tokens_per_block: list[int] = field(default_factory=list)
    snapshots: dict[int, Tensor] = field(default_factory=dict)

    @classmethod
    def start(
        cls, x: Tensor, num_prefix: int, *, trace: bool = False, prop_attn: bool = False,
        keep_pruned: bool = False, dense: bool = False,
    ) -> TokenState:
        """The state of x (B, N0, C) entering the first block. Nothing beyond ``index`` is built
        unless asked: ``trace`` builds ``source`` (B, N0, N0), ``keep_pruned`` keeps pruned
        tokens aside, ``dense`` (for :meth:`dense`) implies keep_pruned and tracks ``members``."""
        B, N, _ = x.shape  # (B, N, C)
        index = ops.positions(0, N, 1, x.device).expand(B, N)  # read only: every update makes a new tensor
        source = torch.eye(N, device=x.device, dtype=x.dtype).expand(B, N, N) if trace else None
        return cls(num_prefix, N - num_prefix, index, source=source, prop_attn=prop_attn,
                   keep_pruned=keep_pruned or dense, members=index if dense else None)

    @property
    def tracing(self) -> bool:
        return self.source is not None

    @property
    def num_original(self) -> int:
        """N0: tokens at the start of the forward, prefix included."""
        return self.num_prefix + self.num_patches

    def sizes(self, x: Tensor) -> Tensor:
        """(B, N) sizes, materialised as ones when nothing was merged yet."""
        if self.size is None:
            return x.new_ones(x.shape[:2])
        return self.size

    def masses(self, x: Tensor) -> Tensor:
        """(B, N) attention masses: a reducer's own where one set them, else the sizes (:meth:`sizes`)."""
        return self.mass if self.mass is not None else self.sizes(x)

    def attn_bias(self) -> Tensor | None:
        """Proportional attention bias log(mass), the mass being the size unless a reducer set one, as an
        additive SDPA mask, (B, 1, 1, N); None without proportional attention or while every token weighs 1."""
        weight = self.mass if self.mass is not None else self.size  # masses() less the all-ones case
        if not self.prop_attn or weight is None:
            return None
        return weight.log().reshape(weight.shape[0], 1, 1, -1)  # one view, not two unsqueezes

    # ----- reductions: every one goes through _reduce -------------------------------------------

    def gather(self, x: Tensor, idx: Tensor) -> Tensor:
        """Keep the tokens at positions ``idx`` (B, K), in that order; returns x (B, K, C).
        The others are pruned (kept aside when ``keep_pruned``)."""
        self._reduce(x, idx)
        return ops.gather_tokens(x, idx)

    def merge(self, x: Tensor, plan: ops.MergePlan, weight: Tensor | None = None,
              mass: Tensor | None = None) -> Tensor:
        """Apply a merge plan to x and every aligned field; returns merged x (B, N - r, C).

        x_d <- (w_d x_d + sum_i w_i x_i) / (w_d + sum_i w_i) over the tokens i merged into d, with
        w = ``weight`` (B, N) > 0 if given (e.g. BSPF's similarity weights), else the sizes
        (ToMe's size-weighted mean). The sizes are always summed, s_d <- s_d + sum_i s_i,
        whatever the weight; ``mass`` (B, N - r), if given, is the merged tokens' new mass, weighed by
        the reducer itself (DiffRate); the other fields combine as ALIGNED says.
        """
        given = {} if mass is None else {"mass": mass}
        if weight is None:
            x_new, size = plan.mean(x, self.size)  # size None (no merge yet): all ones, not materialised
            given["size"] = size
        else:
            x_new, _ = plan.mean(x, weight)
        self._reduce(x, plan.keep, plan.src, plan.dst, given)
        return x_new

    def gather_and_fuse(self, x: Tensor, keep: Tensor, drop: Tensor, weights: Tensor) -> Tensor:
        """Keep ``keep`` (B, K) and append one token fused from ``drop`` (B, D), D >= 1 (EViT).

        The fused token is sum_j weights[:, j] * x[drop_j] (B, 1, C) (raw weights, not
        normalised). For every aligned field it is a merge of the dropped tokens into one, the
        first dropped token being the destination: its size is their total size, its index that
        of the first dropped token, its source the union, its keep_mask their max.
        """
        if drop.shape[1] == 0:
            raise TokenReduceError("gather_and_fuse needs at least one dropped token to fuse; use gather")
        dropped = ops.gather_tokens(x, drop)  # (B, D, C)
        token = (weights[..., None] * dropped).sum(1, keepdim=True)  # (B, 1, C)
        src = drop[:, 1:]  # (B, D - 1) merged into the slot of drop[:, 0], the last one
        self._reduce(x, torch.cat([keep, drop[:, :1]], 1), src, torch.full_like(src, keep.shape[1]))
        return torch.cat([ops.gather_tokens(x, keep), token], 1)

    def _reduce(self, x: Tensor, keep: Tensor, src: Tensor | None = None, dst: Tensor | None = None,
                given: dict[str, Tensor] | None = None) -> None:
        """THE update path of every aligned field, for old tokens (B, N) -> new tokens (B, K):

            new[k] = old[keep[k]]  combined (as ALIGNED says) with  old[src[i]] for every dst[i] == k

        keep (B, K) and src (B, r) are positions into the old tokens, dst (B, r) slots into the new.
        Old tokens in neither keep nor src are pruned: set aside in ``pruned`` with their values
        now when ``keep_pruned``. ``given`` holds new values already computed (the sizes a
        size-weighted mean sums anyway, a reducer's own mass). ``x`` (B, N, C) is read only to set
        tokens aside.
        """
        n = x.shape[1]
        r = 0 if src is None else src.shape[1]
        if self.keep_pruned and keep.shape[1] + r < n:
            taken = keep if not r else torch.cat([keep, src], 1)
            self._set_aside(x, ops.complement_index(taken, n))
        src_values = self.index.gather(1, src) if r and self.members is not None else None
        for name, rule in ALIGNED.items():
            if given and given.get(name) is not None:
                setattr(self, name, given[name])
                continue
            t = getattr(self, name)
            if t is None:
                if r and name == "size":  # sizes start counting at the first merge: 1 + tokens merged in
                    setattr(self, name, x.new_ones(keep.shape).scatter_add_(1, dst, x.new_ones(src.shape)))
                continue
            new = ops.gather_tokens(t, keep)
            if r and rule != "first":
                rows = ops.gather_tokens(t, src)
                slots = dst if rows.dim() == 2 else dst.reshape(*dst.shape, *([1] * (rows.dim() - 2))).expand_as(rows)
                if rule == "sum":
                    new.scatter_add_(1, slots, rows)
                else:
                    new = new.scatter_reduce(1, slots, rows, "amax")
            setattr(self, name, new)
        if src_values is not None:  # positions held by a merged-away token now belong to its dst
            table = torch.arange(self.num_original, device=x.device).expand_as(self.members).clone()
            table.scatter_(1, src_values, self.index.gather(1, dst))
            self.members = torch.where(self.members >= 0, table.gather(1, self.members.clamp_min(0)), -1)

    def _set_aside(self, x: Tensor, drop: Tensor) -> None:
        """Keep the tokens at ``drop`` (B, D) with their values and aligned fields as of now."""
        fields = {name: ops.gather_tokens(getattr(self, name), drop)
                  for name in ALIGNED if getattr(self, name) is not None}
        held = None
        if self.members is not None:  # positions the dropped tokens hold leave `members` for `held`
            gone = torch.zeros_like(self.members, dtype=torch.bool).scatter_(1, fields["index"], True)
            lost = (self.members >= 0) & gone.gather(1, self.members.clamp_min(0))  # (B, N0)
            held = torch.where(lost, self.members, -1)
            self.members = torch.where(lost, -1, self.members)
        self.pruned.append(Pruned(ops.gather_tokens(x, drop), fields, held))

    # ----- tokens that come back ------------------------------------------------------------------

    def restore(self, x: Tensor) -> Tensor:
        """Bring every pruned token back at its original position (Last Layer Fusion, Cropr).

        x (B, N, C) -> (B, N + D, C), D tokens kept aside since the start (with the values they
        had when pruned): prefix tokens, then every token present or pruned, sorted by ``index``
        (original position; a merged token sits at its destination's position). Every aligned
        field follows (a field untracked when a token was pruned counts as ones there),
        ``members`` gets the positions back and ``pruned`` is emptied. Needs ``keep_pruned``.
        """
        if not self.keep_pruned:
            raise TokenReduceError(
                "restore needs the pruned tokens kept aside: start the TokenState with keep_pruned=True "
                "(a reducer sets Reducer.keep_pruned) or dense=True"
            )
        self._check_tokens(x)
        xs = torch.cat([x, *(p.x for p in self.pruned)], 1)  # (B, N + D, C)
        counts = [x.shape[1], *(p.x.shape[1] for p in self.pruned)]
        raw = {name: [getattr(self, name), *(p.fields.get(name) for p in self.pruned)] for name in ALIGNED}
        for name, parts in raw.items():
            if all(t is None for t in parts):
                continue
            if name in _WHEN_NONE:  # untracked then = what None stands for, in the dtype tracked now
                ref = next(t for t in parts if t is not None)
                stand_in = raw.get(_WHEN_NONE[name] or "", [None] * len(parts))
                parts = [t if t is not None else s if s is not None else ref.new_ones(x.shape[0], k)
                         for t, s, k in zip(parts, stand_in, counts, strict=True)]
            setattr(self, name, torch.cat(parts, 1))
        order = self.index.argsort(dim=1)  # (B, N + D): index values are distinct
        for name in ALIGNED:
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, ops.gather_tokens(t, order))
        if self.members is not None:
            for p in self.pruned:
                self.members = torch.maximum(self.members, p.held)
        self.pruned.clear()
        return ops.gather_tokens(xs, order)

    def unmerge(self, x: Tensor) -> Tensor:
        """One token per original position: x (B, N, C) -> (B, N0, C), N0 = p + num_patches.

        out[:, j] = the token holding original position j: a merged token is copied to every
        position it stands for; a position whose token was pruned gets that token as it was when
        pruned (from ``pruned``), so every position has a value. The state is left as it is
        (it still describes the N tokens). Needs ``dense=True``.
        """
        if self.members is None:
            raise TokenReduceError(
                "unmerge needs to know which token holds each original position: start the "
                "TokenState with dense=True (tokenreduce.apply(..., dense=True))"
            )
        self._check_tokens(x)
        rows = torch.cat([x, *(p.x for p in self.pruned)], 1)  # (B, M, C)
        values = torch.cat([self.index, *(p.fields["index"] for p in self.pruned)], 1)  # (B, M)
        holder = self.members
        for p in self.pruned:
            holder = torch.maximum(holder, p.held)
        B, M = values.shape
        row_of_value = torch.zeros_like(holder).scatter_(  # index value -> row in `rows`
            1, values, torch.arange(M, device=x.device).expand(B, M))
        return ops.gather_tokens(rows, row_of_value.gather(1, holder))  # (B, N0, C)

    def dense(self, x: Tensor) -> Tensor:
        """x (B, N, C) -> (B, N0, C) in original order: :meth:`restore`, then :meth:`unmerge`."""
        return self.unmerge(self.restore(x))

    def _check_tokens(self, x: Tensor) -> None:
        if x.shape[1] != self.index.shape[1]:
            raise TokenReduceError(
                f"x has {x.shape[1]} tokens but the TokenState describes {self.index.shape[1]}; "
                "reduce tokens only through TokenState.gather/merge/gather_and_fuse"
            )

    def record(self, block: int, num_tokens: int, reduced: bool) -> None:
        self.tokens_per_block.append(num_tokens)
        if reduced and self.source is not None:
            self.snapshots[block] = self.source.detach()

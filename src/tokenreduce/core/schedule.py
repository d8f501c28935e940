"""One schedule vocabulary for every method.

A :class:`Schedule` lists, for each block, how many non-prefix tokens leave it. It compiles from
``r`` (tokens removed per block), ``keep`` + ``locs`` (fraction kept at given blocks) or
``counts`` + ``locs`` (explicit token counts). Block indices are 0-based. Counts only shrink,
unless a method declares ``grow=True`` (it brings tokens back, e.g. Last Layer Fusion restores the
pruned ones): then a count may rise again, up to the patch count. A composite of stages at both
points of a block (core/compose.py) has ``where='both'`` and also lists the tokens after the
attention point of each block (``mid``): :meth:`Schedule.point_counts` says what runs where.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from .errors import SpecError

#: Where a reducer runs in a block (a spec's ``where``): after attention + residual, or after the MLP.
Where = Literal["attn", "block"]
WHERES: tuple[str, ...] = get_args(Where)


@dataclass(frozen=True)
class Schedule:
    """Non-prefix tokens after each block.

    Attributes:
        num_patches: non-prefix tokens entering block 0.
        counts: (depth,) non-prefix tokens leaving each block.
        locs: blocks where the reducer runs (counts change only there).
        where: 'attn' (after attention + residual, before the MLP), 'block' (after the MLP), or
            'both' (a composite with stages at both points, core/compose.py).
        mid: only with where='both': (depth,) non-prefix tokens after the attention point of each
            block, i.e. what its MLP sees; None otherwise.
    """

    num_patches: int
    counts: tuple[int, ...]
    locs: tuple[int, ...]
    where: str
    mid: tuple[int, ...] | None = None

    @property
    def depth(self) -> int:
        return len(self.counts)

    def count_at(self, block: int) -> int | None:
        """Target count if the reducer runs at ``block``, else None."""
        return self.counts[block] if block in self.locs else None

    def active(self, block: int, current: int) -> bool:
        """THE rule for "the reducer acts at ``block``": the schedule names a count there and it
        differs from ``current``, the non-prefix tokens entering the reduction (fewer: reduce;
        more: bring tokens back). A no-op loc (keep=1) is skipped, costs nothing and needs nothing
        from attention. The adapter and the MACs count both ask this, nowhere else decides it."""
        count = self.count_at(block)
        if count is None:
            return False
        return count != current or (self.mid is not None and self.mid[block] != current)

    def point_counts(self, block: int, current: int) -> tuple[int | None, int | None]:
        """(non-prefix tokens after the attention point, after the block point) of ``block``
        entered with ``current``; None where nothing runs (both None where the block is not
        :meth:`active`). What the adapter runs at each point and what bench/macs.py counts."""
        if not self.active(block, current):
            return None, None
        count = self.counts[block]
        if self.where == "attn":
            return count, None
        if self.where == "block":
            return None, count
        mid = self.mid[block]
        return (mid if mid != current else None), (count if count != mid else None)

    def mlp_count(self, block: int, current: int) -> int:
        """Non-prefix tokens the MLP of ``block`` sees when ``current`` enter the block."""
        at_attn, _ = self.point_counts(block, current)
        return current if at_attn is None else at_attn

    def tokens_per_block(self, num_prefix: int) -> list[int]:
        """Total tokens (prefix included) leaving each block."""
        return [c + num_prefix for c in self.counts]

    def describe(self) -> str:
        steps = " -> ".join(str(self.counts[i]) for i in self.locs)
        return f"{self.num_patches} -> {steps} non-prefix tokens at blocks {list(self.locs)} ({self.where})"


def check_locs(locs: Sequence[int], depth: int, method: str) -> tuple[int, ...]:
    locs = tuple(int(i) for i in locs)
    bad = [i for i in locs if not 0 <= i < depth]
    if bad:
        raise SpecError(
            f"{method}: block index {bad[0]} is beyond the model's depth {depth}; "
            f"valid blocks are 0..{depth - 1}"
        )
    if list(locs) != sorted(set(locs)):
        raise SpecError(f"{method}: locs={locs} must be strictly increasing block indices")
    return locs


def _build(n: int, depth: int, targets: dict[int, int], where: str, method: str, grow: bool = False) -> Schedule:
    """Counts per block from the targets at the locs. Without ``grow`` a count lies in
    [1, current]; with it in [1, n] (a method that brings tokens back may rise again)."""
    counts, cur = [], n
    for block in range(depth):
        if block in targets:
            new = targets[block]
            if grow and not 1 <= new <= n:
                raise SpecError(
                    f"{method}: block {block} would have {new} tokens; a count must lie in [1, {n}] "
                    f"(tokens can come back, but never more than the {n} patches)"
                )
            if not grow and not 1 <= new <= cur:
                hint = " (counts cannot grow: this method does not bring tokens back)" if new > cur else ""
                raise SpecError(
                    f"{method}: block {block} would keep {new} of {cur} tokens; "
                    f"a count must lie in [1, {cur}]{hint}"
                )
            cur = new
        counts.append(cur)
    return Schedule(n, tuple(counts), tuple(sorted(targets)), where)


def from_keep(
    n: int, depth: int, keep: float, locs: Sequence[int], where: str, method: str,
    extra_token: bool = False,
) -> Schedule:
    """Keep ceil(keep * tokens) at each block in ``locs`` (EViT's rule); with ``extra_token``
    one more token (the fused one) is added wherever something was dropped."""
    check_keep(keep, method)
    locs = check_locs(locs, depth, method)
    targets, cur = {}, n
    for block in locs:
        kept = math.ceil(keep * cur)
        cur = kept + 1 if extra_token and kept < cur else kept
        targets[block] = cur
    return _build(n, depth, targets, where, method)


def from_r(
    n: int, depth: int, r: int | Sequence[int], where: str, method: str,
    max_r: Callable[[int], int] = lambda tokens: tokens - 1,
) -> Schedule:
    """Remove r tokens at every block (an int) or r[i] at block i (a sequence of length depth).
    ``max_r(tokens)`` is the method's limit for a block entered with ``tokens`` tokens."""
    rs = [r] * depth if isinstance(r, int) else list(r)
    if len(rs) != depth:
        raise SpecError(f"{method}: r has {len(rs)} entries; give one int or one per block ({depth})")
    targets, cur = {}, n
    for block, ri in enumerate(rs):
        if not isinstance(ri, int) or ri < 0:
            raise SpecError(f"{method}: r must be a non-negative int or a list of them, got {ri!r}")
        if ri > max_r(cur):
            raise SpecError(
                f"{method}: r={ri} is too large at block {block}: {cur} tokens are left there and "
                f"at most {max_r(cur)} can be removed; choose a smaller r"
            )
        if ri:
            cur -= ri
            targets[block] = cur
    return _build(n, depth, targets, where, method)


def from_counts(
    n: int, depth: int, counts: Sequence[int], locs: Sequence[int], where: str, method: str,
    grow: bool = False,
) -> Schedule:
    """Explicit non-prefix counts at ``locs``; ``grow=True`` lets a count exceed the current one
    (up to ``n``), for methods that bring tokens back."""
    locs = check_locs(locs, depth, method)
    if len(counts) != len(locs):
        raise SpecError(
            f"{method}: counts has {len(counts)} entries but locs has {len(locs)}; give one count per loc"
        )
    return _build(n, depth, dict(zip(locs, (int(c) for c in counts), strict=True)), where, method, grow)


def check_keep(keep: float, method: str) -> None:
    if not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
        raise SpecError(f"{method}: keep={keep!r} is outside (0, 1]; keep is the fraction of tokens kept")


def check_where(where: str, method: str) -> None:
    if where not in WHERES:
        raise SpecError(f"{method}: where={where!r} is invalid; choose 'attn' or 'block'")


def compile_schedule(
    n: int, depth: int, method: str, *, where: str, keep: float | None = None,
    r: int | Sequence[int] | None = None, counts: Sequence[int] | None = None,
    locs: Sequence[int] | None = None, extra_token: bool = False,
    max_r: Callable[[int], int] = lambda tokens: tokens - 1, grow: bool = False,
) -> Schedule:
    """Compile whichever of keep / r / counts a spec gave (exactly one). ``grow=True`` declares
    that the method may bring tokens back: explicit counts may then rise again, up to ``n``
    (keep and r only ever shrink)."""
    given = [name for name, v in (("keep", keep), ("r", r), ("counts", counts)) if v is not None]
    if len(given) != 1:
        raise SpecError(
            f"{method}: give exactly one of keep (with locs), r, or counts (with locs); got "
            f"{', '.join(given) or 'none'}"
        )
    check_where(where, method)
    if r is not None:
        if locs is not None:
            raise SpecError(f"{method}: r acts at every block; give r as a list to vary it, not locs")
        return from_r(n, depth, r, where, method, max_r)
    if locs is None:
        raise SpecError(f"{method}: {given[0]} needs locs, the blocks where tokens are reduced")
    if keep is not None:
        return from_keep(n, depth, keep, locs, where, method, extra_token)
    return from_counts(n, depth, counts, locs, where, method, grow)

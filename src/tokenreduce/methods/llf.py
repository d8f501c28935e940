"""llf: Last Layer Fusion, the pruned tokens come back before the final block.

From "Token Cropr: Faster ViTs for Quite a Few Tasks", Bergner et al., CVPR 2025, arXiv 2412.00965
(Sec. 3, "Last Layer Fusion"). Checked against: github.com/benbergner/cropr
(cls/vision_transformer.py ``forward_cropr``, segm/segmenter.py ``forward_cropr``).

A stage of a composite, after any pruning method: ``'topk(keep=0.7) + llf()'``,
``'random(keep=0.5, locs=(2,)) + llf()'``, ``'cropr(r=8, classes=1000) + llf()'``. After block ``at``
(default -2, i.e. depth - 2) every token pruned since the start of the forward comes back,
with the value it had when it was pruned, at its original position (``TokenState.restore``):

    X <- [prefix, every present or pruned patch token sorted by original position]   (B, p + N', C)

so the blocks after ``at`` (by default only the final one) run on all tokens, and a dense task
gets a complete grid with the final block's values everywhere. A pruner's default placement
stops before ``at`` (the composite binds it with ``Host.restore_at``): Cropr's modules sit after
blocks 0 .. depth - 3, the official count with Last Layer Fusion (depth - 2 modules), as its
official ``forward_cropr`` leaves the penultimate block unpruned ("the pruned tokens would be
concatenated next anyways"). In a composite it needs a stage acting before it: ``'llf() + llf()'``
or an ``llf`` at a block before every pruner's would bring nothing back (SpecError).

Schedule: alone, ``llf`` reduces nothing (the identity: nothing was pruned); in a composite it
declares through ``compose_step`` that it leaves the tokens entering it plus every token kept
aside, so the composite's counts rise back (to the patch count after a pruner). Tokens that an
earlier stage MERGED (ToMe, EViT's fused token) were not pruned and stay merged; a dense task
copies them to each position they hold (``TokenState.unmerge``).

Deviations: the official classification model concatenates the pruned tokens after the kept ones
(in pruning order); here they are sorted back to their original positions for every task (the
final block is permutation-equivariant, so classification logits agree up to float rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, Reducer, register_method
from ..core.schedule import Schedule, from_counts
from ..core.state import TokenState


@dataclass(frozen=True)
class LLFConfig:
    """``at``: the block after which the pruned tokens come back (negative: from the end; -2 = the
    penultimate block, so the final block runs on all tokens)."""

    at: int = -2


@register_method("llf")
class LLF(Reducer):
    """Restore every pruned token at its original position after block ``at``:
    x (B, N, C) -> (B, N + D, C), D tokens pruned by earlier stages."""

    Config = LLFConfig
    keep_pruned = True
    restores = True
    classic_onnx = False  # setting pruned tokens aside finds them with a stable sort
    stage_only = True
    where = "block"
    zero: dict = {}
    example: dict = {}

    def bind(self, host: Host) -> Schedule:
        at = self.cfg.at
        if isinstance(at, bool) or not isinstance(at, int) or not -host.depth <= at < host.depth:
            raise SpecError(f"{self.name}: at={at!r} is not a block of this {host.depth}-block model; give "
                            f"0..{host.depth - 1} or a negative index (-2 = the penultimate block)")
        block = at % host.depth
        # alone nothing was pruned: the count stays (grow=True lets a composite raise it here)
        return from_counts(host.num_patches, host.depth, [host.num_patches], [block], self.where, self.name,
                           grow=True)

    def compose_step(self, block: int, entering: int, aside: int, alone: Schedule) -> tuple[int, int]:
        """Every token kept aside comes back: (entering + aside, 0)."""
        return entering + aside, 0

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        return state.restore(x)


__all__ = ["LLF", "LLFConfig"]

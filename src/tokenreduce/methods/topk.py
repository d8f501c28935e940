"""topk: keep the tokens the class token attends to most; drop the rest (no fusion).

The plain attention-score pruner (EViT without its fused token), a floor for every
attention-based method. Score: head-mean CLS attention a_i = (1/H) sum_h A_h[CLS -> i]; ``score``
chooses another (core/scores.py: 'shift', 'received'; the default on a host without a class token
is the representation shift), head-mean likewise.

Deviations: none (no reference implementation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from ..core import ops
from ..core.method import AttnInfo, Host, register_method
from ..core.schedule import Schedule, Where, compile_schedule
from ..core.scores import Score, ScoredPruner
from ..core.state import TokenState


@dataclass(frozen=True)
class TopKConfig:
    keep: float | None = 0.7
    counts: Sequence[int] | None = None
    locs: Sequence[int] = (3, 6, 9)
    where: Where = "attn"
    #: the token score (core/scores.py); None: 'cls' with a class token, else the representation shift
    score: Score | None = None


@register_method("topk")
class TopK(ScoredPruner):
    """x (B, N, C) -> (B, p + count, C), keeping the highest head-mean score (CLS attention by default)."""

    Config = TopKConfig
    zero = {"keep": 1.0, "locs": (1,)}
    example = {"keep": 0.5, "locs": (1, 2)}

    def bind(self, host: Host) -> Schedule:
        self.bind_score(host)
        c = self.cfg
        keep = None if c.counts is not None else c.keep
        return compile_schedule(
            host.num_patches, host.depth, self.name, where=self.where, keep=keep, counts=c.counts,
            locs=c.locs,
        )

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        scores = self.scores_of(info).mean(dim=1)  # (B, N), prefix entries included: keep_top ignores them
        keep, _ = ops.keep_top(scores, count, state.num_prefix)
        return state.gather(x, keep)

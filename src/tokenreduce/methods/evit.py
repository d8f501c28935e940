"""evit: keep the attentive tokens, fuse the inattentive ones into one token.

Paper: "Not All Patches are What You Need: Expediting Vision Transformers via Token
Reorganizations", Liang et al., ICLR 2022, arXiv 2202.07800.
Checked against: github.com/youweiliang/evit (evit.py).

At blocks ``locs`` (official: 3, 6, 9 of 12), after attention + residual and before the MLP:
    a_i = (1/H) sum_h A_h[CLS -> i]                       (head-mean CLS attention, i non-prefix)
    K = ceil(keep * (N - p))                              (N - p counts an earlier fused token)
    x_fused = sum_{j not in topK} a_j x_j                 (raw attention weights, not renormalised)
    output  = [prefix, x_topK (K tokens), x_fused]        (B, p + K + 1, C)
keep=0.7 on DeiT-S: 197 -> 140 -> 100 -> 72 tokens.
``score`` chooses a score that needs no class token instead of a_i (core/scores.py; the default on a
host without one is the representation shift of the attention branch).

Deviations: kept tokens stay in spatial order (the official code orders them by score; the output
is permutation-equivariant, so logits agree up to float rounding). With several prefix tokens
(distillation, registers) all of them are protected and the CLS row is the first token's.
With score='shift' the fusion weights are the shifts normalised to sum to 1 over the tokens (a_i are
probabilities, the shifts are not); 'received' is a distribution over the keys as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from ..core import ops
from ..core.method import AttnInfo, Host, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.scores import Score, ScoredPruner
from ..core.state import TokenState


@dataclass(frozen=True)
class EViTConfig:
    keep: float = 0.7
    locs: Sequence[int] = (3, 6, 9)
    fuse: bool = True
    #: explicit non-prefix counts at ``locs`` (the fused token included) instead of ``keep``
    counts: Sequence[int] | None = None
    #: the token score (core/scores.py); None: 'cls' with a class token, else the representation shift
    score: Score | None = None


@register_method("evit")
class EViT(ScoredPruner):
    """Top-K by CLS attention plus one attention-weighted fused token.

    Scoring MACs: the base class's CLS row; the fused token is a weighted sum (elementwise work,
    not a matrix product, like ToMe's size-weighted merge), so it adds none.
    """

    Config = EViTConfig
    zero = {"keep": 1.0, "locs": (1,)}
    example = {"keep": 0.5, "locs": (1, 2)}

    def __init__(self, cfg: EViTConfig) -> None:
        super().__init__(cfg)
        self.conserves_patches = bool(cfg.fuse)  # the fused token holds every dropped patch; without it they are gone

    def bind(self, host: Host) -> Schedule:
        self.bind_score(host)
        c = self.cfg
        return compile_schedule(
            host.num_patches, host.depth, self.name, where=self.where, keep=None if c.counts is not None else c.keep,
            counts=c.counts, locs=c.locs, extra_token=c.fuse,
        )

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p = state.num_prefix
        attn = self.scores_of(info).mean(dim=1)  # (B, N), prefix entries included: keep_top ignores them
        if self.score == "shift":  # fusion weights as a distribution, like the attention row
            attn = attn / attn.sum(dim=1, keepdim=True).clamp_min(1e-12)
        kept = count - 1 if self.cfg.fuse else count
        keep, drop = ops.keep_top(attn, kept, p, with_drop=self.cfg.fuse)  # positions into the N tokens
        if not self.cfg.fuse:
            return state.gather(x, keep)
        weights = attn.gather(1, drop)  # (B, N - p - kept)
        return state.gather_and_fuse(x, keep, drop, weights)

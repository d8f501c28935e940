"""ctp: EET's content-based token pruning.

Paper: "Rethinking Vision Transformer for Large-Scale Fine-Grained Image Retrieval" (EET), Jiang,
Tang, Pan, Li, arXiv 2504.16691; content-based token pruning (CTP).
Checked against: github.com/WhiteJiang/EET (model/vit.py: Attention.forward, VisionTransformer.forward).

Inside the attention of a scoring block, with A_h = softmax(Q_h K_h^T / sqrt(d)) and the per-head
output O_h = A_h V_h (B, H, N, d_h) before the output projection:
    S[h, i] = ||O_h[i]||_2                            (B, H, N)  content norm of head h at token i
    W[h, i] = S[h, i] / (sum_h' S[h', i] + 1e-8)      normalised across heads, per token
    M[i]    = sum_h W[h, i] * A_h[CLS -> i]           (B, N - p)  importance of patch token i
After the whole block (attention + MLP), the top-k patch tokens by M are kept; the rest are
dropped (not fused). Nothing is learned.
Official schedule (``ctp()``): keep 98, 49, 12 of 196 patch tokens after blocks 3, 7, 9 of 12.
Other grids and depths get the same fractions at the proportional blocks
(counts round(n * 98/196, n * 49/196, n * 12/196), blocks floor(l * depth / 12)).
``score`` replaces A_h[CLS -> i] by a score that needs no class token (core/scores.py): the mean
attention received per head, or the representation shift of the MLP branch (one value for all heads,
so M = shift up to the 1e-8); the default on a host without a class token is the shift.
Budget family: the official schedule with each kept fraction f raised to a power a,
counts round(n * f^a) at the same blocks; a = 1 is ``ctp()``, smaller is milder, larger stronger.

Deviations: none in the score. Only the CLS row of A is computed (from q_cls and K), so the block
keeps the fused attention kernel; this changes nothing numerically. Kept tokens stay in spatial
order (the official code orders them by score; the blocks are permutation-equivariant). With
several prefix tokens (distillation, registers) all are protected and the CLS row is the first's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from ..core import ops
from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, format_spec, register_method, scaled_locs
from ..core.schedule import Schedule, compile_schedule
from ..core.scores import Score, ScoredPruner
from ..core.state import TokenState

OFFICIAL_COUNTS = (98, 49, 12)  # of OFFICIAL_PATCHES patches
OFFICIAL_PATCHES = 196  # DeiT's 14 x 14 grid
OFFICIAL_LOCS = (3, 7, 9)  # of 12 blocks
#: exponents a of the budget family, mildest first (kept fractions f^a)
BUDGET_POWERS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.2, 1.4, 1.7, 2.0)


@dataclass(frozen=True)
class CTPConfig:
    keep: float | None = None
    counts: Sequence[int] | None = None
    locs: Sequence[int] | None = None
    #: the token score in place of the CLS row (core/scores.py); None: 'cls' with a class token, else the shift
    score: Score | None = None


@register_method("ctp")
class CTP(ScoredPruner):
    """Content-weighted CLS-attention pruning after the block: (B, N, C) -> (B, p + count, C)."""

    Config = CTPConfig
    extra_needs = frozenset({"head_norms"})
    zero = {"keep": 1.0, "locs": (0,)}
    example = {"counts": (32, 16), "locs": (1, 2)}
    where = "block"

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """The official schedule with each kept fraction raised to a power (module docstring),
        mildest first; powers that give the same counts are kept once."""
        locs = scaled_locs(OFFICIAL_LOCS, host.depth)
        out, seen = [], set()
        for a in BUDGET_POWERS:
            counts, prev = [], host.num_patches
            for k in OFFICIAL_COUNTS[: len(locs)]:
                prev = min(prev, max(1, round(host.num_patches * (k / OFFICIAL_PATCHES) ** a)))
                counts.append(prev)
            if tuple(counts) not in seen:
                seen.add(tuple(counts))
                out.append(format_spec(cls.name, {"counts": tuple(counts), "locs": locs}))
        return out

    def bind(self, host: Host) -> Schedule:
        self.bind_score(host)
        c = self.cfg
        if c.keep is None and c.counts is None:
            if c.locs is not None:
                raise SpecError("ctp: give counts or keep with locs; ctp() alone is the official schedule")
            locs = scaled_locs(OFFICIAL_LOCS, host.depth)
            counts = [max(1, round(host.num_patches * k / OFFICIAL_PATCHES)) for k in OFFICIAL_COUNTS][: len(locs)]
            return compile_schedule(host.num_patches, host.depth, self.name, where=self.where,
                                    counts=counts, locs=locs)
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where,
                                keep=c.keep, counts=c.counts, locs=c.locs)

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        # the score of every token, prefix included (keep_top ignores those): no slicing
        scores = importance(info.head_norms, self.scores_of(info), 0)  # (B, N)
        keep, _ = ops.keep_top(scores, count, state.num_prefix)
        return state.gather(x, keep)


def importance(head_norms: Tensor, cls_attn: Tensor, num_prefix: int) -> Tensor:
    """CTP's importance M of the patch tokens (module docstring), the one score CTP prunes by
    and EET's DRG masks by: head_norms ||O_h[i]||_2 (B, H, N) and the CLS attention row
    A_h[CLS -> i] (B, H, N) (or another score, (B, H|1, N)), both with the ``num_prefix`` prefix
    tokens first -> M (B, N - p)."""
    if num_prefix:
        head_norms, cls_attn = head_norms[:, :, num_prefix:], cls_attn[:, :, num_prefix:]  # (B, H, N - p)
    weights = head_norms / (head_norms.sum(dim=1, keepdim=True) + 1e-8)  # normalised across heads, per token
    return (weights * cls_attn).sum(dim=1)

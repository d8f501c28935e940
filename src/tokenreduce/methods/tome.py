"""tome: Token Merging, bipartite soft matching in every block.

Paper: "Token Merging: Your ViT but Faster", Bolya et al., ICLR 2023, arXiv 2210.09461.
Reimplemented from the paper (the official code's licence is non-commercial; none of it is used).

In every block, after attention + residual and before the MLP:
    metric = mean_h K_h                          (B, N, d), L2-normalised
    A = even, B = odd non-prefix tokens; each a in A links to argmax_b cos(a, b)
    the r most similar links merge: x_b <- (s_a x_a + s_b x_b) / (s_a + s_b), s_b <- s_a + s_b
    proportional attention: softmax(QK^T / sqrt(d) + log s) in the following blocks
r=13 on DeiT-S: 197 -> 184 -> ... -> 41 tokens, 2.7 G MACs.

Deviations: every prefix token (cls, dist, registers) is protected and the A/B alternation starts
at the first patch (ToMe protects only the class token, which sits in A). r is an int (every
block) or one int per block; ToMe's decaying-r schedule is expressible as that list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from ..core import ops
from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.state import TokenState


@dataclass(frozen=True)
class ToMeConfig:
    r: int | Sequence[int] = 13
    prop_attn: bool = True


@register_method("tome")
class ToMe(Reducer):
    """Merge r token pairs per block: x (B, N, C) -> (B, N - r, C)."""

    Config = ToMeConfig
    needs = frozenset({"keys"})
    zero = {"r": 0}
    example = {"r": 8}

    @property
    def proportional(self) -> bool:
        return bool(self.cfg.prop_attn)

    @property
    def conserves_patches(self) -> bool:
        return True  # merged tokens add their sizes; nothing is dropped

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the matching: cosine similarities of set A (ceil(M/2) tokens) against set B
        (floor(M/2)), one (|A| x d) @ (d x |B|) product, d = head_dim, M = patch tokens."""
        m = tokens_in - host.num_prefix
        return super().scoring_macs(block, tokens_in, count, host) + math.ceil(m / 2) * (m // 2) * (
            host.dim // host.num_heads)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """r = 1, 2, ... removed per block, clipped to half the tokens left (official ToMe's rule),
        written as a per-block list where the clip bites; stops once a single token would be left."""
        out = []
        for r in range(1, host.num_patches):
            rs, n = [], host.num_patches
            for _ in range(host.depth):
                rs.append(min(r, n // 2))  # official ToMe's clip: never more than half the tokens
                n -= rs[-1]
            out.append(format_spec(cls.name, {"r": r if all(x == r for x in rs) else tuple(rs)}))
            if n <= 1:
                break
        return out

    def bind(self, host: Host) -> Schedule:
        # |A| = ceil(n / 2) tokens can merge, but at least one token must stay
        return compile_schedule(
            host.num_patches, host.depth, self.name, where=self.where, r=self.cfg.r,
            max_r=lambda n: min((n + 1) // 2, n - 1),
        )

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        r = x.shape[1] - state.num_prefix - count
        plan = ops.bipartite_soft_matching(info.keys.mean(dim=1), r, state.num_prefix)
        return state.merge(x, plan)

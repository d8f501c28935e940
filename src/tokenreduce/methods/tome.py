"""tome: Token Merging, bipartite soft matching in every block.

Paper: "Token Merging: Your ViT but Faster", Bolya et al., ICLR 2023, arXiv 2210.09461.
Checked against: github.com/facebookresearch/ToMe (tome/merge.py, tome/patch/timm.py), output for
output in float64 (tests/test_tome_official.py); reimplemented, none of its code is used (its
licence is non-commercial).

In every block, after attention + residual and before the MLP, with N tokens (p of them prefix):
    metric = mean_h K_h                          (B, N, d), L2-normalised
    A = positions 0, 2, 4, ...; B = positions 1, 3, 5, ...   (over the whole sequence)
    prefix tokens are protected where they fall: the class token (0) is in A and merges into
    nothing, a distillation token (1) is in B and receives nothing
    each unprotected a in A links to argmax_b cos(a, b); the r most similar links merge:
    x_b <- (s_a x_a + s_b x_b) / (s_a + s_b), s_b <- s_a + s_b
    output: prefix tokens, unmerged A tokens (in sequence order), B tokens   (B, N - r, C)
    proportional attention: softmax(QK^T / sqrt(d) + log s) in the following blocks
r is clipped as the official code clips it: at a block entered with n patch tokens at most
n // 2 are removed ((N - protected) // 2 in the official code's terms), so r=100 on 196 patches
removes 98, 49, 24, ... . r=13 on DeiT-S: 197 -> 184 -> ... -> 41 tokens, 2.7 G MACs.

Deviations:
- every prefix token is protected (cls, dist and register tokens; the official code knows only
  cls and dist), with the prefix tokens first in the output (they lead in every host).
- r is an int (every block) or one int per block (the official list form; its (r, inflection)
  pair is expressible as that list); a list shorter than the depth is an error, not zero-padded.
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
    min_onnx_opset = 16  # the size-weighted merge sums tokens (scatter_add_)
    example = {"r": 8}

    conserves_patches = True  # merged tokens add their sizes; nothing is dropped

    def __init__(self, cfg: ToMeConfig) -> None:
        super().__init__(cfg)
        self.proportional = bool(cfg.prop_attn)

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the matching: cosine similarities of the unprotected A tokens against the unprotected
        B tokens, one (|A| x d) @ (d x |B|) product, d = head_dim; the M = N - p patch tokens split
        into ceil(M/2) and floor(M/2) of them (which set gets the larger half depends on p)."""
        m = tokens_in - host.num_prefix
        return super().scoring_macs(block, tokens_in, count, host) + math.ceil(m / 2) * (m // 2) * (
            host.dim // host.num_heads)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """r = 1, 2, ... removed per block, clipped to half the tokens left (official ToMe's rule,
        ``official_r``), written as a per-block list where the clip bites; stops once a single token
        would be left."""
        out = []
        for r in range(1, host.num_patches):
            rs = official_r(r, host.num_patches, host.depth)
            out.append(format_spec(cls.name, {"r": r if all(x == r for x in rs) else rs}))
            if host.num_patches - sum(rs) <= 1:
                break
        return out

    def bind(self, host: Host) -> Schedule:
        return compile_schedule(
            host.num_patches, host.depth, self.name, where=self.where,
            r=official_r(self.cfg.r, host.num_patches, host.depth), max_r=lambda n: n // 2,
        )

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        r = x.shape[1] - state.num_prefix - count
        plan = ops.bipartite_soft_matching(info.keys.mean(dim=1), r, state.num_prefix)
        return state.merge(x, plan)


def official_r(r: int | Sequence[int], num_patches: int, depth: int) -> int | tuple[int, ...]:
    """Per-block r clipped as the official code clips it: min(r_i, n_i // 2) with n_i the patch
    tokens entering block i. A malformed r is returned as given, for the schedule to reject it
    with its own message."""
    rs = [r] * depth if isinstance(r, int) else list(r)
    if len(rs) != depth or not all(isinstance(x, int) and x >= 0 for x in rs):
        return r
    out, n = [], num_patches
    for ri in rs:
        out.append(min(ri, n // 2))
        n -= out[-1]
    return tuple(out)

"""pitome: PiToMe, token merging steered by an energy score, in every block.

Paper: "Accelerating Transformers with Spectrum-Preserving Token Merging", Tran, Nguyen et al., NeurIPS
2024, arXiv 2405.16148.
Checked against: github.com/hchautran/PiToMe at commit 550b5de (algo/pitome/merge.py: the vision path
with its two pairings and the size-weighted merge; algo/pitome/patch/deit.py and timm.py: the
image-classification patch of timm's ViT), output for output in float64 (tests/test_pitome_official.py);
reimplemented, none of its code is used.

In block i of L, after attention + residual and before the MLP, with T patch tokens entering (the p
prefix tokens take no part):
    metric = mean_h K_h of the patch tokens, L2-normalised        (B, T, d)
    S = metric metric^T                                            (B, T, T) cosine graph, self-loops in
    E_t = mean_j elu(S[t, j] - m_i; alpha)                         (B, T) energy score
        m_i = m - m i / L: the margin falls linearly from m (0.75) at block 0; alpha = 1
        a token in a large cluster of alike tokens has a high energy; an isolated one a low energy
    r_i = floor(T - T keep) tokens merged away (the official ``ratio`` is ``keep``)
    order = the T tokens by decreasing energy
    blocks i < ceil(L / 2): A = order[0::2], B = order[1::2]; each a links to argmax_b S[a, b] and the
        r_i most similar links merge (ToMe's matching on the energy-ordered split)
    blocks i >= ceil(L / 2): the 2 r_i highest-energy tokens are the candidates, A = order[0:2r_i:2],
        B = order[1:2r_i:2], and every a merges into its argmax_b S[a, b]; the T - 2 r_i lowest-energy
        tokens are protected
    merge: x_b <- (s_b x_b + sum_a s_a x_a) / (s_b + sum_a s_a),  s_b <- s_b + sum_a s_a  (sizes s)
    output: prefix, protected or unmerged A tokens, B tokens         (B, N - r_i, C)
No clip beyond the floor: keep=0.925 on DeiT-S's 196 patches leaves 182, 169, 157, ..., 81 after the
12 blocks, 3.0 G MACs (4.6 unreduced); ``keep`` below 0.5 is refused (a later block would need more
candidates than it has tokens).

Deviations:
- every prefix token is protected and left out of the energy (class, distillation and register
  tokens); the official code sets aside only the class token, so it scores and merges a
  distillation token like a patch.
- ``prop_attn=True`` (an option, off by default) adds ToMe's log-size bias to the attention; the
  official image-classification path has no proportional attention: its blocks call the attention
  without the token sizes.
- keys pass through the host's k-norm (qk-norm models) before they are averaged; the official
  attention predates qk-norm.
- a block whose floor gives r = 0 merges nothing and keeps the token order; the official code reorders
  the tokens there (by energy), and in the second half of the blocks stops with an error (a max over
  no candidates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core import ops
from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.state import TokenState

#: the share of the blocks, from the first, that pair the energy order as ToMe does (the official 0.5)
ENERGY_SPLIT_SHARE = 0.5


@dataclass(frozen=True)
class PiToMeConfig:
    """``keep``: the fraction of its patch tokens every block keeps (the official ``ratio``), in [0.5, 1];
    ``margin``: the energy's margin at the first block, falling linearly towards 0 over the depth;
    ``alpha``: the ELU's scale below the margin; ``prop_attn``: add log(size) to the attention logits."""

    keep: float = 0.925
    margin: float = 0.75
    alpha: float = 1.0
    prop_attn: bool = False

    def __post_init__(self) -> None:
        if not 0.5 <= self.keep <= 1.0:
            raise SpecError(f"pitome: keep={self.keep!r} is outside [0.5, 1]; keep is the fraction of the patch "
                            "tokens every block keeps, and below 0.5 a block would need more merge candidates "
                            "than it has tokens")
        if not -1.0 <= self.margin <= 1.0:
            raise SpecError(f"pitome: margin={self.margin!r} is outside [-1, 1]; it is a cosine similarity "
                            "(the official 0.75)")
        if not 0.0 < self.alpha < math.inf:
            raise SpecError(f"pitome: alpha={self.alpha!r} must be a positive number (the ELU's scale, "
                            "the official 1.0)")


@register_method("pitome")
class PiToMe(Reducer):
    """Merge the floor(T (1 - keep)) most redundant tokens per block: x (B, N, C) -> (B, N - r, C)."""

    Config = PiToMeConfig
    needs = frozenset({"keys"})
    zero = {"keep": 1.0}
    example = {"keep": 0.8}  # 64 -> 52 -> 42 -> 34 -> 28 patches: both pairings on a 4-block model
    min_onnx_opset = 16  # the size-weighted merge sums tokens (scatter_add_)

    conserves_patches = True  # merged tokens add their sizes; nothing is dropped

    def __init__(self, cfg: PiToMeConfig) -> None:
        super().__init__(cfg)
        self.proportional = bool(cfg.prop_attn)
        self._margins: tuple[float, ...] = ()
        self._split_blocks = 0

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the cosine graph of the T = N - p patch tokens, one (T x d) @ (d x T) product, d =
        head_dim; the matching reads its scores off that graph."""
        t = tokens_in - host.num_prefix
        return super().scoring_macs(block, tokens_in, count, host) + t * t * (host.dim // host.num_heads)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """keep = 0.995, 0.99, ..., 0.5 in every block, mildest first."""
        return [format_spec(cls.name, {"keep": round(1.0 - 0.005 * i, 3)}) for i in range(1, 101)]

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        # the official margins, m - m * (i / L), computed as it computes them
        self._margins = tuple(c.margin - c.margin * (i / host.depth) for i in range(host.depth))
        self._split_blocks = math.ceil(host.depth * ENERGY_SPLIT_SHARE)
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where,
                                r=official_r(c.keep, host.num_patches, host.depth), max_r=lambda n: n // 2)

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p, block = state.num_prefix, state.block
        r = x.shape[1] - p - count
        sim, energy = energy_score(info.keys.mean(dim=1)[:, p:], self._margins[block], self.cfg.alpha)
        order = energy.argsort(dim=-1, descending=True)  # (B, T) patch indices, highest energy first
        if block < self._split_blocks:  # every token a candidate, the energy order split alternately
            a, b, protected = order[:, 0::2], order[:, 1::2], order[:, :0]
        else:  # the 2r highest-energy tokens are the candidates, the rest protected
            a, b, protected = order[:, 0:2 * r:2], order[:, 1:2 * r:2], order[:, 2 * r:]
        T = sim.shape[-1]
        scores = sim.gather(1, a[..., None].expand(-1, -1, T)).gather(2, b[:, None, :].expand(-1, a.shape[1], -1))
        prefix = ops.positions(0, p, 1, x.device).expand(x.shape[0], p)
        plan = ops.set_matching(scores, a + p, b + p, r, torch.cat([prefix, protected + p], dim=1))
        return state.merge(x, plan)


def energy_score(metric: Tensor, margin: float, alpha: float) -> tuple[Tensor, Tensor]:
    """PiToMe's energy (arXiv 2405.16148, Eq. 4, as its official code computes it) of T tokens.

    Args:
        metric: (B, T, d) token features (the keys averaged over heads).
        margin: m; similarities above it count fully, those below decay as alpha (exp(s - m) - 1).
        alpha: the ELU's scale below the margin.
    Returns:
        S (B, T, T), the cosine similarities (self-loops included), and E (B, T),
        E_t = mean_j elu(S[t, j] - m; alpha).
    """
    unit = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-12)  # F.normalize's values
    sim = torch.bmm(unit, unit.transpose(1, 2))  # (B, T, T)
    return sim, F.elu(sim - margin, alpha).mean(dim=-1)


def official_r(keep: float, num_patches: int, depth: int) -> tuple[int, ...]:
    """Tokens merged away in each block, floor(T - T keep) of the T patch tokens entering it, in the
    official code's float arithmetic (so that every count equals its count)."""
    out, n = [], num_patches
    for _ in range(depth):
        out.append(math.floor(n - n * keep))
        n -= out[-1]
    return tuple(out)

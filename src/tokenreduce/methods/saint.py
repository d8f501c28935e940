"""saint: SAINT, similarity-aware token dropping by a graph of key similarity.

Paper: "Similarity-Aware Token Pruning: Your VLM but Faster", Jeddi, Baghbanzadeh, Dolatabadi, Taati,
arXiv 2503.11549.
Checked against: github.com/ArmenJeddi/saint at commit baaff95 (ViT/saint/prune.py: ``saint_drop``;
ViT/saint/patch/timm.py: the timm block and attention; ViT/example_timm.py: the schedule it runs), output
for output in float64 on timm's and transformers' ViT (tests/test_saint_official.py); reimplemented, none
of its code is used.

In an acting block, after attention + residual and before the MLP, with T patch tokens entering (the p
prefix tokens take no part):
    metric = mean_h K_h of the patch tokens, L2-normalised        (B, T, d)
    A = patches 0, 2, 4, ...; B = patches 1, 3, 5, ...            (ceil(T/2) and floor(T/2) of them)
    S = metric_A metric_B^T                                        (B, |A|, |B|) bipartite cosine graph
    edges of a: E_a = {b : S[a, b] >= tau}, n_a = |E_a|            tau = ``threshold`` (official 0.75)
    score_a = n_a exp(gamma (mean_{b in E_a} S[a, b] - tau))       if n_a > 0   (gamma official 10)
            = mean_b S[a, b]                                       if n_a = 0
    the r highest-scoring A tokens are dropped (not merged)
    output: prefix, the kept A tokens by decreasing score, the B tokens   (B, N - r, C)
        (the order matters: the next acting block splits A and B by position again)
The score ranks an A token by how many B tokens it nearly duplicates and how closely: a redundant token
goes first (equal scores in the order the sort kernel gives them, as in the official code). Nothing is
learned; no proportional attention (nothing is merged, so there are no sizes).
Budget family: r = 1, 2, ... in each block of the official placement (the first half), clipped to the A
tokens a block has.

How many are dropped (``count``):
- ``count='fixed'`` (the default): r per block is given (``r``: an int for every block, or one per block;
  by default ``tome()``'s r (13) in every block, so that ``saint()`` and ``tome()`` remove the same number
  of tokens per block), a static schedule: every image of a batch drops the same count whatever the others
  are, and the forward compiles (fullgraph) and exports to ONNX. A count calibrated on held-out images is
  the official rule run once on them as one batch (``r_from_tokens`` turns its token counts into ``r``).
- ``count='batch'`` (the official rule): r = int(mean over the batch of #{a : n_a >= K}), the batch mean of
  the per-image counts of A tokens with at least K (official 5) edges, truncated; r = 0 drops nothing. The
  count is read to the host (``.item()``: a device synchronisation in every acting block), and an image's
  output depends on the other images of its batch. It acts at ``locs`` (default the first half of the
  blocks, the official example's ``['drop'] * (depth // 2)``). Its compiled schedule is only a bound (half
  the patch tokens dropped in every acting block); the real counts of a forward are in
  ``get_info(model).tokens_per_block``. Declared ``dynamic_schedule``: no fullgraph compile, no export.

Deviations:
- every prefix token is protected (class, distillation and register tokens); the official code knows the
  class and distillation tokens only.
- one ``threshold`` for every acting block; the official patch takes one per block (its example gives one).
  The official patch stores its K and gamma but calls the drop with the defaults (5 and 10): here ``K`` and
  ``gamma`` are used as given, and their defaults are those the official code runs.
- keys pass through the host's k-norm (qk-norm models) before they are averaged; the official attention
  predates qk-norm.
- the batch-independent ``count='fixed'`` mode is ours (the default); ``count='batch'`` is the official rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..core import ops
from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, check_locs, compile_schedule
from ..core.state import TokenState
from .tome import ToMeConfig

Count = Literal["fixed", "batch"]
#: the share of the blocks, from the first, where the official example drops (``len(blocks) // 2``)
OFFICIAL_SHARE = 0.5
#: r of ``count='fixed'`` when none is given: tome()'s default, so that saint() and tome() drop and merge the
#: same number of tokens in every block (dropping against merging at equal token counts) where neither clips it
DEFAULT_R: int = ToMeConfig.r


@dataclass(frozen=True)
class SaintConfig:
    """``r``: A tokens dropped per block with ``count='fixed'`` (an int for every block, or one per block;
    None: ``DEFAULT_R`` in every block);
    ``threshold``: tau, the cosine similarity an edge needs; ``K``: the edges an A token needs to count
    towards the official batch count (``count='batch'`` only); ``gamma``: the score's sharpness; ``count``:
    'fixed' (r given, batch-independent) or 'batch' (the official batch-mean count, host-syncing);
    ``locs``: the blocks where ``count='batch'`` acts (default the first half)."""

    r: int | Sequence[int] | None = None
    threshold: float = 0.75
    K: int = 5
    gamma: float = 10.0
    count: Count = "fixed"
    locs: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise SpecError(f"saint: threshold={self.threshold!r} is outside [-1, 1]; it is a cosine similarity "
                            "(the official 0.75)")
        if self.K < 0:
            raise SpecError(f"saint: K={self.K!r} must be a non-negative int (the official 5)")
        if not 0.0 <= self.gamma < math.inf:
            raise SpecError(f"saint: gamma={self.gamma!r} must be a non-negative number (the official 10.0)")
        if self.count == "fixed" and self.locs is not None:
            raise SpecError("saint: locs is for count='batch'; with count='fixed' give r as one int per block")
        if self.count == "batch" and self.r is not None:
            raise SpecError("saint: count='batch' derives r from each batch; give r with count='fixed' only")


@register_method("saint")
class Saint(Reducer):
    """Drop the r most redundant A tokens per block: x (B, N, C) -> (B, N - r, C)."""

    Config = SaintConfig
    needs = frozenset({"keys"})
    zero = {"r": 0}
    example = {"r": 6}  # 64 -> 58 -> 52 -> 46 -> 40 patches on a 4-block model

    def __init__(self, cfg: SaintConfig) -> None:
        super().__init__(cfg)
        if cfg.count == "batch":  # the count follows the batch: read to the host, no static shapes
            self.dynamic_schedule = True
            self.exportable = False

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the bipartite cosine graph: the ceil(T/2) A tokens against the floor(T/2) B tokens of the
        T = N - p patch tokens, one (|A| x d) @ (d x |B|) product, d = head_dim."""
        t = tokens_in - host.num_prefix
        return super().scoring_macs(block, tokens_in, count, host) + math.ceil(t / 2) * (t // 2) * (
            host.dim // host.num_heads)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """r = 1, 2, ... dropped in each block of the official placement (the first half), clipped to the A
        tokens left (``max_drop``), as a per-block list; stops once the clip bites in every such block."""
        acting = official_blocks(host.depth)
        out, last = [], None
        for r in range(1, host.num_patches) if acting else ():
            rs, n = [], host.num_patches
            for block in range(host.depth):
                rs.append(min(r, max_drop(n)) if block in acting else 0)
                n -= rs[-1]
            if rs == last:  # every acting block is clipped: a larger r drops no more
                break
            last = rs
            out.append(format_spec(cls.name, {"r": tuple(rs)}))
        return out

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        if c.count == "fixed":
            r = DEFAULT_R if c.r is None else c.r
            return compile_schedule(host.num_patches, host.depth, self.name, where=self.where, r=r, max_r=max_drop)
        locs = official_blocks(host.depth) if c.locs is None else check_locs(c.locs, host.depth, self.name)
        rs, n = [], host.num_patches
        for block in range(host.depth):  # the bound: as many A tokens as can go, in every acting block
            rs.append(max_drop(n) if block in locs else 0)
            n -= rs[-1]
        return compile_schedule(host.num_patches, host.depth, self.name, where=self.where, r=rs, max_r=max_drop)

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p, c = state.num_prefix, self.cfg
        score, degree = saint_score(info.keys.mean(dim=1)[:, p:], c.threshold, c.gamma)  # (B, |A|) each
        t = x.shape[1] - p
        if c.count == "batch":  # the official count: a host sync, and the batch decides it
            r = int((degree >= c.K).sum(dim=-1).float().mean().item())
            if r <= 0:
                return x
            count = t - r
        order = score.argsort(dim=-1, descending=True)  # (B, |A|) most redundant first, the official sort
        n_a, n_b, batch = score.shape[1], t // 2, x.shape[0]
        a_pos = ops.positions(p, n_a, 2, x.device)  # (|A|,) sequence positions p, p + 2, ...
        parts = [a_pos[order[:, t - count:]], ops.positions(p + 1, n_b, 2, x.device).expand(batch, n_b)]
        if p:
            parts.insert(0, ops.positions(0, p, 1, x.device).expand(batch, p))
        return state.gather(x, torch.cat(parts, dim=1))  # (B, p + count, C): prefix, kept A, B

def saint_score(metric: Tensor, threshold: float, gamma: float) -> tuple[Tensor, Tensor]:
    """SAINT's redundancy score of the A tokens (module docstring), as the official code computes it.

    Args:
        metric: (B, T, d) the patch tokens' keys averaged over heads; A = even, B = odd positions.
        threshold: tau, the similarity an edge needs.
        gamma: the score's sharpness.
    Returns:
        score (B, ceil(T/2)), higher = more redundant, and the degree n_a (B, ceil(T/2)) of each A token
        (the A tokens with at least K edges are the per-image count whose batch mean is the official r).
    """
    unit = metric / metric.norm(dim=-1, keepdim=True)
    a, b = unit[:, ::2], unit[:, 1::2]
    sim = torch.bmm(a, b.transpose(1, 2))  # (B, |A|, |B|); matmul's kernel without its views
    edge = sim >= threshold
    degree = edge.sum(dim=-1)  # (B, |A|)
    mean_edge = (sim * edge).sum(dim=-1) / degree.clamp(min=1)
    linked = degree * torch.exp(gamma * (mean_edge - threshold))
    isolated = sim.sum(dim=-1) / sim.shape[-1]
    return torch.where(degree > 0, linked, isolated), degree


def max_drop(tokens: int) -> int:
    """The most a block entered with ``tokens`` patch tokens can drop: its A tokens, ceil(tokens / 2),
    leaving at least one token."""
    return min((tokens + 1) // 2, tokens - 1)


def official_blocks(depth: int) -> tuple[int, ...]:
    """The blocks the official example drops in: the first ``depth // 2``."""
    return tuple(range(int(depth * OFFICIAL_SHARE)))


def r_from_tokens(tokens_per_block: Sequence[int], num_prefix: int, num_patches: int) -> tuple[int, ...]:
    """``r`` (one per block) of a schedule that leaves ``tokens_per_block`` tokens (prefix included) after
    each block: the counts a ``count='batch'`` forward on held-out images recorded (``get_info``), turned
    into the batch-independent ``saint(r=...)``."""
    out, n = [], num_patches
    for tokens in tokens_per_block:
        out.append(n - (tokens - num_prefix))
        n -= out[-1]
    return tuple(out)


"""imagepiece: merge the inattentive tokens with their similar neighbours, re-score, prune the rest.

Paper: "ImagePiece: Content-aware Re-tokenization for Efficient Image Recognition", Yoa et al.,
AAAI 2025, arXiv 2412.16491. No official code: every choice the paper does not publish is a spec
parameter, listed under "Deviations / decisions" below.

One iteration per block l in ``locs`` (after attention + residual, before the MLP, like EViT),
on the M non-prefix tokens x (B, M, C) with head-mean CLS attention a (B, M):
    (I)   score:  a_i = (1/H) sum_h A_h[CLS -> i]
    (II)  re-tokenize: the S = round(bottom * M) tokens with the lowest a (inattentive), in their
          spatial order (``order``), alternate into sets A and B; each A token links to its most similar B token
          (cosine of the head-mean keys) and the r = round(merge * M) most similar links merge,
          A into B, by the size-weighted mean  x_b <- (s_a x_a + s_b x_b) / (s_a + s_b),
          s_b <- s_a + s_b  (core.ops.subset_matching; tokens outside the S are never touched, so
          attentive tokens are never merged). Proportional attention (log s added to the attention
          logits) in every later block.
    (III) re-score and prune: at block l + 1 (``rescore='next'``, the paper's Table 5) with that
          block's fresh CLS attention, or at block l itself (``rescore='same'``, a merged token then
          scoring the sum of its members' attention), keep the ceil(keep * M') highest-scoring of
          the M' tokens (EViT's keep rule) and drop the rest.
``score`` replaces a by a score that needs no class token (core/scores.py; the default on a model
without one is the representation shift of the attention branch).
When l + 1 is itself in ``locs`` (``rescore='next'``), block l + 1 first prunes (III of iteration l),
then re-tokenizes the survivors (II of iteration l + 1) with the same attention.
Counts are exact at bind: on DeiT-S (196 patches) the defaults give 196 -> 180 (block 2) -> 144
(block 3) -> 132 (block 5) -> 106 (block 6) -> 98 (block 8) -> 79 (block 9), near EViT's
keep=0.7 operating point (the paper's +54% throughput claim).

Hyper-speed regime (the paper: 2.51x, about 13% of the tokens left at the end): an iteration at
every block from block 1, the default rates: ``imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))`` leaves 24
of DeiT-S's 196 tokens (12%; 2.44x fewer MACs, the default 1.50x). On the Fashion-MNIST reference
(49 patches, 6 blocks) ``imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)`` leaves 7 of 49 (14%)
(the ``imagepiece`` study, studies/imagepiece.py, with EViT and ToMe at the same MACs).

Deviations / decisions (unpublished; each one a parameter):
- ``locs=(2, 5, 8)``: blocks where inattentive tokens are merged; the pruning follows at 3, 6, 9,
  EViT's pruning blocks (the paper says only "repeated across layers from early layers on").
- ``bottom=0.3``: the inattentive share, S = round(bottom * M), rounding half up.
- ``merge=0.08``: the similarity merging ratio, read as the share of the M tokens merged away per
  iteration, r = round(merge * M) (must fit the inattentive set: r <= ceil(S / 2)).
- ``keep=0.8``: the pruning keep rate over all tokens at the re-scoring (EViT-style: every token
  is a candidate, not only the merged ones: a token that was attentive at the merge but is not
  any more is dropped too). Dropped tokens are discarded, not fused into an extra token.
- ``rescore='next'``: re-score at the next block (Table 5's best); 'same' re-scores at once with
  the merged tokens' summed attention (no extra attention is computed).
- Similarity metric: cosine of the head-mean keys, as ToMe (the paper: "bipartite soft matching").
- ``prop_attn=True``: proportional attention for the merged tokens, as ToMe.
- ``order='spatial'``: the inattentive tokens alternate into A and B in raster order (the paper says
  only "alternately").
- Every prefix token (cls, dist, registers) is protected and never scored.

Options (ablations of the decisions above; ``prop_attn=False`` is the proportional-attention one):
- ``order``, the sequence the inattentive tokens alternate over when they split into A and B, so
  which tokens can pair: 'spatial' (raster order, the default), 'score' (ascending CLS attention,
  the least attended in A: tokens of neighbouring attention land in opposite sets) or 'random' (a
  random permutation of the raster order, drawn from ``seed`` per block and set size, the same for
  every image and every call). Only the pairing changes; the counts and the cost do not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from ..core import ops
from ..core.errors import SpecError
from ..core.method import BUDGET_KEEPS, AttnInfo, Host, format_spec, register_method, scaled_locs
from ..core.schedule import Schedule, check_keep, check_locs, from_counts
from ..core.scores import Score, ScoredPruner
from ..core.state import TokenState

Rescore = Literal["next", "same"]
RESCORE: tuple[str, ...] = get_args(Rescore)
Order = Literal["spatial", "score", "random"]
ORDERS: tuple[str, ...] = get_args(Order)


@dataclass(frozen=True)
class ImagePieceConfig:
    locs: Sequence[int] = (2, 5, 8)
    bottom: float = 0.3
    merge: float = 0.08
    keep: float = 0.8
    rescore: Rescore = "next"
    prop_attn: bool = True
    order: Order = "spatial"
    seed: int = 0
    #: the token score in place of the CLS row (core/scores.py); None: 'cls' with a class token, else the shift
    score: Score | None = None


def _share(f: float, m: int) -> int:
    """round(f * m), halves rounded up (no banker's rounding)."""
    return math.floor(f * m + 0.5)


@register_method("imagepiece")
class ImagePiece(ScoredPruner):
    """Merge inside the inattentive set, re-score, prune: x (B, N, C) -> (B, p + count, C)."""

    Config = ImagePieceConfig
    extra_needs = frozenset({"keys"})
    min_onnx_opset = 16  # its merges sum tokens (scatter_add_)
    classic_onnx = False  # the merge plan orders the survivors with a stable sort
    zero = {"locs": (1,), "merge": 0.0, "keep": 1.0}
    example = {"locs": (0, 1), "merge": 0.1, "keep": 0.7}

    def __init__(self, cfg: ImagePieceConfig) -> None:
        super().__init__(cfg)
        self._merge_at: frozenset[int] = frozenset()
        self._prune_at: frozenset[int] = frozenset()
        self._perms: dict[tuple[int, int], Tensor] = {}  # order='random': (block, S) -> permutation (S,)
        self.proportional = bool(cfg.prop_attn)
        self.conserves_patches = cfg.keep >= 1.0  # merging only: the pruning drops tokens otherwise

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """The pruning keep rate 0.95, 0.90, ..., 0.20 (mildest first), merging at blocks (2, 5, 8) of
        12 moved to the host's depth, the other parameters at their defaults."""
        locs = scaled_locs((2, 5, 8), host.depth)
        return [format_spec(cls.name, {"locs": locs, "keep": k}) for k in BUDGET_KEEPS]

    # ----- schedule ---------------------------------------------------------------------------------

    def _check(self, host: Host) -> tuple[int, ...]:
        c = self.cfg
        check_keep(c.keep, self.name)
        if not isinstance(c.bottom, (int, float)) or not 0.0 < c.bottom <= 1.0:
            raise SpecError(f"{self.name}: bottom={c.bottom!r} is outside (0, 1]; it is the share of tokens "
                            "counted as inattentive")
        if not isinstance(c.merge, (int, float)) or not 0.0 <= c.merge < 1.0:
            raise SpecError(f"{self.name}: merge={c.merge!r} is outside [0, 1); it is the share of tokens "
                            "merged away per iteration")
        if c.rescore not in RESCORE:
            raise SpecError(f"{self.name}: rescore={c.rescore!r} is invalid; choose 'next' (re-score at the "
                            "next block) or 'same' (at the merging block)")
        if c.order not in ORDERS:
            raise SpecError(f"{self.name}: order={c.order!r} is invalid; choose from {', '.join(map(repr, ORDERS))}")
        locs = check_locs(c.locs, host.depth, self.name)
        if c.rescore == "next" and locs and locs[-1] + 1 >= host.depth:
            raise SpecError(f"{self.name}: rescore='next' prunes at the block after each loc, but block "
                            f"{locs[-1]} is the last of {host.depth}; use locs up to {host.depth - 2} or "
                            "rescore='same'")
        return locs

    def _rule(self, block: int, m: int) -> tuple[int, int]:
        """(tokens pruned, tokens merged away) at ``block`` when ``m`` non-prefix tokens reach it."""
        c = self.cfg
        prune = block in self._prune_at
        k = r = 0
        if prune and c.rescore == "next":  # III of the previous iteration comes first
            k = m - math.ceil(c.keep * m)
        if block in self._merge_at:
            left = m - k
            r = _share(c.merge, left)
            s = _share(c.bottom, left)
            limit = (s + 1) // 2 if s >= 2 else 0
            if r > limit:
                raise SpecError(
                    f"{self.name}: block {block} would merge {r} of {left} tokens inside an inattentive set of "
                    f"{s}, at most {limit} (one per A token); lower merge or raise bottom")
        if prune and c.rescore == "same":
            k = (m - r) - math.ceil(c.keep * (m - r))
        return k, r

    def bind(self, host: Host) -> Schedule:
        self.bind_score(host)
        locs = self._check(host)
        self._merge_at = frozenset(locs)
        self._prune_at = frozenset(b + 1 for b in locs) if self.cfg.rescore == "next" else frozenset(locs)
        blocks = sorted(self._merge_at | self._prune_at)
        counts, cur = [], host.num_patches
        for b in blocks:
            k, r = self._rule(b, cur)
            cur -= k + r
            if cur < 1:
                raise SpecError(f"{self.name}: no token would be left at block {b}; raise keep or lower merge")
            counts.append(cur)
        return from_counts(host.num_patches, host.depth, counts, blocks, self.where, self.name)

    def compose_step(self, block: int, entering: int, aside: int, alone: Schedule) -> tuple[int, int]:
        """Its own rule on the tokens that reach it; only the pruned ones are kept aside."""
        k, r = self._rule(block, entering)
        return entering - k - r, aside + k

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the matching inside the inattentive set: (ceil(S/2) x d) @ (d x floor(S/2)) with
        d = head_dim, where tokens are merged at ``block``."""
        m = tokens_in - host.num_prefix
        k, r = self._rule(block, m)
        macs = super().scoring_macs(block, tokens_in, count, host)
        if r:
            s = _share(self.cfg.bottom, m - (k if self.cfg.rescore == "next" else 0))
            macs += ((s + 1) // 2) * (s // 2) * (host.dim // host.num_heads)
        return macs

    # ----- forward ------------------------------------------------------------------------------------

    def _arrange(self, lowest: Tensor, block: int, ascending: bool = True) -> Tensor:
        """The inattentive positions ``lowest`` (B, S), by CLS attention (least attended first if
        ``ascending``, else most), in the sequence that alternates into A and B (``order``)."""
        order = self.cfg.order
        if order == "score":
            return lowest if ascending else lowest.flip(1)
        spatial = lowest.sort(dim=1).values  # (B, S)
        if order == "spatial":
            return spatial
        S = spatial.shape[1]
        perm = self._perms.get((block, S))
        if perm is None or perm.device != spatial.device:
            gen = torch.Generator().manual_seed(((int(self.cfg.seed) * 1_000_003 + block) * 1_000_003 + S) % 2**63)
            perm = self._perms[(block, S)] = torch.randperm(S, generator=gen).to(spatial.device)
        return spatial[:, perm]

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p = state.num_prefix
        m = x.shape[1] - p
        k, r = self._rule(state.block, m)
        same = self.cfg.rescore == "same"
        scores = self.scores_of(info).mean(dim=1)  # (B, N); the prefix entries are never read
        if not r:  # III alone: prune the k lowest-scoring tokens
            return x if not k else state.gather(x, ops.keep_top(scores, m - k, p)[0])
        # the prefix scores +inf: never inattentive, always kept; positions then index x directly
        key = scores.index_fill(1, ops.positions(0, p, 1, x.device), math.inf) if p else scores
        survivors = None
        if k and not same:  # III of the previous iteration, then II on the survivors: one plan does both
            left = m - k
            order = key.argsort(dim=1, descending=True)  # (B, N)
            survivors = order[:, :p + left]  # (B, p + left) the kept tokens, any order
            # the S lowest-scoring survivors, most attended first
            subset = self._arrange(order[:, p + left - _share(self.cfg.bottom, left):p + left], state.block, False)
        else:  # the S lowest-scoring tokens, least attended first
            subset = self._arrange(key.topk(_share(self.cfg.bottom, m), dim=1, largest=False).indices, state.block)
        plan = ops.subset_matching(info.keys.mean(dim=1), subset, r, survivors)  # keys (B, H, N, d) -> (B, N, d)
        x = state.merge(x, plan)
        if k and same:  # a merged token scores the attention its members drew
            x = state.gather(x, ops.keep_top(plan.sum(scores), m - r - k, p)[0])
        return x

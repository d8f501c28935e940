"""Token scores a pruner ranks by, chosen with its ``score`` option: one vocabulary for every pruner.

    'cls'       a_i = A[CLS -> i], the class token's attention row (B, H, N): the published score of
                attention-based pruning; needs a class token.
    'shift'     s_i = ||F(x)_i - x_i||_2, the representation shift of the residual branch run just before
                the reduction (B, 1, N): the attention branch at a pruner's 'attn' point, the MLP branch
                at its 'block' point. No attention map: the attention keeps its fused kernel, and it is
                free (a norm of what the block computes anyway).
    'received'  r_i = (1/N) sum_j A[j -> i], the mean attention token i receives (B, H, N), computed in
                query chunks (core.attention.received_attention), never an (N, N) tensor; costs the
                Q K^T products again, N^2 A MACs per block where it scores. It is the full attention's,
                with the log-size bias, even where a chunked stage restricts the block's own keys.

Representation shift: "Representation Shift: Unifying Token Compression with FlashAttention", Choi,
Lee, Ko, Kim, Kil, Kim, ICCV 2025, arXiv 2508.00367 (github.com/mlvlab/Representation-Shift). The paper
defines the shift of a token through a layer F as D(F(x), x) with D the L2 distance, and prefers the
MLP layer; with the residual F(x) = x + branch(x), that is ||branch(x)||_2.

Deviations (shift): the branch is the one run before the pruner's point (MLP at 'block', which is the
paper's choice; attention at 'attn', where the block's MLP has not run yet), not a separate option; the
shift is always taken in the block where the pruner acts (its ``locs``), not at a separately chosen layer.
With several heads the shift has one value per token (B, 1, N): a head mean or a head-weighted sum of it
(CTP) is the shift itself.

Defaults: ``score=None`` is 'cls' on a host with a class token and :data:`CLASS_TOKEN_FREE` on one
without; a pruner bound to a host without one names the score it chose in its spec
(``get_info(model).spec``, ``inspect``, a checkpoint's record: e.g. ``topk(..., score='shift')``).
An explicit 'cls' on a host without a class token is refused at ``apply``, naming the scores that
need none.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from torch import Tensor

from .method import AttnInfo, Host, Reducer
from .registry import format_spec

#: The scores of the vocabulary (module docstring), as a spec's ``score`` parameter is typed.
Score = Literal["cls", "shift", "received"]
#: score -> the attention side products (``core.method.NEEDS``) it reads.
SCORE_NEEDS: dict[str, frozenset[str]] = {
    "cls": frozenset({"cls_attn"}), "shift": frozenset({"shift"}), "received": frozenset({"received"}),
}
#: The score of ``score=None`` on a host without a class token: free, and the attention stays fused.
CLASS_TOKEN_FREE = "shift"


def resolve_score(score: str | None, host: Host) -> str:
    """The score a pruner uses on ``host``: the one given, else 'cls' with a class token and
    :data:`CLASS_TOKEN_FREE` without."""
    if score is not None:
        return score
    return "cls" if host.has_class_token else CLASS_TOKEN_FREE


def token_scores(info: AttnInfo, score: str) -> Tensor:
    """The ``score`` of every token, prefix included, per head where it has heads: (B, H, N) for 'cls'
    and 'received', (B, 1, N) for 'shift' (a mean or a head-weighted sum over dim 1 gives it back)."""
    if score == "cls":
        return info.cls_attn
    if score == "received":
        return info.received
    return info.shift[:, None]


class ScoredPruner(Reducer):
    """A pruner whose config has ``score: Score | None`` (module docstring): it needs the side products of
    its score plus its own (``extra_needs``), needs a class token only for an explicit 'cls', and binds the
    default score to the host (:meth:`bind_score`, called first by the subclass's ``bind``)."""

    #: side products the method reads besides its score (CTP's head norms)
    extra_needs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.needs_class_token = cfg.score == "cls"
        self.score = cfg.score or "cls"  # until bound: what a host with a class token gets
        self.needs = SCORE_NEEDS[self.score] | self.extra_needs

    def bind_score(self, host: Host) -> None:
        """Choose the score for ``host`` (:func:`resolve_score`) and what it needs."""
        self.score = resolve_score(self.cfg.score, host)
        self.needs = SCORE_NEEDS[self.score] | self.extra_needs

    def spec(self) -> str:
        """The canonical spec, every field spelled out but a default ``score`` that chose 'cls' (so the spec
        of a class-token model is what it was before scores could be chosen, as records hold it); where the
        default chose another score (the host has no class token) it is named: the spec says what runs,
        and rebuilds it on any host."""
        params = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(self.cfg)}
        if self.cfg.score is None and self.score == "cls":
            del params["score"]
        elif self.cfg.score is None:
            params["score"] = self.score
        return format_spec(self.name, params)

    def class_token_substitute(self) -> str | None:
        return " or ".join(f"score='{s}'" for s in SCORE_NEEDS if s != "cls")

    def scores_of(self, info: AttnInfo) -> Tensor:
        """(B, H|1, N): :func:`token_scores` of the bound score."""
        return token_scores(info, self.score)

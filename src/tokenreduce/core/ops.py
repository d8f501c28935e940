"""Shared tensor primitives, written once: gather by index, top-k keep, bipartite soft matching,
size-weighted merge, CLS-row attention. Shapes: B batch, N tokens, C channels, H heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def gather_tokens(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, N, ...) gathered along dim 1 at idx (B, K) -> (B, K, ...)."""
    view = idx.reshape(*idx.shape, *([1] * (x.dim() - 2)))
    return x.gather(1, view.expand(*idx.shape, *x.shape[2:]))


def complement_index(idx: Tensor, n: int) -> Tensor:
    """Positions in [0, n) not in idx (B, K), ascending, (B, n - K)."""
    mask = torch.ones(idx.shape[0], n, dtype=torch.bool, device=idx.device)
    mask.scatter_(1, idx, False)
    return mask.nonzero()[:, 1].reshape(idx.shape[0], n - idx.shape[1])


def keep_topk(scores: Tensor, k: int, num_prefix: int, with_drop: bool = False) -> tuple[Tensor, Tensor | None]:
    """Indices of the prefix tokens plus the k highest-scoring non-prefix tokens.

    Args:
        scores: (B, M) scores of the M non-prefix tokens.
        k: how many non-prefix tokens to keep.
        num_prefix: prefix tokens in front of them, always kept first.
        with_drop: also return the dropped positions.
    Returns:
        keep (B, num_prefix + k) and drop (B, M - k) or None: positions into the full sequence;
        kept tokens stay in their original order (spatial order for patches), dropped ones too.
    """
    B, M = scores.shape
    prefix = torch.arange(num_prefix, device=scores.device).expand(B, num_prefix)
    drop = None
    if with_drop:  # one full sort, so keep and drop partition the tokens even under ties
        order = scores.argsort(dim=1, descending=True)
        top, drop = order[:, :k], order[:, k:].sort(dim=1).values + num_prefix
    else:
        top = scores.topk(k, dim=1, sorted=False).indices
    top = top.sort(dim=1).values + num_prefix
    return torch.cat([prefix, top], 1), drop


def cls_attention(q: Tensor, k: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """Attention row of the class token: softmax(q_cls k^T * scale + bias), (B, H, N).

    Computed from q (B, H, N, d) and k (B, H, N, d) alone, so that the block itself keeps the
    fused SDPA kernel; costs one (1 x N) row per head instead of the N x N matrix.
    """
    logits = (q[:, :, :1] * scale) @ k.transpose(-2, -1)  # (B, H, 1, N)
    if bias is not None:
        logits = logits + bias
    return logits.softmax(dim=-1)[:, :, 0]


@dataclass(frozen=True)
class MergePlan:
    """Bipartite merge of the non-prefix tokens: set A (even), set B (odd).

    ``src`` (B, r) rows of A merged into ``dst`` (B, r) rows of B; ``unm`` (B, |A| - r) rows of A
    kept (in similarity order, as in ToMe). Output order: prefix, unmerged A, B.
    """

    num_prefix: int
    unm: Tensor
    src: Tensor
    dst: Tensor

    def apply(self, x: Tensor, mode: str) -> Tensor:
        """x (B, N, C) -> (B, N - r, C). ``mode`` 'sum' adds sources into destinations,
        'first' leaves destinations unchanged (used for the index map)."""
        p = self.num_prefix
        prefix, a, b = x[:, :p], x[:, p::2], x[:, p + 1 :: 2]
        unm = gather_tokens(a, self.unm)
        if mode == "sum" and self.src.shape[1] > 0:
            src = gather_tokens(a, self.src)
            view = self.dst.reshape(*self.dst.shape, *([1] * (x.dim() - 2)))
            b = b.scatter_reduce(1, view.expand_as(src), src, reduce="sum")
        return torch.cat([prefix, unm, b], 1)


def bipartite_soft_matching(metric: Tensor, r: int, num_prefix: int) -> MergePlan:
    """ToMe's bipartite soft matching (Bolya et al., arXiv 2210.09461, Sec. 3).

    Non-prefix tokens alternate into A (even) and B (odd); each A token is linked to its most
    cosine-similar B token and the r most similar links are merged. Prefix tokens take no part.

    Args:
        metric: (B, N, d) similarity features (ToMe: keys averaged over heads).
        r: tokens to remove, at most |A| = ceil((N - num_prefix) / 2).
    """
    metric = metric[:, num_prefix:]
    metric = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    a, b = metric[:, ::2], metric[:, 1::2]
    scores = a @ b.transpose(-2, -1)  # (B, |A|, |B|)
    best, best_idx = scores.max(dim=-1)  # (B, |A|)
    order = best.argsort(dim=-1, descending=True)
    src = order[:, :r]
    dst = best_idx.gather(1, src)
    return MergePlan(num_prefix, order[:, r:], src, dst)


def policy_softmax(logits: Tensor, policy: Tensor, eps: float = 1e-6) -> Tensor:
    """Attention under a soft keep policy (attention masking of DynamicViT, arXiv 2106.02034).

        A_ij = exp(s_ij) G_ij / sum_k exp(s_ik) G_ik,   G_ij = policy_j (j != i),  G_ii = 1

    The policy multiplies probabilities rather than adding log(policy) to the logits, so the
    gradient reaches policy_j even where it is 0 (a log-mask would give 0 * inf there). A token
    always attends to itself, so no row is empty. As in the official code, the row is shifted by
    its max and computed in float32, and eps keeps it finite when every kept logit underflows:
    A_ij = (exp(s_ij - m_i) G_ij + eps / N) / (sum_k exp(s_ik - m_i) G_ik + eps).

    Args:
        logits: (B, H, N, N) scaled attention logits s (plus any additive bias).
        policy: (B, N) keep policy in [0, 1].
    Returns:
        (B, H, N, N) attention probabilities in the dtype of ``logits``.
    """
    N = logits.shape[-1]
    eye = torch.eye(N, dtype=torch.bool, device=logits.device)
    gate = torch.where(eye, 1.0, policy.float()[:, None, None, :])  # (B, 1, N, N)
    s = logits.float()
    e = (s - s.amax(dim=-1, keepdim=True)).exp() * gate
    return ((e + eps / N) / (e.sum(dim=-1, keepdim=True) + eps)).to(logits.dtype)

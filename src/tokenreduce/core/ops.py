"""Shared tensor primitives, written once: gather by index, top-k keep, bipartite soft matching,
size-weighted merge, CLS-row attention. Shapes: B batch, N tokens, C channels, H heads."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


def gather_tokens(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, N, ...) gathered along dim 1 at idx (B, K) -> (B, K, ...)."""
    view = idx.reshape(*idx.shape, *([1] * (x.dim() - 2)))
    return x.gather(1, view.expand(*idx.shape, *x.shape[2:]))  # (B, K, ...)


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
    """A merge of tokens into fewer tokens, as positions into the current sequence (B, N).

    ``keep`` (B, N - r): the tokens that survive, in output order; ``src`` (B, r): the tokens
    that are merged away; ``dst`` (B, r): the output slot each of them is added into, and
    ``dst_pos`` (B, r) that slot's token in the input (``keep`` at ``dst``).
    """

    keep: Tensor
    src: Tensor
    dst: Tensor
    dst_pos: Tensor

    def sum(self, t: Tensor) -> Tensor:
        """t (B, N, ...) -> (B, N - r, ...): every kept row plus the rows merged into it."""
        out = gather_tokens(t, self.keep)
        if self.src.shape[1] > 0:
            src = gather_tokens(t, self.src)
            out.scatter_add_(1, _expand_like(self.dst, src), src)
        return out

    def mean(self, x: Tensor, size: Tensor) -> tuple[Tensor, Tensor]:
        """Size-weighted merge: x (B, N, C), size (B, N) -> x' (B, N - r, C), size' (B, N - r).

        x'_d = (s_d x_d + sum_i s_i x_i) / S_d with S_d = s_d + sum_i s_i over the tokens i merged
        into d, computed as x_d + sum_i (s_i / S_d) (x_i - x_d): only the r merged rows are
        touched after the gather of the kept ones, so merging costs about what pruning costs.
        """
        out = gather_tokens(x, self.keep)
        new_size = gather_tokens(size, self.keep)
        if self.src.shape[1] == 0:
            return out, new_size
        w = gather_tokens(size, self.src)  # (B, r)
        new_size = new_size.scatter_add(1, self.dst, w)
        x_src = gather_tokens(x, self.src)  # (B, r, C)
        x_dst = gather_tokens(x, self.dst_pos)  # (B, r, C) values before the merge
        step = (x_src - x_dst) * (w / new_size.gather(1, self.dst))[..., None]
        out.scatter_add_(1, _expand_like(self.dst, step), step)
        return out, new_size


def _expand_like(idx: Tensor, t: Tensor) -> Tensor:
    """(B, K) -> (B, K, ...) broadcast to the shape of t."""
    return idx.reshape(*idx.shape, *([1] * (t.dim() - 2))).expand_as(t)


@functools.lru_cache(maxsize=64)
def _fixed_positions(num_prefix: int, n_b: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Positions of the prefix tokens and of set B, (1, p) and (1, |B|); cached: every ToMe block
    needs them and building them is a measurable share of a batch-1 forward on a CPU."""
    prefix = torch.arange(num_prefix, device=device)[None]
    return prefix, num_prefix + 1 + 2 * torch.arange(n_b, device=device)[None]


def bipartite_soft_matching(metric: Tensor, r: int, num_prefix: int) -> MergePlan:
    """ToMe's bipartite soft matching (Bolya et al., arXiv 2210.09461, Sec. 3).

    Non-prefix tokens alternate into A (even) and B (odd); each A token is linked to its most
    cosine-similar B token and the r most similar links are merged. Prefix tokens take no part.
    Output order: prefix, the unmerged A tokens (in similarity order, as in ToMe), all of B.

    Args:
        metric: (B, N, d) similarity features (ToMe: keys averaged over heads).
        r: tokens to remove, at most |A| = ceil((N - num_prefix) / 2).
    """
    p = num_prefix
    metric = F.normalize(metric[:, p:], dim=-1, eps=1e-6)
    a, b = metric[:, ::2], metric[:, 1::2]
    scores = a @ b.transpose(-2, -1)  # (B, |A|, |B|)
    best, best_idx = scores.max(dim=-1)  # (B, |A|)
    order = best.argsort(dim=-1, descending=True)
    src, unm = order[:, :r], order[:, r:]
    dst = best_idx.gather(1, src)  # (B, r) index into B
    n_unm = unm.shape[1]
    prefix, b_pos = _fixed_positions(p, b.shape[1], metric.device)
    batch = metric.shape[0]
    keep = torch.cat([prefix.expand(batch, -1), p + 2 * unm, b_pos.expand(batch, -1)], dim=1)  # (B, N - r)
    return MergePlan(keep, p + 2 * src, p + n_unm + dst, p + 1 + 2 * dst)

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

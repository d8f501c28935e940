"""Shared tensor primitives, written once: gather by index, top-k keep, bipartite soft matching
(over all patch tokens, inside a subset, or between two given sets), weighted merge, CLS-row attention.
Shapes: B batch, N tokens, C channels, H heads."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import TokenReduceError

# Kernel count matters here: at batch 1 on a CPU every dispatched operator costs microseconds whatever
# its size, and the book-keeping of a reduction (index arithmetic, small gathers) can cost more than
# the tokens it removes save. tests/test_overheads.py holds each method to a per-block operator budget.


def shape_cached(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``fn`` (hashable arguments: ints and a device -> an index tensor that depends only on them) cached
    per arguments instead of built in every block of every forward. Read only: never modify a result in
    place. Built as a normal tensor (a later forward with autograd may save it). While torch.compile or
    torch.export traces, ``fn`` runs in the graph instead (dynamo would warn about and ignore the cache,
    and a traced fake tensor must never enter it)."""

    @functools.lru_cache(maxsize=256)
    def cached(*args: object) -> Tensor:
        with torch.inference_mode(False):
            return fn(*args)

    @functools.wraps(fn)
    def get(*args: object) -> Tensor:
        return fn(*args) if torch.compiler.is_compiling() else cached(*args)

    return get


@shape_cached
def positions(start: int, count: int, step: int, device: torch.device) -> Tensor:
    """start, start + step, ..., ``count`` of them, (count,) long (cached: :func:`shape_cached`)."""
    return torch.arange(start, start + step * count, step, device=device)


def gather_tokens(x: Tensor, idx: Tensor) -> Tensor:
    """x (B, N, ...) gathered along dim 1 at idx (B, K) -> (B, K, ...)."""
    if x.dim() == 2:  # token-aligned fields (index, size): no view/expand to dispatch
        return x.gather(1, idx)  # (B, K)
    view = idx.reshape(*idx.shape, *([1] * (x.dim() - 2)))
    return x.gather(1, view.expand(*idx.shape, *x.shape[2:]))  # (B, K, ...)


def complement_index(idx: Tensor, n: int) -> Tensor:
    """Positions in [0, n) not in idx (B, K) (distinct), ascending, (B, n - K)."""
    taken = torch.zeros(idx.shape[0], n, dtype=torch.uint8, device=idx.device).scatter_(1, idx, 1)
    # a stable sort puts the positions not taken first, ascending; unlike nonzero() it needs no
    # device synchronisation and one operator less
    return taken.sort(dim=1, stable=True).indices[:, : n - idx.shape[1]]


def keep_topk(scores: Tensor, k: int, num_prefix: int, with_drop: bool = False) -> tuple[Tensor, Tensor | None]:
    """:func:`keep_top` for scores of the non-prefix tokens only.

    Args:
        scores: (B, M) scores of the M non-prefix tokens.
        k: how many non-prefix tokens to keep.
        num_prefix: prefix tokens in front of them, always kept first.
        with_drop: also return the dropped positions.
    Returns:
        keep (B, num_prefix + k) and drop (B, M - k) or None: positions into the full sequence;
        kept tokens stay in their original order (spatial order for patches), dropped ones too.
    """
    key = F.pad(scores, (num_prefix, 0), value=math.inf) if num_prefix else scores  # the prefix first, kept
    return _top(key, num_prefix + k, with_drop)


def keep_top(scores: Tensor, k: int, num_prefix: int, with_drop: bool = False) -> tuple[Tensor, Tensor | None]:
    """Positions of the prefix tokens plus the k highest-scoring non-prefix tokens, from the scores
    of EVERY token, prefix entries included (and ignored): the prefix tokens are given +inf, so one
    top-k (or sort) over the sequence returns positions into it directly, with no slicing, offset or
    concatenation (4 to 6 kernels fewer per call than scoring the non-prefix tokens apart).

    Args:
        scores: (B, N) scores of all N tokens; the first ``num_prefix`` entries are not read.
        k: how many non-prefix tokens to keep.
        num_prefix: p, prefix tokens at positions 0 .. p-1, always kept.
        with_drop: also return the dropped positions.
    Returns:
        keep (B, p + k) ascending (prefix first) and drop (B, N - p - k) ascending, or None.
    """
    key = scores
    if num_prefix:
        key = scores.index_fill(1, positions(0, num_prefix, 1, scores.device), math.inf)
    return _top(key, num_prefix + k, with_drop)


def _top(key: Tensor, n: int, with_drop: bool) -> tuple[Tensor, Tensor | None]:
    """The n highest entries of key (B, N) (the prefix at +inf among them) as ascending positions,
    and the others, ascending, if ``with_drop``.

    Equal scores go to the lower position first (a stable sort; ONNX TopK's rule), so every backend keeps
    the same tokens: ``topk`` breaks ties as its kernel happens to, and saturated scores tie exactly (a
    confident DynamicViT predictor's log-probabilities are 0.0 in float32), where eager, onnxruntime and
    another device then kept different tokens. One sort of N entries, as ``topk`` of N costs for N ~ 200.
    """
    if with_drop:  # one full sort, so keep and drop partition the tokens
        order = _descending(key)
        return order[:, :n].sort(dim=1).values, order[:, n:].sort(dim=1).values
    return _descending(key, n).sort(dim=1).values, None


def _descending(key: Tensor, n: int | None = None) -> Tensor:
    """Positions of the n highest entries of key (B, N) (all of them if n is None), highest first, equal ones
    lower position first.

    Exporting (torch.export, which transformers' OnnxExporter and torch's dynamo ONNX exporter run, or the
    classic ONNX exporter), ``topk``: ONNX TopK orders ties so by definition, the classic exporter has no
    stable sort, and transformers' OnnxExporter rewrites a stable sort into a node without the metadata its
    translation reads (KeyError 'val'); every exporter translates ``topk``."""
    if torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting():
        return key.topk(key.shape[1] if n is None else n, dim=1).indices
    order = key.argsort(dim=1, descending=True, stable=True)
    return order if n is None else order[:, :n]


def cls_attention(q: Tensor, k: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """Attention row of the class token: softmax(q_cls k^T * scale + bias), (B, H, N).

    Computed from q (B, H, N, d) and k (B, H, N, d) alone, so that the block itself keeps the
    fused SDPA kernel; costs one (1 x N) row per head instead of the N x N matrix.
    """
    B, H, N, d = k.shape
    # the batched product matmul itself runs, without its broadcasting expands and views
    logits = torch.bmm((q[:, :, :1] * scale).reshape(B * H, 1, d), k.reshape(B * H, N, d).transpose(1, 2))
    if bias is None:
        return logits.view(B, H, N).softmax(dim=-1)
    return (logits.view(B, H, 1, N) + bias).softmax(dim=-1)[:, :, 0]


@dataclass(frozen=True)
class MergePlan:
    """A merge of tokens into fewer tokens, as positions into the current sequence (B, N).

    ``keep`` (B, N - r): the tokens that survive, in output order; ``src`` (B, r): the tokens
    that are merged away; ``dst`` (B, r): the output slot each of them is added into, and
    ``dst_pos`` (B, r) that slot's token in the input (``keep`` at ``dst``). A plan may also
    prune: tokens in neither ``keep`` nor ``src`` are dropped (``keep`` is then shorter than N - r).
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

    def mean(self, x: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Weighted merge: x (B, N, C), weight (B, N) > 0 -> x' (B, N - r, C), W' (B, N - r).

        x'_d = (w_d x_d + sum_i w_i x_i) / W_d with W_d = w_d + sum_i w_i over the tokens i merged
        into d, computed as x_d + sum_i (w_i / W_d) (x_i - x_d): only the r merged rows are
        touched after the gather of the kept ones, so merging costs about what pruning costs.
        Returns x' and the summed weights W'. With the token sizes as ``weight`` (ToMe's
        size-weighted mean) W' is the new sizes; with any other weight (BSPF's fusion) W' is the
        summed weight only, and the sizes are summed separately (``TokenState.merge`` does both).
        ``weight`` must be positive: a slot whose weights sum to 0 has no mean (NaN); it is not
        checked here, since a check would synchronise the device in every forward.
        ``weight=None`` means all ones (sizes before the first merge): nothing to gather, and W' is
        None (all ones still) when nothing is merged (r = 0).
        """
        if weight is not None and weight.shape != x.shape[:2]:
            raise TokenReduceError(
                f"merge weight has shape {tuple(weight.shape)}; expected one weight per token, {tuple(x.shape[:2])}"
            )
        out = gather_tokens(x, self.keep)
        if self.src.shape[1] == 0:
            return out, None if weight is None else gather_tokens(weight, self.keep)
        if weight is None:  # W' = 1 + the number of tokens merged into each slot
            w = x.new_ones(self.src.shape)  # (B, r)
            new_weight = x.new_ones(self.keep.shape).scatter_add_(1, self.dst, w)
        else:
            w = gather_tokens(weight, self.src)  # (B, r)
            new_weight = gather_tokens(weight, self.keep).scatter_add_(1, self.dst, w)
        x_src = gather_tokens(x, self.src)  # (B, r, C)
        slots = _expand_like(self.dst, x_src)  # (B, r, C), for the read and the write of the same rows
        if out.requires_grad:  # gather saves its input for backward, so read x: out is written below
            x_dst = gather_tokens(x, self.dst_pos)  # (B, r, C) values before the merge
        else:  # the same rows, out[dst] = x[keep[dst]] = x[dst_pos], with the index already expanded
            x_dst = out.gather(1, slots)
        step = (x_src - x_dst) * (w / new_weight.gather(1, self.dst))[..., None]
        out.scatter_add_(1, slots, step)
        return out, new_weight


def _expand_like(idx: Tensor, t: Tensor) -> Tensor:
    """(B, K) -> (B, K, ...) broadcast to the shape of t."""
    return idx.reshape(*idx.shape, *([1] * (t.dim() - 2))).expand_as(t)


def bipartite_soft_matching(metric: Tensor, r: int, num_prefix: int) -> MergePlan:
    """ToMe's bipartite soft matching (Bolya et al., arXiv 2210.09461, Sec. 3), paired as the
    official code pairs it (github.com/facebookresearch/ToMe, tome/merge.py).

    The sets alternate over *sequence positions*, prefix tokens included: A = positions 0, 2, 4, ...,
    B = positions 1, 3, 5, .... Prefix tokens stay where they fall and are protected: a prefix
    token in A merges into nothing (the class token, position 0), a prefix token in B receives
    nothing (a distillation token, position 1); so with one prefix token the first patch is in B.
    Each unprotected A token is linked to its most cosine-similar unprotected B token,
    s_a = max_b cos(a, b), and the r links with the largest s_a merge, A into B.

    Output order (the official one, generalised to any number of prefix tokens): the prefix tokens
    in order, the unmerged A tokens, then the B tokens. With prefix tokens the unmerged A tokens
    are in sequence order (the official code sorts them when there is a class token, so that it
    comes first; with a distillation token it gives cls, dist, rest of A, rest of B - the same
    order); with none they stay in similarity order, as the official code leaves them.

    Args:
        metric: (B, N, d) similarity features of all N tokens (ToMe: keys averaged over heads).
        r: tokens to remove, at most the unprotected A tokens; ToMe's own limit (N - p) // 2 is
            applied by the caller's schedule (``methods/tome.py``).
        num_prefix: p, the protected prefix tokens at positions 0 .. p-1.
    Returns:
        MergePlan with keep (B, N - r), src / dst / dst_pos (B, r).
    """
    p = num_prefix
    pa, pb = (p + 1) // 2, p // 2  # prefix tokens that fall in A and in B
    # F.normalize(metric, dim=-1, eps=1e-6), the same values without its explicit expand
    metric = metric / metric.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    # protected rows / columns are left out of the scores rather than set to -inf: the same links
    # (every unprotected A row has an unprotected B column), less work
    a, b = metric[:, 2 * pa::2], metric[:, 2 * pb + 1::2]  # (B, |A| - pa, d), (B, |B| - pb, d)
    n_a, n_b = a.shape[1], b.shape[1]
    if not 0 <= r <= (n_a if n_b else 0):
        raise TokenReduceError(
            f"bipartite soft matching cannot remove r={r} of {metric.shape[1]} tokens ({p} protected): at most "
            f"{n_a if n_b else 0}, one per unprotected A token"
        )
    scores = torch.bmm(a, b.transpose(1, 2))  # (B, |A| - pa, |B| - pb); matmul's kernel without its views
    best, best_idx = scores.max(dim=-1)
    order = best.argsort(dim=-1, descending=True)
    src, unm = order[:, :r], order[:, r:]  # indices into unprotected A
    if p:
        unm = unm.sort(dim=-1).values
    dst = best_idx.gather(1, src)  # (B, r) index into unprotected B
    # indices into A and B -> sequence positions by lookup in cached tables (one kernel each)
    a_pos = positions(2 * pa, n_a, 2, metric.device)  # (|A| - pa,) positions 2 pa, 2 pa + 2, ...
    b_pos = positions(2 * pb + 1, n_b, 2, metric.device)  # (|B| - pb,) positions 2 pb + 1, ...
    batch = metric.shape[0]
    parts = [a_pos[unm], b_pos.expand(batch, n_b)]
    if p:
        parts.insert(0, positions(0, p, 1, metric.device).expand(batch, p))
    keep = torch.cat(parts, dim=1)  # (B, N - r): prefix, unmerged A, B
    return MergePlan(keep, a_pos[src], dst + (p + unm.shape[1]), b_pos[dst])


def subset_matching(metric: Tensor, subset: Tensor, r: int, survivors: Tensor | None = None) -> MergePlan:
    """Bipartite soft matching restricted to the positions ``subset`` (ImagePiece, arXiv 2412.16491).

    The subset's tokens alternate into A (``subset[:, 0::2]``) and B (``subset[:, 1::2]``), in the
    order given (pass it sorted to alternate spatially); each A token is linked to its most
    cosine-similar B token and the r most similar links are merged, A into B. Every token outside
    the subset is kept untouched; the subset must not contain prefix positions.
    Output order: every surviving token in its current order (prefix first, spatial order kept),
    so ``keep`` is ascending and a merged-away A token's slot simply disappears.

    Args:
        metric: (B, N, d) similarity features of every token.
        subset: (B, S) long, distinct positions into the N tokens taking part.
        r: tokens to remove, at most |A| = ceil(S / 2) (0 if S < 2).
        survivors: (B, K) distinct positions, any order, holding the prefix and the subset: the
            tokens not pruned; the others are dropped by the same plan (in neither ``keep`` nor
            ``src``), so a prune and a merge cost one gather of x. None: every token survives.
    Returns:
        a MergePlan over the N tokens: keep (B, K - r) (K = N without survivors), src/dst/dst_pos (B, r).
    """
    B, N, _ = metric.shape
    if subset.dim() != 2 or subset.shape[0] != B or subset.shape[1] > N:
        raise TokenReduceError(
            f"subset has shape {tuple(subset.shape)}; expected (B={B}, S<={N}) positions into the tokens"
        )
    S = subset.shape[1]
    n_a, n_b = (S + 1) // 2, S // 2
    limit = n_a if n_b else 0
    if not 0 <= r <= limit:
        raise TokenReduceError(
            f"subset matching cannot remove r={r} tokens from a subset of {S}: at most {limit} "
            "(one per A token, and B must not be empty)"
        )
    if r == 0:
        keep = positions(0, N, 1, metric.device).expand(B, N) if survivors is None else survivors.sort(dim=1).values
        none = subset[:, :0]
        return MergePlan(keep, none, none, none)
    m = gather_tokens(metric, subset)  # (B, S, d)
    m = m / m.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # F.normalize(eps=1e-6) without its expand
    scores = torch.bmm(m[:, 0::2], m[:, 1::2].transpose(1, 2))  # (B, |A|, |B|)
    best, best_idx = scores.max(dim=-1)  # (B, |A|)
    order = best.topk(r, dim=-1).indices  # (B, r) index into A, most similar first
    src = subset[:, 0::2].gather(1, order)  # (B, r) positions
    dst_pos = subset[:, 1::2].gather(1, best_idx.gather(1, order))  # (B, r) positions
    # gone (B, N): 1 for a token that leaves (merged away or pruned). A stable sort puts the others
    # first, ascending (unlike nonzero() it needs no device synchronisation); a survivor's output
    # slot is its position less the tokens gone before it
    if survivors is None:
        gone, kept = torch.zeros(B, N, dtype=torch.uint8, device=metric.device), N - r
    else:
        gone = torch.ones(B, N, dtype=torch.uint8, device=metric.device).scatter_(1, survivors, 0)
        kept = survivors.shape[1] - r
    gone.scatter_(1, src, 1)
    keep = gone.sort(dim=1, stable=True).indices[:, :kept]  # (B, kept)
    dst = dst_pos - gone.cumsum(1).gather(1, dst_pos)  # (B, r) slots into keep
    return MergePlan(keep, src, dst, dst_pos)


def policy_softmax(logits: Tensor, policy: Tensor, eps: float = 1e-6, offset: int = 0) -> Tensor:
    """Attention under a soft keep policy (attention masking of DynamicViT, arXiv 2106.02034).

        A_ij = exp(s_ij) G_ij / sum_k exp(s_ik) G_ik,   G_ij = policy_j (j != i),  G_ii = 1

    The policy multiplies probabilities rather than adding log(policy) to the logits, so the
    gradient reaches policy_j even where it is 0 (a log-mask would give 0 * inf there). A token
    always attends to itself, so no row is empty. As in the official code, the row is shifted by
    its max and computed in float32, and eps keeps it finite when every kept logit underflows:
    A_ij = (exp(s_ij - m_i) G_ij + eps / N) / (sum_k exp(s_ik - m_i) G_ik + eps).

    Args:
        logits: (B, H, Nq, N) scaled attention logits s (plus any additive bias); Nq = N usually.
        policy: (B, N) keep policy in [0, 1] of the keys.
        offset: query i is key i + offset (for a block of queries, e.g. one attention chunk).
    Returns:
        (B, H, Nq, N) attention probabilities in the dtype of ``logits``.
    """
    Nq, N = logits.shape[-2:]
    eye = torch.arange(N, device=logits.device) == offset + torch.arange(Nq, device=logits.device)[:, None]
    gate = torch.where(eye, 1.0, policy.float()[:, None, None, :])  # (B, 1, Nq, N)
    s = logits.float()
    e = (s - s.amax(dim=-1, keepdim=True)).exp() * gate
    return ((e + eps / N) / (e.sum(dim=-1, keepdim=True) + eps)).to(logits.dtype)


def set_matching(scores: Tensor, a: Tensor, b: Tensor, r: int, first: Tensor) -> MergePlan:
    """Bipartite soft matching between two sets of tokens the caller chose, from similarities it already
    holds (ToMe's matching, arXiv 2210.09461, without its fixed alternation: PiToMe, arXiv 2405.16148,
    splits the tokens by an energy score and reads the scores off the similarity matrix it scored with).

    Each A token i links to its most similar B token, j_i = argmax_j scores[i, j]; the r links with the
    largest scores[i, j_i] merge, A into B (every A token when r = |A|). The tokens in ``first`` are kept
    untouched, in front; a token in none of ``first``, ``a``, ``b`` is dropped by the same plan.
    Output order: ``first``, the unmerged A tokens (most similar link first), then B.

    Args:
        scores: (B, |A|, |B|) similarity of each A token to each B token.
        a: (B, |A|) long, positions into the current sequence, distinct from ``b``'s.
        b: (B, |B|) long, positions into the current sequence.
        r: tokens merged away, 0 <= r <= |A| (and B not empty when r > 0).
        first: (B, K) positions kept first (prefix tokens, protected tokens).
    Returns:
        MergePlan with keep (B, K + |A| - r + |B|), src / dst / dst_pos (B, r).
    """
    n_a, n_b = a.shape[1], b.shape[1]
    if not 0 <= r <= (n_a if n_b else 0):
        raise TokenReduceError(f"set matching cannot merge r={r} of {n_a} A tokens into {n_b} B tokens: at most "
                               f"{n_a if n_b else 0}, one per A token")
    if r == 0:
        none = a[:, :0]
        return MergePlan(torch.cat([first, a, b], dim=1), none, none, none)
    best, best_idx = scores.max(dim=-1)  # (B, |A|)
    if r == n_a:  # every A token merges: the links need no ranking
        src, dst, kept_a = a, best_idx, a[:, :0]
    else:
        order = best.argsort(dim=-1, descending=True)  # (B, |A|) most similar link first
        src, dst = a.gather(1, order[:, :r]), best_idx.gather(1, order[:, :r])  # (B, r), dst indexes B
        kept_a = a.gather(1, order[:, r:])  # (B, |A| - r)
    keep = torch.cat([first, kept_a, b], dim=1)  # (B, K + |A| - r + |B|)
    return MergePlan(keep, src, dst + (first.shape[1] + kept_a.shape[1]), b.gather(1, dst))

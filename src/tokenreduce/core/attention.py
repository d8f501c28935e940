"""Attention with declared contributions: additive biases, a keep policy, chunks, probabilities.

One function computes every attention variant the methods ask for, so the adapter has no branch
per variant. With q, k, v (B, H, N, d), scale s, an additive bias b and a key set K(i) per query:

    A_ij = softmax_{j in K(i)}(s q_i . k_j + b_ij),    o_i = sum_{j in K(i)} A_ij v_j

- full attention: K(i) = every token. Runs through the fused SDPA kernel unless the
  probabilities are needed or a keep policy is set (then explicitly, as timm's own fallback does).
- ``bias``: the sum of the additive contributions, (B|1, H|1, N|1, N): ToMe's proportional
  attention log(size) as a key bias (B, 1, 1, N), or a reducer's own term.
- ``policy``: DynamicViT's multiplicative keep policy (B, N) (:func:`core.ops.policy_softmax`).
- ``chunk`` = c (chunked attention, as in BSPF-ViT, arXiv 2507.12125): the M = N - p patch
  tokens (after the p prefix tokens) are cut into contiguous chunks of c tokens (the last one may
  be shorter); a patch query attends to the prefix tokens and to its own chunk, K(i) = prefix +
  chunk(i); a prefix query attends to every token. Computed block-wise: each chunk is one small
  attention of c queries over p + c keys, so it costs

      attention_macs = 2 * width * (p N + sum_chunks c_k (p + c_k))    instead of 2 * width * N^2.

  With c >= M there is one chunk and this is full attention.

Folding a key-only bias (``FOLD_KEY_BIAS``). A bias that depends on the key only, b_j of shape
(B|1, H|1, 1, N) (ToMe's and ImagePiece's log(size), BSPF's with ``prop_attn``), can be a few more
channels of the dot product instead of a mask. With q, k, v (B, H, N, d), e >= 1 extra channels so
that d + e is a multiple of 8, and c = 1 / (s e):

    q'_i = [q_i, c ... c],   k'_j = [k_j, b_j ... b_j],   v'_j = [v_j, 0 ... 0]        (B, H, N, d + e)
    s q'_i . k'_j = s q_i . k_j + s e c b_j = s q_i . k_j + b_j

so SDPA(q', k', v', scale=s)[..., :d] is the biased attention with no ``attn_mask`` (s is passed
explicitly: the padded head dim would change SDPA's default; the zero channels of v are sliced off).
Spreading b_j over all e channels, not one channel and zeros, saves two operators per block; c is
exact when s e is a power of 2 (c = 1 for d = 64: e = 8, s = 1/8).

- Why: without a mask SDPA may pick its flash kernel on CUDA (fp16/bf16); a float mask keeps flash out.
- Cost: (d + e)/d of the work in Q K^T and A V (torch.utils.flop_counter counts it), padded copies of
  q, k, v, a copy of the sliced output where the host joins the heads, seven dispatched operators per
  block. On a CPU SDPA's fused kernel takes the float mask as it is, so by default nothing is folded
  there. Whether folding pays, on a CPU or a GPU, is for the bench to measure (bench/speed.py, with
  the setting chosen in the measuring process); nothing here claims it.
- Exactness: in fp32 the two paths agree to rounding (<= 1e-5 in tests/test_folded_bias.py). In
  reduced precision the extra channels are in q.dtype, as the mask is: b_j = log(size) keeps 8
  significant bits in bf16 (and sizes held in bf16 by a bf16 model are exact integers only up to 256,
  then rounded), and c is rounded once where it is not exact (relative error <= 2^-8 on b_j in bf16,
  2^-11 in fp16).
- Scope: full (B|1, H|1, N, N) biases, keep policies, explicit probabilities and chunked attention
  keep their paths (a mask, or the explicit softmax).
- Setting: ``FOLD_KEY_BIAS``, read at every call (torch.compile guards on it): "cuda" (the default)
  folds where q is on a CUDA device, True everywhere, False nowhere (every bias an ``attn_mask``);
  ``with key_bias_folding(True):`` sets it for a block of code.

Probabilities (``need_probs``) of full attention are A (B, H, N, N). With chunks they stay per chunk,
as computed (:class:`ChunkedProbs`): the prefix rows (B, H, p, N) and, per group of equal chunks,
(B, H, chunks, c, p + c), never an (N, N) tensor; :meth:`ChunkedProbs.dense` builds the (B, H, N, N)
layout for a caller that wants it.

Mean attention received (:func:`received_attention`): r_j = (1/N) sum_i A_ij per head, the column
means of full attention, computed over query chunks of at most ``RECEIVED_ROWS`` rows and never more
than half the queries, so that no (N, N) tensor exists (a class-token-free score, core/scores.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import TokenReduceError
from .ops import policy_softmax, shape_cached

#: Fold a key-only bias (B|1, H|1, 1, N) into q and k so that SDPA gets no mask (module docstring):
#: "cuda" where q is on a CUDA device, True everywhere, False nowhere. Read at every call; set it, or
#: use :func:`key_bias_folding`, to choose.
FOLD_KEY_BIAS: bool | Literal["cuda"] = "cuda"
#: Head dims of the folded q, k, v are rounded up to a multiple of this (the fused kernels' alignment).
FOLD_ALIGN = 8
#: Query rows per chunk of :func:`received_attention` (at most half the queries: never an (N, N) block).
RECEIVED_ROWS = 256


@contextmanager
def key_bias_folding(mode: bool | Literal["cuda"]) -> Iterator[None]:
    """Set :data:`FOLD_KEY_BIAS` to ``mode`` (True, False or "cuda") inside the block (process-wide,
    not per thread)."""
    global FOLD_KEY_BIAS
    if mode not in (True, False, "cuda"):
        raise TokenReduceError(f"key-bias folding is True, False or 'cuda', got {mode!r}")
    before, FOLD_KEY_BIAS = FOLD_KEY_BIAS, mode
    try:
        yield
    finally:
        FOLD_KEY_BIAS = before


def _folds(q: Tensor) -> bool:
    """Whether :data:`FOLD_KEY_BIAS` folds a key-only bias for queries ``q``."""
    return q.is_cuda if FOLD_KEY_BIAS == "cuda" else bool(FOLD_KEY_BIAS)


@dataclass(frozen=True)
class ChunkedProbs:
    """The attention probabilities of chunked attention, as computed: per chunk, never (B, H, N, N).

    Attributes:
        prefix: (B, H, p, N) the prefix queries' rows over every key, or None when p = 0.
        chunks: one (B, H, n_g, c_g, p + c_g) per group of n_g equal chunks of c_g tokens (the full
            chunks, then the partial last one): chunk m's queries over the p prefix keys, then over
            its own c_g keys in order. ``chunks[g][..., p:]`` are the diagonal blocks (n_g, c_g, c_g).
        groups: (start, n_g, c_g) per group, ``start`` the sequence position of its first token.
        num_prefix: p.
    """

    prefix: Tensor | None
    chunks: tuple[Tensor, ...]
    groups: tuple[tuple[int, int, int], ...]
    num_prefix: int

    def diagonal(self) -> list[Tensor]:
        """The diagonal chunk blocks, one (B, H, n_g, c_g, c_g) per group: queries and keys of one chunk."""
        return [a[..., self.num_prefix:] for a in self.chunks]

    def dense(self) -> Tensor:
        """The (B, H, N, N) layout, zeros outside prefix + own chunk. It allocates the N x N tensor that
        chunking avoids: for tests and callers that need it, not for the forward."""
        p = self.num_prefix
        last, count, size = self.groups[-1]
        n = last + count * size  # the last chunk ends the sequence
        rows = [] if self.prefix is None else [self.prefix]
        for (start, count, size), a in zip(self.groups, self.chunks, strict=True):
            B, H = a.shape[:2]
            keys = _chunk_keys(p, start, count, size, a.device)  # (count, p + size)
            idx = keys[None, None, :, None, :].expand_as(a)
            rows.append(a.new_zeros(B, H, count, size, n).scatter(-1, idx, a).reshape(B, H, count * size, n))
        return torch.cat(rows, 2)


def attention_macs(tokens: int, width: int, num_prefix: int, chunk: int | None = None) -> int:
    """MACs of Q K^T and A V for one image: 2 * width * (query-key pairs computed).

    Args:
        tokens: N, tokens entering the attention (prefix included).
        width: A = heads * head_dim.
        num_prefix: p prefix tokens (attend and are attended globally).
        chunk: patch tokens per chunk, or None for full attention (N^2 pairs).
    """
    m = tokens - num_prefix
    if chunk is None or m <= chunk:
        pairs = tokens * tokens
    else:
        full, rest = divmod(m, chunk)
        pairs = num_prefix * tokens + full * chunk * (num_prefix + chunk) + rest * (num_prefix + rest)
    return 2 * width * pairs


def attend(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, bias: Tensor | None = None,
    policy: Tensor | None = None, chunk: int | None = None, num_prefix: int = 0,
    dropout_p: float = 0.0, need_probs: bool = False,
) -> tuple[Tensor, Tensor | ChunkedProbs | None]:
    """Multi-head attention with the declared contributions (see the module docstring).

    Args:
        q, k, v: (B, H, N, d).
        scale: logit scale s (timm: head_dim ** -0.5).
        bias: additive logit bias broadcastable to (B, H, N, N), 4-D, or None.
        policy: (B, N) keep policy in [0, 1] (prefix entries 1), or None.
        chunk: patch tokens per chunk (chunked attention), or None.
        num_prefix: p, prefix tokens in front of the patch tokens.
        dropout_p: dropout on the attention probabilities (pass 0 in eval, as timm does).
        need_probs: also return the probabilities.
    Returns:
        o (B, H, N, d) and, when ``need_probs``, the probabilities before dropout (rows sum to 1):
        A (B, H, N, N) for full attention, :class:`ChunkedProbs` with chunks; else None.
    """
    if bias is not None:
        if bias.dim() != 4 or bias.shape[-1] != k.shape[-2] or bias.shape[-2] not in (1, q.shape[-2]):
            raise TokenReduceError(
                f"attention bias must be 4-D, broadcastable to (B, H, N, N) with N={q.shape[-2]}; "
                f"got shape {tuple(bias.shape)}"
            )
        bias = bias.to(q.dtype)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise TokenReduceError(f"attention chunk must be a positive int (patch tokens per chunk), got {chunk!r}")
    p, n = num_prefix, q.shape[-2]
    if chunk is None or n - p <= chunk:
        return _full(q, k, v, scale, bias, policy, dropout_p, need_probs, offset=0, fold=_folds(q))

    B, H, _, d = q.shape
    outs, chunks, prefix = [], [], None
    if p:  # prefix queries see every token
        pre_bias = bias if bias is None or bias.shape[-2] == 1 else bias[:, :, :p]
        o, prefix = _full(q[:, :, :p], k, v, scale, pre_bias, policy, dropout_p, need_probs, offset=0)
        outs.append(o)
    full, rest = divmod(n - p, chunk)
    groups = [(p, full, chunk)] + ([(p + full * chunk, 1, rest)] if rest else [])
    for start, count, size in groups:  # the full chunks batched together, then the partial one
        keys = _chunk_keys(p, start, count, size, q.device)  # (count, p + size) positions
        qg = _split(q, p, start, count, size, with_prefix=False)  # (B*count, H, size, d)
        kg, vg = (_split(t, p, start, count, size, with_prefix=True) for t in (k, v))  # (B*count, H, p+size, d)
        bg = None if bias is None else _chunk_bias(bias, keys, start, count, size, B)
        pg = None if policy is None else policy[:, keys].reshape(B * count, p + size)
        o, a = _full(qg, kg, vg, scale, bg, pg, dropout_p, need_probs, offset=p)  # (B*count, H, size, d)
        outs.append(o.reshape(B, count, H, size, d).transpose(1, 2).reshape(B, H, count * size, d))
        if need_probs:
            chunks.append(a.reshape(B, count, H, size, p + size).transpose(1, 2))  # (B, H, count, size, p + size)
    probs = ChunkedProbs(prefix, tuple(chunks), tuple(groups), p) if need_probs else None
    return torch.cat(outs, 2), probs


def received_attention(q: Tensor, k: Tensor, scale: float, bias: Tensor | None = None) -> Tensor:
    """Mean attention each token receives, r_j = (1/N) sum_i softmax_j(s q_i . k_j + b_ij), (B, H, N).

    q, k (B, H, N, d); ``bias`` broadcastable to (B, H, N, N), 4-D, or None. The logits are formed for
    ``rows`` queries at a time, rows = min(RECEIVED_ROWS, ceil(N / 2)): each chunk is (B, H, rows, N),
    never (N, N). Costs N^2 d MACs per head (the Q K^T products), like the attention's own logits.
    """
    n = q.shape[-2]
    rows = min(RECEIVED_ROWS, max(1, -(-n // 2)))
    total = None
    for start in range(0, n, rows):
        logits = (q[:, :, start:start + rows] * scale) @ k.transpose(-2, -1)  # (B, H, rows, N)
        if bias is not None:
            logits = logits + (bias if bias.shape[-2] == 1 else bias[:, :, start:start + rows]).to(q.dtype)
        part = logits.softmax(dim=-1).sum(dim=-2)  # (B, H, N)
        total = part if total is None else total + part
    return total / n


def _full(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None, policy: Tensor | None,
          dropout_p: float, need_probs: bool, offset: int, fold: bool = False) -> tuple[Tensor, Tensor | None]:
    """Every query over every key given; query i's own key is key i + ``offset`` (policy gate).
    ``fold``: a key-only bias goes into q and k (:func:`fold_key_bias`) instead of SDPA's mask."""
    if policy is None and not need_probs:
        if fold and bias is not None and bias.shape[-2] == 1:
            qf, kf, vf = fold_key_bias(q, k, v, bias, scale)
            o = F.scaled_dot_product_attention(qf, kf, vf, dropout_p=dropout_p, scale=scale)
            return o[..., :q.shape[-1]], None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale), None
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
    if bias is not None:
        logits = logits + bias
    probs = logits.softmax(dim=-1) if policy is None else policy_softmax(logits, policy, offset=offset)
    attn = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return attn @ v, (probs if need_probs else None)


def fold_key_bias(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, H, N, d) and a key-only bias b (B|1, H|1, 1, N) -> q', k', v' (B, H, N, d + e), e >= 1
    extra channels up to a multiple of ``FOLD_ALIGN``, with s q'_i . k'_j = s q_i . k_j + b_j (module
    docstring): q' = [q, c ... c], k' = [k, b_j ... b_j], v' = [v, 0 ... 0], c = 1 / (s e).
    Five operators: a pad each for q and v, a transpose, an expand and a cat for k."""
    d = q.shape[-1]
    extra = FOLD_ALIGN - d % FOLD_ALIGN  # >= 1: room for the bias, and d + extra aligned
    qf = F.pad(q, (0, extra), value=1.0 / (scale * extra))
    column = bias.transpose(-2, -1).expand(*k.shape[:-1], extra)  # (B, H, N, e), in q.dtype (attend casts it)
    return qf, torch.cat([k, column], -1), F.pad(v, (0, extra))


@shape_cached
def _chunk_keys(p: int, start: int, count: int, size: int, device: torch.device) -> Tensor:
    """Key positions of ``count`` chunks of ``size`` tokens from ``start``: prefix + own chunk, (count, p + size)."""
    own = start + torch.arange(count * size, device=device).view(count, size)
    return torch.cat([torch.arange(p, device=device).expand(count, p), own], 1)


def _split(t: Tensor, p: int, start: int, count: int, size: int, with_prefix: bool) -> Tensor:
    """(B, H, N, d) -> (B * count, H, [p +] size, d): one attention problem per chunk. With the prefix its
    p keys are copied into every chunk (p / (p + size) of the chunk's K and V, one row for a CLS token):
    one fused attention call per group needs each problem's keys in one tensor."""
    B, H, _, d = t.shape
    own = t[:, :, start:start + count * size].reshape(B, H, count, size, d).transpose(1, 2)  # (B, count, H, size, d)
    if with_prefix and p:
        own = torch.cat([t[:, None, :, :p].expand(B, count, H, p, d), own], 3)
    return own.reshape(B * count, H, -1, d)


def _chunk_bias(bias: Tensor, keys: Tensor, start: int, count: int, size: int, batch: int) -> Tensor:
    """The entries of ``bias`` (b, h, N|1, N) for each chunk's queries and keys, (B * count, h, size|1, p + size)."""
    if bias.shape[-2] == 1:
        queries = torch.zeros(count, 1, dtype=torch.long, device=bias.device)
    else:
        queries = start + torch.arange(count * size, device=bias.device).view(count, size)
    b = bias[:, :, queries[:, :, None], keys[:, None, :]]  # (b, h, count, size|1, p + size)
    b = b.expand(batch, *b.shape[1:]).transpose(1, 2)  # (B, count, h, size|1, p + size)
    return b.reshape(batch * count, *b.shape[2:])

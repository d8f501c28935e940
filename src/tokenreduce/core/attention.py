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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import TokenReduceError
from .ops import policy_softmax


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
) -> tuple[Tensor, Tensor | None]:
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
        o (B, H, N, d) and, when ``need_probs``, A (B, H, N, N) before dropout (rows sum to 1;
        with chunks, zeros outside the allowed pattern), else None.
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
        return _full(q, k, v, scale, bias, policy, dropout_p, need_probs, offset=0)

    B, H, _, d = q.shape
    outs, rows = [], []
    if p:  # prefix queries see every token
        pre_bias = bias if bias is None or bias.shape[-2] == 1 else bias[:, :, :p]
        o, a = _full(q[:, :, :p], k, v, scale, pre_bias, policy, dropout_p, need_probs, offset=0)
        outs.append(o)
        rows.append(a)
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
        if need_probs:  # back to full rows: zeros outside prefix + own chunk
            a = a.reshape(B, count, H, size, p + size).transpose(1, 2)  # (B, H, count, size, p + size)
            idx = keys[None, None, :, None, :].expand_as(a)
            a = a.new_zeros(B, H, count, size, n).scatter(-1, idx, a)
            rows.append(a.reshape(B, H, count * size, n))
    return torch.cat(outs, 2), (torch.cat(rows, 2) if need_probs else None)


def _full(q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None, policy: Tensor | None,
          dropout_p: float, need_probs: bool, offset: int) -> tuple[Tensor, Tensor | None]:
    """Every query over every key given; query i's own key is key i + ``offset`` (policy gate)."""
    if policy is None and not need_probs:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale), None
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, H, Nq, Nk)
    if bias is not None:
        logits = logits + bias
    probs = logits.softmax(dim=-1) if policy is None else policy_softmax(logits, policy, offset=offset)
    attn = F.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return attn @ v, (probs if need_probs else None)


def _chunk_keys(p: int, start: int, count: int, size: int, device: torch.device) -> Tensor:
    """Key positions of ``count`` chunks of ``size`` tokens from ``start``: prefix + own chunk, (count, p + size)."""
    own = start + torch.arange(count * size, device=device).view(count, size)
    return torch.cat([torch.arange(p, device=device).expand(count, p), own], 1)


def _split(t: Tensor, p: int, start: int, count: int, size: int, with_prefix: bool) -> Tensor:
    """(B, H, N, d) -> (B * count, H, [p +] size, d): one attention problem per chunk."""
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

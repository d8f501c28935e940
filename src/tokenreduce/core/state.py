"""TokenState: what travels with the tokens through the blocks of one forward.

Built fresh at the start of every forward and never stored on the model between calls.
All token-aligned tensors (``size``, ``index``, ``source``) are kept in the same order as
the tokens ``x`` (B, N, C), prefix tokens first; reductions go through :meth:`TokenState.gather`
and :meth:`TokenState.merge` so that they stay aligned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from . import ops


@dataclass
class TokenState:
    """Book-keeping for one forward pass.

    Attributes:
        num_prefix: prefix tokens (cls, dist, registers) at the front, never reduced.
        num_patches: patch tokens at the start of the forward.
        block: index of the block being run (set by the adapter).
        index: (B, N) long, original sequence position each token stems from (for a merged
            token: the position of the token it was merged into).
        size: (B, N) float, patches each token stands for, or None while every size is 1.
        source: (B, N, N0) float 0/1 membership of original tokens, only when tracing.
        prop_attn: add log(size) to the attention logits (proportional attention).
        keep_pruned: keep pruned tokens aside in ``pruned`` (Last Layer Fusion, unmerge).
        keep_mask: (B, N) keep policy in [0, 1] aligned with the tokens (prefix entries 1), or
            None. While set, the attention of the following blocks weights key j by
            keep_mask[:, j] (a token always sees itself) instead of dropping tokens: the
            differentiable stand-in for pruning that learned pruners train with (DynamicViT).
            Pruning methods that set it reduce through :meth:`gather`, which keeps it aligned.
    """

    num_prefix: int
    num_patches: int
    index: Tensor
    block: int = -1
    size: Tensor | None = None
    source: Tensor | None = None
    prop_attn: bool = False
    keep_pruned: bool = False
    keep_mask: Tensor | None = None
    pruned: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    aux_losses: dict[str, Tensor] = field(default_factory=dict)
    tokens_per_block: list[int] = field(default_factory=list)
    snapshots: dict[int, Tensor] = field(default_factory=dict)

    @classmethod
    def start(
        cls, x: Tensor, num_prefix: int, *, trace: bool = False, prop_attn: bool = False,
        keep_pruned: bool = False,
    ) -> TokenState:
        B, N, _ = x.shape  # (B, N, C)
        index = torch.arange(N, device=x.device).expand(B, N)
        source = torch.eye(N, device=x.device, dtype=x.dtype).expand(B, N, N) if trace else None
        return cls(num_prefix, N - num_prefix, index, source=source, prop_attn=prop_attn,
                   keep_pruned=keep_pruned)

    @property
    def tracing(self) -> bool:
        return self.source is not None

    def sizes(self, x: Tensor) -> Tensor:
        """(B, N) sizes, materialised as ones when nothing was merged yet."""
        if self.size is None:
            return x.new_ones(x.shape[:2])
        return self.size

    def attn_bias(self) -> Tensor | None:
        """Proportional attention bias log(size) as an additive SDPA mask, (B, 1, 1, N)."""
        if not self.prop_attn or self.size is None:
            return None
        return self.size.log()[:, None, None, :]

    def gather(self, x: Tensor, idx: Tensor) -> Tensor:
        """Keep the tokens at positions ``idx`` (B, K), in that order; returns x (B, K, C)."""
        if self.keep_pruned:
            drop = ops.complement_index(idx, x.shape[1])
            self.pruned.append((ops.gather_tokens(x, drop), ops.gather_tokens(self.index, drop)))
        self.index = ops.gather_tokens(self.index, idx)
        if self.size is not None:
            self.size = ops.gather_tokens(self.size, idx)
        if self.source is not None:
            self.source = ops.gather_tokens(self.source, idx)
        if self.keep_mask is not None:
            self.keep_mask = ops.gather_tokens(self.keep_mask, idx)
        return ops.gather_tokens(x, idx)

    def merge(self, x: Tensor, plan: ops.MergePlan) -> Tensor:
        """Apply a size-weighted merge plan to x and every aligned tensor; returns merged x.

        x_dst <- (sum_i s_i x_i) / (sum_i s_i) over the tokens merged into dst; s_dst <- sum_i s_i.
        """
        x, self.size = plan.mean(x, self.sizes(x))
        self.index = ops.gather_tokens(self.index, plan.keep)
        if self.source is not None:
            self.source = plan.sum(self.source)
        return x

    def gather_and_fuse(self, x: Tensor, keep: Tensor, drop: Tensor, weights: Tensor) -> Tensor:
        """Keep ``keep`` (B, K) and append one token fused from ``drop`` (B, D) (EViT).

        The fused token is sum_j weights[:, j] * x[drop_j] (B, 1, C); it stands for the total
        size of the dropped tokens, its index is that of the first dropped token.
        """
        dropped = ops.gather_tokens(x, drop)  # (B, D, C)
        token = (weights[..., None] * dropped).sum(1, keepdim=True)  # (B, 1, C)
        fused_size = ops.gather_tokens(self.sizes(x), drop).sum(1, keepdim=True)
        fused_index = self.index.gather(1, drop[:, :1])
        fused_source = None
        if self.source is not None:
            fused_source = ops.gather_tokens(self.source, drop).sum(1, keepdim=True)
        x = self.gather(x, keep)
        self.size = torch.cat([self.sizes(x), fused_size], 1)
        self.index = torch.cat([self.index, fused_index], 1)
        if fused_source is not None:
            self.source = torch.cat([self.source, fused_source], 1)
        return torch.cat([x, token], 1)

    def record(self, block: int, num_tokens: int, reduced: bool) -> None:
        self.tokens_per_block.append(num_tokens)
        if reduced and self.source is not None:
            self.snapshots[block] = self.source.detach()

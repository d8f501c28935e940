"""Model transforms: changes to a built timm ViT's structure, addressed by spec strings.

A transform runs after the stem, before a reducer is applied and before weights are loaded, so
a checkpoint that records it (``meta['model']['transforms']``) reloads to the same modules.

- ``tie_qk(init='mean')``: one shared query/key projection per block (W_q = W_k), BSPF.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.errors import SpecError, UnsupportedModelError
from ..core.registry import NoParams, Registry

TransformFn = Callable[[nn.Module, object], None]
_TRANSFORMS: Registry[TransformFn] = Registry("transform")


def register_transform(name: str, config: type = NoParams) -> Callable[[TransformFn], TransformFn]:
    """Decorator: ``fn(model, cfg)`` applies transform ``name`` (Config ``config``) in place."""
    return _TRANSFORMS.register(name, config)


def list_transforms() -> list[str]:
    """Names of the registered transforms."""
    return _TRANSFORMS.names()


def canonical_transform(spec: str) -> str:
    """The canonical spec of a transform (every parameter spelled out); SpecError if unknown."""
    return _TRANSFORMS.canonical(spec)


def apply_transform(spec: str, model: nn.Module) -> nn.Module:
    """Apply the transform ``spec`` to ``model`` in place; returns ``model``."""
    _, fn, cfg = _TRANSFORMS.resolve(spec)
    fn(model, cfg)
    return model


# ----------------------------------------------------------------------------- tie_qk

#: How the shared W of ``tie_qk`` starts: from W_q, from W_k, or their average.
Init = Literal["q", "k", "mean"]
_INITS: dict[Init, Callable[[Tensor, Tensor], Tensor]] = {
    "q": lambda q, k: q,
    "k": lambda q, k: k,
    "mean": lambda q, k: (q + k) / 2,
}


class TiedQKV(nn.Module):
    """The fused q/k/v projection of timm's Attention with W_q = W_k (and b_q = b_k).

        qkv(x) = x [W; W; W_v]^T + [b; b; b_v]     x (B, N, D) -> (B, N, 3A)

    ``q`` and ``k`` are two nn.Linear(D, A) holding the SAME Parameter objects (one weight, one
    bias, trained once), ``v`` an nn.Linear(D, A). timm's ``Attention.forward`` and the adapter
    still call ``attn.qkv(x)`` and split the output in three. The output is one matmul over the
    concatenated weight, exactly the work of timm's fused qkv (3 * D * A MACs per token, and the
    three nn.Linear submodules make bench/macs.py count it so): a tied and an untied model differ
    in their weights only, not in cost, so speed comparisons isolate the reduction. Computing
    x W^T once would save a third of this projection; we do not, for that reason.

    state_dict keys: ``q.weight``, ``k.weight`` (equal tensors), ``v.weight`` (and biases).
    """

    def __init__(self, dim: int, attn_dim: int, bias: bool) -> None:
        super().__init__()
        self.q = nn.Linear(dim, attn_dim, bias=bias)
        self.k = nn.Linear(dim, attn_dim, bias=bias)
        self.v = nn.Linear(dim, attn_dim, bias=bias)
        self.k.weight = self.q.weight  # the tie: one Parameter under two names
        if bias:
            self.k.bias = self.q.bias

    @classmethod
    def from_fused(cls, qkv: nn.Linear, init: str) -> TiedQKV:
        """A TiedQKV from timm's fused ``nn.Linear(D, 3A)``; W = init(W_q, W_k), W_v kept."""
        attn_dim = qkv.out_features // 3
        bias = qkv.bias is not None
        tied = cls(qkv.in_features, attn_dim, bias).to(device=qkv.weight.device, dtype=qkv.weight.dtype)
        with torch.no_grad():
            wq, wk, wv = qkv.weight.split(attn_dim)  # (A, D) each
            tied.q.weight.copy_(_INITS[init](wq, wk))
            tied.v.weight.copy_(wv)
            if bias:
                bq, bk, bv = qkv.bias.split(attn_dim)
                tied.q.bias.copy_(_INITS[init](bq, bk))
                tied.v.bias.copy_(bv)
        return tied

    def forward(self, x: Tensor) -> Tensor:
        w = torch.cat([self.q.weight, self.k.weight, self.v.weight])  # (3A, D)
        b = None if self.q.bias is None else torch.cat([self.q.bias, self.k.bias, self.v.bias])
        return F.linear(x, w, b)  # (B, N, 3A)


@dataclass(frozen=True)
class TieQKConfig:
    """``init``: the shared W starts as W_q ('q'), W_k ('k') or (W_q + W_k) / 2 ('mean')."""

    init: Init = "mean"

    def __post_init__(self) -> None:
        if self.init not in _INITS:
            raise SpecError(f"tie_qk: unknown init {self.init!r}; valid: {', '.join(map(repr, _INITS))}")


def _tie_norms(attn: nn.Module, init: str) -> None:
    """qk-norm hosts: one norm for q and k as well, else q and k differ after normalisation."""
    if isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity):
        return
    if type(attn.q_norm) is not type(attn.k_norm):
        raise UnsupportedModelError(f"tie_qk: q_norm ({type(attn.q_norm).__name__}) and k_norm "
                                    f"({type(attn.k_norm).__name__}) differ in kind; cannot share them")
    shared = copy.deepcopy(attn.q_norm)
    with torch.no_grad():
        for p, pq, pk in zip(shared.parameters(), attn.q_norm.parameters(), attn.k_norm.parameters(), strict=True):
            p.copy_(_INITS[init](pq, pk))
    attn.q_norm = attn.k_norm = shared


@register_transform("tie_qk", TieQKConfig)
def _tie_qk(model: nn.Module, cfg: TieQKConfig) -> None:
    """Shared query/key weights in every block (W_q = W_k), after BSPF-ViT.

    BSPF-ViT ("Block-based Symmetric Pruning and Fusion for Efficient Vision Transformers",
    arXiv 2507.12125) shares W_q = W_k so that the attention logits are symmetric:

        S = (x W^T + b)(x W^T + b)^T / sqrt(d) = S^T        per head, S (B, H, N, N)

    which lets its pruning score the upper triangle and mirror it. (The softmaxed rows are not
    symmetric - different denominators - which the BSPF experiments measure.) The shared W (and
    bias, and qk-norm when the host has one) is initialised from the existing weights:
    ``init='q'`` keeps W_q, ``'k'`` keeps W_k, ``'mean'`` averages them; W_v is kept. Only 'q'
    leaves the queries unchanged; no init leaves the model's function unchanged, so a tied model
    is fine-tuned (or trained) after the transform.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        raise UnsupportedModelError(f"tie_qk needs a ViT with blocks; {type(model).__name__} has none")
    for i, blk in enumerate(blocks):
        attn = getattr(blk, "attn", None)
        qkv = getattr(attn, "qkv", None)
        if isinstance(qkv, TiedQKV):
            raise SpecError(f"tie_qk: block {i} is already tied (the transform is listed twice?)")
        attn_dim = getattr(attn, "num_heads", 0) * getattr(attn, "head_dim", 0)
        if not isinstance(qkv, nn.Linear) or qkv.out_features != 3 * attn_dim or attn_dim == 0:
            raise UnsupportedModelError(f"tie_qk: block {i}'s attention has no fused qkv nn.Linear(D, 3A) "
                                        f"(got {type(qkv).__name__}); only timm's Attention is supported")
        attn.qkv = TiedQKV.from_fused(qkv, cfg.init)
        _tie_norms(attn, cfg.init)

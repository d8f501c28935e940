"""dynamicvit: learned token pruning, one small keep/drop predictor per stage.

Paper: "DynamicViT: Efficient Vision Transformers with Dynamic Token Sparsification", Rao et al.,
NeurIPS 2021, arXiv 2106.02034.
Checked against: github.com/raoyongming/DynamicViT (models/dyvit.py, losses.py, main.py,
optim_factory.py, engine.py).

The official predictors sit *before* blocks 3, 6, 9 of 12; here a stage runs at the output of the
blocks in ``locs`` (``where='block'``), so the official placement is ``locs=(2, 5, 8)``: the same
computation, and ``locs`` keeps the meaning it has for every method (the block whose output is
reduced). Stage s = 1..S sees the M patch tokens x (B, M, C) and the current decision D (B, M),
D = 1 before the first stage:
    z        = GELU(Linear(LayerNorm(x)))                                  (B, M, C)
    z_global = sum_j D_j z_j[C/2:] / sum_j D_j                             (B, 1, C - C/2)
    pi       = LogSoftmax(MLP([z[..., :C/2], z_global]))                   (B, M, 2)
    MLP: Linear(C, C/2), GELU, Linear(C/2, C/4), GELU, Linear(C/4, 2); pi[..., 0] = log P(keep)
Training (every token stays; attention is masked instead, see core.ops.policy_softmax):
    D <- GumbelSoftmax(pi, tau, hard=True)[..., 0] * D        straight-through, cumulative
    A_ij = exp(s_ij) G_ij / sum_k exp(s_ik) G_ik,  G_ij = D_j (j != i), G_ii = 1  (later blocks)
    aux_losses['ratio'] = ratio_weight / S * sum_s mean_b (mean_j D^s_bj - keep^s)^2
Inference: keep the int(M0 * keep^s) patch tokens with the highest pi[..., 0]; static shapes.
    keep=0.7 on DeiT-S: 197 -> 138 -> 97 -> 68 tokens.
The rest of the official recipe belongs to the training loop: loss = CE + ratio + 0.5 KL(teacher
logits) + 0.5 MSE(final tokens whose D > 0.5, frozen teacher; ``get_info(model).keep_mask``);
predictors at lr x1, backbone at lr x0.01 and frozen for the first 5 epochs (cls_token and
pos_embed never trained); 30 epochs, lr 1e-3, 5 warm-up epochs, batch 8 x 128.
``convert_official_checkpoint`` maps the released checkpoints onto a patched timm ViT.

Deviations:
- Kept tokens stay in spatial order (the official code orders them by score); every later
  operation is permutation-equivariant, so logits agree up to float rounding.
- Every prefix token (cls, dist, registers) is always kept and takes no part in the predictor's
  input or global mean; the official code knows only the class token.
- The global mean divides by max(sum_j D_j, 1e-6): the official code divides by sum_j D_j, which is
  0/0 = NaN once a training sample has dropped every token.
- Counts are relative to the host's patch count (the official code hard-codes 14 x 14 = 196).
- A stage whose count leaves every token (keep=1) does not run: no masking, no ratio loss.
- With global_pool='avg' the head averages every token in training, masked ones included, but
  only the kept ones in eval; the official ViTs pool the class token only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core import ops
from ..core.errors import SpecError
from ..core.method import AttnInfo, Host, Reducer, register_method
from ..core.schedule import Schedule, check_keep, compile_schedule
from ..core.state import TokenState


@dataclass(frozen=True)
class DynamicViTConfig:
    keep: float = 0.7
    locs: Sequence[int] = (2, 5, 8)
    ratio_weight: float = 2.0
    tau: float = 1.0


class KeepPredictor(nn.Module):
    """One stage's prediction module: x (B, M, C), decision (B, M) -> log (keep, drop) (B, M, 2).

    Sub-module names and layer order follow the official ``PredictorLG`` so that its checkpoints
    load by renaming the prefix only.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.in_conv = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU())
        self.out_conv = nn.Sequential(
            nn.Linear(dim, dim // 2), nn.GELU(),
            nn.Linear(dim // 2, dim // 4), nn.GELU(),
            nn.Linear(dim // 4, 2), nn.LogSoftmax(dim=-1),
        )
        for m in self.modules():  # the official init: keep probability starts near 1/2
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor, decision: Tensor) -> Tensor:
        z = self.in_conv(x)  # (B, M, C)
        half = self.dim // 2
        w = decision[..., None]  # (B, M, 1)
        glob = (z[..., half:] * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1e-6)
        z = torch.cat([z[..., :half], glob.expand(-1, z.shape[1], -1)], dim=-1)  # (B, M, C)
        return self.out_conv(z)


@register_method("dynamicvit")
class DynamicViT(Reducer):
    """Learned pruning: masked attention in training, top-k by predicted keep score in eval.

    Eval: x (B, N, C) -> (B, p + count, C). Training: x unchanged, ``state.keep_mask`` updated.
    """

    Config = DynamicViTConfig
    zero = {"keep": 1.0, "locs": (1,)}
    example = {"keep": 0.5, "locs": (1, 2)}
    where = "block"
    learned = True

    def __init__(self, cfg: DynamicViTConfig) -> None:
        super().__init__(cfg)
        self.predictors = nn.ModuleList()
        self._stage: dict[int, int] = {}

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        check_keep(c.keep, self.name)
        if not isinstance(c.tau, (int, float)) or c.tau <= 0:
            raise SpecError(f"{self.name}: tau={c.tau!r} must be > 0 (the Gumbel-softmax temperature)")
        if not isinstance(c.ratio_weight, (int, float)) or c.ratio_weight < 0:
            raise SpecError(f"{self.name}: ratio_weight={c.ratio_weight!r} must be >= 0")
        # int(M0 * keep^s), as the official code: relative to the patch count, floored
        counts = [int(host.num_patches * c.keep ** (s + 1)) for s in range(len(c.locs))]
        sched = compile_schedule(host.num_patches, host.depth, self.name, where=self.where,
                                 counts=counts, locs=c.locs)
        self._stage = {block: s for s, block in enumerate(sched.locs)}
        fits = len(self.predictors) == len(sched.locs) and all(m.dim == host.dim for m in self.predictors)
        if not fits:  # re-binding an already trained reducer to a like host keeps its weights
            self.predictors = nn.ModuleList(KeepPredictor(host.dim) for _ in sched.locs)
        return sched

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """Plus the stage's predictor on the M patch tokens: M * (sum of in * out of its Linears),
        D*D + D*D/2 + D/2*D/4 + D/4*2 per token (LayerNorm, GELU and the global mean are no MACs).
        The inference cost: in training every token stays and the predictor runs the same."""
        linears = [m for m in self.predictors[self._stage[block]].modules() if isinstance(m, nn.Linear)]
        per_token = sum(m.in_features * m.out_features for m in linears)
        return super().scoring_macs(block, tokens_in, count, host) + (tokens_in - host.num_prefix) * per_token

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p = state.num_prefix
        stage = self._stage[state.block]
        if state.keep_mask is None:
            decision = x.new_ones(x.shape[0], x.shape[1] - p)  # (B, M)
        else:
            decision = state.keep_mask[:, p:]
        logp = self.predictors[stage](x[:, p:], decision)  # (B, M, 2)
        if not self.training:
            keep, _ = ops.keep_topk(logp[..., 0], count, p)
            return state.gather(x, keep)
        decision = F.gumbel_softmax(logp, tau=self.cfg.tau, hard=True)[..., 0] * decision  # (B, M)
        state.keep_mask = torch.cat([decision.new_ones(x.shape[0], p), decision], dim=1)  # (B, N)
        target = self.cfg.keep ** (stage + 1)
        loss = self.cfg.ratio_weight / len(self._stage) * ((decision.mean(1) - target) ** 2).mean()
        prev = state.aux_losses.get("ratio")
        state.aux_losses["ratio"] = loss if prev is None else prev + loss
        return x


def convert_official_checkpoint(state_dict: dict[str, Any]) -> dict[str, Tensor]:
    """Keys of an official DynamicViT ViT checkpoint (``{'model': ...}`` or bare) for a timm ViT
    patched with ``dynamicvit``: ``score_predictor.<s>.`` becomes ``tokenreduce.predictors.<s>.``;
    the backbone's keys are timm's already. Apply with the official locs, ``locs=(2, 5, 8)``.
    """
    sd = state_dict.get("model", state_dict)
    old, new = "score_predictor.", "tokenreduce.predictors."
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in sd.items()}

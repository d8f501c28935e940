"""cropr: learned token pruning with cross-attention routers and training-only auxiliary heads.

Paper: "Token Cropr: Faster ViTs for Quite a Few Tasks", Bergner, Lippert, Mahendran, CVPR 2025,
arXiv 2412.00965.
Checked against: github.com/benbergner/cropr (MIT; cls/cropr.py, cls/vision_transformer.py,
cls/engine.py, segm/cropr.py, segm/segmenter.py, segm/engine.py), default options
(one router head, no q/k/v projections, no pre-attention norm, MLP ratio 4).

A module runs after the whole block (``where='block'``) at each block of ``locs`` (default: every
block except the last; with Last Layer Fusion, ``'cropr(...) + llf()'``, every block except the
last two). Module s sees the tokens X (B, N, D), prefix tokens first, and owns learnable
queries Q (1, Nq, D) (Nq = 1 for classification; one per output patch for dense tasks):

    A   = Q X^T                                       (B, Nq, N)  unscaled router logits
    s_j = sum_n A[:, n, j],  s_prefix = +inf          (B, N)      token score
    keep the top (M - R_s) of the M patch tokens by s; R_0 = r + first, R_s = r after
Training only (the router branch sees X.detach(): the auxiliary losses never reach the backbone):
    P   = softmax_j(A / sqrt(d))                      (B, Nq, N)  per head of width d = D / heads
    Z   = P X  (-> Linear when heads > 1)             (B, Nq, D)  aggregator
    Z   = Z + MLP(LayerNorm(Z))                       (B, Nq, D)  residual MLP
    aux = Linear(LayerNorm(Z))                        (B, Nq, K)  auxiliary head, K = ``classes``
``aux`` goes to ``state.aux_outputs['cropr<block>']``; the TASK scores it with its own criterion
(classify: CE against the label with the task's label smoothing; segment: per-cell CE against its
mask taken at the patch grid with nearest-neighbour sampling, as the official segm/engine.py)
as the loss ``aux/cropr<block>``, summed unweighted with the main loss (official).
Pruning acts on the non-detached X: the backbone is trained by the main loss only, through the
tokens the router keeps; the queries learn from the auxiliary losses only.

Inference (eval mode): the queries collapse, q = sum_n Q_n (D,), s = X q: one matrix-vector
product per module, Nq x fewer MACs than A (the sum over queries of raw logits is the same
score as training's). ``for_inference()`` (``models.deploy``) returns the deployed form
``inference=True``: it holds q only (a buffer), builds no queries, aggregator or heads, and a
checkpoint saved from it holds none of them.

Schedule: constant ``r`` pruned per module, ``r + first`` at the first (official: +1 "to account
for the CLS token"); ViT-L, r = 8: 197 -> 188 -> ... -> 20 tokens. ``warmup_steps`` > 0: in training
the rate rises linearly, R(t) = floor(r t / warmup_steps) for t < warmup_steps (the first module
prunes R(t) + first), r afterwards (official segmentation: over the first half of training,
per epoch). The reducer knows t through its own step counter, the buffer ``step``: it is advanced
once per training-mode forward (at the first module), saved in checkpoints (exact resume), and
not part of the deployed form; it is counted on the host too (the rate is a shape: no read of the
buffer per step), so set it through ``load_state_dict``, which the host's count follows. Evaluation
always uses the full schedule.

Spec parameters: ``r``, ``first``, ``queries`` (Nq), ``classes`` (K of the auxiliary heads:
the task's outputs, e.g. 10 for Fashion-MNIST, 11 for the mosaics with background; required by
the training form: a head's size is part of the checkpoint, so it is stated in the spec, never
guessed from the host's classifier, which a task may reset), ``locs`` (None = every block but
the last; before ``llf()``, every block but the last two: :func:`default_modules`),
``warmup_steps``, ``heads`` (router heads: the aggregator's softmax per head),
``mlp_ratio`` (0 = no MLP), ``score`` ('logits' = the official score; 'softmax' = the review's
re-score, s_j = sum over heads and queries of P[:, n, j]: what the aggregator trains, for
``cropr_diagnostics``), ``inference`` (the deployed form), ``frozen`` (the random-scorer control).

Options (a study's arms; the defaults are the official method):
- ``frozen=True``: the referee's control, a fixed random LINEAR scorer in place of the learned one.
  Each module's queries are drawn as the trained router's are initialised (``init_queries``; under
  the same seed the first module's draw is the same) and never trained: they are a buffer (no gradient,
  in no optimizer, saved in checkpoints), no aggregator or auxiliary head is built and no
  auxiliary prediction is emitted, so the task adds no auxiliary loss. Scores, schedule, warm-up
  and cost are the official ones (s = X q, q = sum_n Q_n), so the backbone can be trained with the
  same recipe and compared with the learned router. ``classes`` is not needed; the reducer is not
  ``learned`` (nothing of its own is trained).

Deviations:
- Kept tokens stay in spatial order (the official code orders them by score); the blocks are
  permutation-equivariant and dense tasks restore positions by index, so outputs agree up to
  float rounding.
- Every prefix token (cls, dist, registers) is protected and scored by +inf; the official code
  knows only the class token. The aggregator attends over all tokens, prefix included (official).
- The warm-up is per optimizer step (official: per epoch), and evaluation during the warm-up uses
  the full rate (the official code evaluates at the epoch's curriculum rate).
- Options the official code exposes but leaves off by default (q/k/v projections, pre-attention
  LayerNorm) are not offered: with them the scorer no longer collapses to X q.
- With ``heads`` > 1 the 'softmax' score sums the per-head softmaxes (the aggregator's weights).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from ..core import ops
from ..core.errors import SpecError, TokenReduceError
from ..core.method import AttnInfo, Host, Reducer, format_spec, register_method
from ..core.schedule import Schedule, compile_schedule
from ..core.state import TokenState

Score = Literal["logits", "softmax"]
SCORES: tuple[str, ...] = get_args(Score)


@dataclass(frozen=True)
class CroprConfig:
    r: int = 8
    first: int = 1
    queries: int = 1
    classes: int | None = None
    locs: Sequence[int] | None = None
    warmup_steps: int = 0
    heads: int = 1
    mlp_ratio: float = 4.0
    score: Score = "logits"
    inference: bool = False
    frozen: bool = False


def _init_linear(m: nn.Module) -> None:
    """timm's ViT init, which the official model applies to its Cropr modules too."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        nn.init.zeros_(m.bias)


def init_queries(queries: int, dim: int) -> Tensor:
    """Router queries Q (1, Nq, D) as the official model draws them: trunc_normal_tf_(std=D^-0.5),
    i.e. truncated at +-2 standard deviations (the learned router's start, the frozen scorer's value)."""
    q = torch.empty(1, queries, dim)
    nn.init.trunc_normal_(q, std=dim**-0.5, a=-2 * dim**-0.5, b=2 * dim**-0.5)
    return q


class Queries(nn.Module):
    """One module's queries Q (1, Nq, D) and the router logits they give. As it stands, the frozen
    scorer (``frozen=True``): Q is a buffer, never trained, with no aggregator or head; :class:`Router`
    adds those and makes Q a parameter.

    ``logits(x)`` (B, H, Nq, N) per head; ``collapsed()`` q = sum_n Q_n (D,).
    """

    def __init__(self, dim: int, queries: int, heads: int) -> None:
        super().__init__()
        self.dim, self.num_queries, self.heads = dim, queries, heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self._set_queries(init_queries(queries, dim))

    def _set_queries(self, q: Tensor) -> None:
        self.register_buffer("queries", q)

    def fits(self, dim: int, queries: int, classes: int | None, heads: int, mlp_ratio: float) -> bool:
        return (self.dim, self.num_queries, self.heads) == (dim, queries, heads)

    def collapsed(self) -> Tensor:
        """q = sum_n Q_n, (D,)."""
        return self.queries.sum(dim=(0, 1))

    def logits(self, x: Tensor) -> Tensor:
        """x (B, N, D) -> per-head logits Q_h X_h^T (B, H, Nq, N), unscaled."""
        B, N, _ = x.shape
        q = self.queries.view(1, self.num_queries, self.heads, self.head_dim).transpose(1, 2)  # (1, H, Nq, d)
        k = x.view(B, N, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, d)
        return q @ k.transpose(-2, -1)  # (B, H, Nq, N)


class Router(Queries):
    """One module's training form: learned queries Q (1, Nq, D), the aggregator and the auxiliary head.

    ``forward(x)`` -> (logits (B, H, Nq, N), auxiliary prediction (B, Nq, K)).
    """

    def __init__(self, dim: int, queries: int, classes: int, heads: int, mlp_ratio: float) -> None:
        super().__init__(dim, queries, heads)
        self.classes, self.mlp_ratio = classes, mlp_ratio
        self.proj = nn.Linear(dim, dim) if heads > 1 else nn.Identity()
        hidden = int(dim * mlp_ratio)
        if hidden:
            self.mlp_norm = nn.LayerNorm(dim, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))
        self.apply(_init_linear)

    def _set_queries(self, q: Tensor) -> None:
        self.queries = nn.Parameter(q)

    def fits(self, dim: int, queries: int, classes: int | None, heads: int, mlp_ratio: float) -> bool:
        return (self.dim, self.num_queries, self.classes, self.heads, self.mlp_ratio) == (
            dim, queries, classes, heads, mlp_ratio)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, N, D), already detached -> (logits (B, H, Nq, N), prediction (B, Nq, K))."""
        B, N, D = x.shape
        logits = self.logits(x)
        weights = (logits * self.scale).softmax(dim=-1)  # (B, H, Nq, N)
        v = x.view(B, N, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, d)
        z = (weights @ v).transpose(1, 2).reshape(B, self.num_queries, D)  # (B, Nq, D)
        z = self.proj(z)
        if hasattr(self, "mlp"):
            z = z + self.mlp(self.mlp_norm(z))
        return logits, self.head(z)  # (B, Nq, K)


class Collapsed(nn.Module):
    """One module's deployed form: the collapsed query q (D,) as a buffer, nothing else."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("q", torch.zeros(dim))

    def fits(self, dim: int, *_: object) -> bool:
        return self.dim == dim

    def collapsed(self) -> Tensor:
        return self.q


def default_modules(host: Host) -> int:
    """Cropr modules of the default placement (``locs=None``), after blocks 0 .. n - 1: every block but
    the last (n = depth - 1); before Last Layer Fusion after block b (``host.restore_at``, set by the
    composite), every block before b (n = b: depth - 2 with the default ``llf()``, the official count,
    whose penultimate block is not pruned since "the pruned tokens would be concatenated next anyways")."""
    return host.depth - 1 if host.restore_at is None else host.restore_at


#: probe(block, x, state, keep): called by :meth:`Cropr.reduce` before it prunes (diagnostics).
Probe = Callable[[int, Tensor, TokenState, int], None]


def _reread_step(module: Cropr, incompatible_keys: Any) -> None:
    """After a load the warm-up's step is the loaded buffer's: read it again at the next training forward."""
    module._t = None


@register_method("cropr")
class Cropr(Reducer):
    """Cross-attention routers: x (B, N, C) -> (B, p + count, C) at each module (see the module doc).

    Training: emits ``state.aux_outputs['cropr<block>']`` (B, Nq, K) and prunes by the routers'
    summed logits; eval: prunes by X q (one mat-vec per module).
    """

    Config = CroprConfig
    zero = {"r": 0, "first": 0, "classes": 10}
    example = {"r": 10, "classes": 10, "queries": 2}
    where = "block"
    learned = True

    def __init__(self, cfg: CroprConfig) -> None:
        super().__init__(cfg)
        self.learned = not cfg.frozen  # a frozen scorer trains nothing of its own
        self.stages = nn.ModuleList()
        self._stage: dict[int, int] = {}
        self._host: Host | None = None
        self._rate = cfg.r
        #: the warm-up's step as a Python int, read from the buffer once after construction or a load, then
        #: counted here: the count to prune is a shape, and reading the buffer every step would sync the host
        self._t: int | None = None
        self.register_load_state_dict_post_hook(_reread_step)
        #: diagnostics hook (``cropr_diagnostics``), None in normal use; not saved
        self.probe: Probe | None = None

    # ----- configuration

    def _check(self, host: Host) -> None:
        c = self.cfg
        ints = {"r": (c.r, 0), "first": (c.first, 0), "queries": (c.queries, 1), "heads": (c.heads, 1),
                "warmup_steps": (c.warmup_steps, 0)}
        for key, (value, low) in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise SpecError(f"{self.name}: {key}={value!r} must be an int >= {low}")
        if c.score not in SCORES:
            raise SpecError(f"{self.name}: score={c.score!r}; choose from {', '.join(map(repr, SCORES))}")
        if not isinstance(c.mlp_ratio, (int, float)) or c.mlp_ratio < 0:
            raise SpecError(f"{self.name}: mlp_ratio={c.mlp_ratio!r} must be >= 0 (0 = no MLP in the aggregator)")
        for key in ("inference", "frozen"):
            if not isinstance(getattr(c, key), bool):
                raise SpecError(f"{self.name}: {key} must be True or False, got {getattr(c, key)!r}")
        if host.dim % c.heads:
            raise SpecError(f"{self.name}: heads={c.heads} does not divide the model width {host.dim}")
        if c.inference:
            if c.score != "logits":
                raise SpecError(f"{self.name}: the deployed form (inference=True) holds only q = sum of the "
                                "queries, so it scores by logits; score='softmax' needs the training form")
            if c.frozen:
                raise SpecError(f"{self.name}: frozen=True is a form to train the backbone with; the deployed form "
                                "(inference=True) is never trained: give one of them")
            return
        if c.frozen:
            return  # no auxiliary heads: classes is not needed
        if isinstance(c.classes, bool) or not isinstance(c.classes, int) or c.classes < 1:
            raise SpecError(
                f"{self.name}: give classes=K, the outputs of the auxiliary heads (the task's: 10 for "
                f"Fashion-MNIST, 11 for its mosaics with background, 1000 for ImageNet); got {c.classes!r}. "
                "A deployed model that is not trained any more can use inference=True instead")

    def bind(self, host: Host) -> Schedule:
        c = self.cfg
        self._check(host)
        locs = tuple(c.locs) if c.locs is not None else tuple(range(default_modules(host)))
        if not locs:
            raise SpecError(f"{self.name}: no block to prune after; a model of depth {host.depth} needs locs")
        counts, cur = [], host.num_patches
        for i, _ in enumerate(locs):
            cur -= c.r + (c.first if i == 0 else 0)
            counts.append(cur)
        if counts and counts[-1] < 1:
            raise SpecError(
                f"{self.name}: r={c.r} (first +{c.first}) at {len(locs)} modules prunes all "
                f"{host.num_patches} patch tokens; choose r <= {max(0, (host.num_patches - 1 - c.first) // len(locs))} "
                "or fewer locs")
        sched = compile_schedule(host.num_patches, host.depth, self.name, where=self.where, counts=counts, locs=locs)
        self._stage = {block: s for s, block in enumerate(sched.locs)}
        shape = (host.dim, c.queries, c.classes, c.heads, c.mlp_ratio)
        fits = len(self.stages) == len(locs) and all(m.fits(*shape) for m in self.stages)
        if not fits:  # re-binding a trained reducer to a like host (dense=True, deploy) keeps its weights
            self.stages = nn.ModuleList(self._module(host, shape) for _ in locs)
        if c.warmup_steps and not c.inference and not hasattr(self, "step"):
            self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self._host = host
        return sched

    def _module(self, host: Host, shape: tuple) -> nn.Module:
        """A fresh module of the configured form: deployed (q only), frozen (random queries) or trained."""
        if self.cfg.inference:
            return Collapsed(host.dim)
        if self.cfg.frozen:
            return Queries(host.dim, self.cfg.queries, self.cfg.heads)
        return Router(*shape)

    def for_inference(self) -> Reducer:
        """The deployed form: ``inference=True``, q = sum of each module's queries, no aggregator or
        heads; training-only parameters reset to their defaults in its spec."""
        if self.cfg.inference:
            return self
        if self._host is None:
            raise TokenReduceError(f"{self.name}: bind the reducer (tokenreduce.apply) before deploying it")
        keep = ("r", "first", "locs", "score")
        cfg = CroprConfig(**{k: getattr(self.cfg, k) for k in keep}, inference=True)
        if cfg.score != "logits":
            raise TokenReduceError(f"{self.name}: score={cfg.score!r} needs the queries; only score='logits' deploys")
        deployed = Cropr(cfg)
        deployed.bind(self._host)
        ref = self.stages[0].queries
        deployed.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            for mine, theirs in zip(self.stages, deployed.stages, strict=True):
                theirs.q.copy_(mine.collapsed())
        return deployed.train(False)

    @classmethod
    def budget_family(cls, host: Host) -> list[str]:
        """r = 1, 2, ... at the default locs, in the deployed form (the schedule and the inference
        cost do not depend on the training-only parameters; a budget picked here is trained with
        the same r and ``classes``)."""
        most = max(0, (host.num_patches - 2) // max(1, default_modules(host)))
        return [format_spec(cls.name, {"r": r, "inference": True}) for r in range(1, most + 1)]

    # ----- costs

    def scoring_macs(self, block: int, tokens_in: int, count: int, host: Host) -> int:
        """The inference score at ``block``: X q over the M patch tokens, M * D MACs (score='logits');
        the reviewer's re-score forms every logit, Nq * N * D. The training-only aggregator and heads
        are not inference costs."""
        if self.cfg.score == "softmax":
            return self.cfg.queries * tokens_in * host.dim
        return (tokens_in - host.num_prefix) * host.dim

    # ----- scoring

    def _rate_now(self) -> int:
        """R(t) of the warm-up (advances the step counter: call once per training forward)."""
        c = self.cfg
        if not c.warmup_steps:
            return c.r
        if self._t is None:
            self._t = int(self.step.item())  # the one read: after construction or a load
        t, self._t = self._t, self._t + 1
        self.step.add_(1)
        return c.r if t >= c.warmup_steps else (c.r * t) // c.warmup_steps

    def token_scores(self, x: Tensor, block: int, score: str | None = None) -> Tensor:
        """Patch-token scores (B, N - p) of the module at ``block`` for tokens x (B, N, D), p = the
        host's prefix tokens: 'logits' = X q (the collapsed, official score), 'softmax' = the sum
        over heads and queries of the aggregator's per-query softmax over all N tokens."""
        p = self._host.num_prefix
        stage = self.stages[self._stage[block]]
        if (score or self.cfg.score) == "logits":
            q = stage.collapsed().to(x.dtype)
            return (x[:, p:] @ q[:, None])[..., 0]  # (B, N - p): a 2-d product (counted as MACs)
        if not isinstance(stage, Queries):
            raise TokenReduceError(f"{self.name}: score='softmax' needs the queries; the deployed form has only q")
        return (stage.logits(x) * stage.scale).softmax(-1).sum((1, 2))[:, p:]

    def reduce(self, x: Tensor, state: TokenState, info: AttnInfo, count: int) -> Tensor:
        p = state.num_prefix
        stage_no = self._stage[state.block]
        stage = self.stages[stage_no]
        if self.training:
            if not isinstance(stage, Queries):
                raise TokenReduceError(f"{self.name}: the deployed form (inference=True) has no auxiliary heads and "
                                       "cannot be trained; train from the training checkpoint")
            if stage_no == 0:
                self._rate = self._rate_now()
            count = x.shape[1] - p - self._rate - (self.cfg.first if stage_no == 0 else 0)
        if self.training and isinstance(stage, Router):
            logits, pred = stage(x.detach())  # the router branch: no gradient to the backbone
            state.aux_outputs[f"{self.name}{state.block}"] = pred
            if self.cfg.score == "logits":
                scores = logits.sum((1, 2))[:, p:]  # (B, M): summed over heads and queries
            else:
                scores = (logits * stage.scale).softmax(-1).sum((1, 2))[:, p:]
        else:
            scores = self.token_scores(x, state.block)
        if self.probe is not None:
            self.probe(state.block, x, state, count)
        if count == x.shape[1] - p:  # a warm-up step that prunes nothing here
            return x
        keep, _ = ops.keep_topk(scores.detach() if scores.requires_grad else scores, count, p)  # detach: 1 op
        return state.gather(x, keep)


__all__ = ["SCORES", "Collapsed", "Cropr", "CroprConfig", "Queries", "Router", "init_queries"]

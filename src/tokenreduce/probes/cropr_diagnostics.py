"""``cropr_diagnostics``: does Cropr's inference score rank tokens as its training objective does?
(the reviewer's falsifier of Token Cropr on dense tasks, docs/methods.md, section "Token Cropr").

At inference a Cropr module scores token j by the sum of its raw router logits over the Nq queries,
s_j = sum_n Q_n . x_j = x_j . q (one mat-vec). Training optimises something else: each query's
aggregator attends with a softmax over tokens, so what a token is worth to the auxiliary heads is
t_j = sum_n softmax_j(Q_n . x_j / sqrt(d)). With one query the two rank tokens identically (a
softmax is monotone); with one query per output patch (dense tasks) they need not: a token can
have a large raw logit for many queries and be no query's favourite, or the reverse.

For a dense-task checkpoint trained with a router stage (``score`` 'logits' / 'softmax', a
``token_scores`` method: Cropr's training form, the queries are needed) the experiment reports:
    per module     along the deployed trajectory (pruning by s), over the evaluated images: the
                   Spearman rank correlation of s and t over the patch tokens present (per image,
                   then averaged), and the overlap of the kept sets |K_s n K_t| / k at the module's
                   count k;
    mIoU           the task metric on the same test mosaics pruning by s (deployed), by t (the
                   training-time score), by a fixed random scorer at the same schedule (the router
                   stage replaced by ``core.method.matched_spec`` of its schedule, other stages such as
                   Last Layer Fusion kept; mean and std over ``seeds``), and unpruned (the same
                   weights without the reducer: what the pruning costs).
Scores are compared per image; ties have measure zero for continuous scores and are not treated.

Smoke mode (``tiny=True``): a tiny random ViT on the mosaics' 56x56 grid (depth 6, width 32) on
synthetic Fashion-MNIST-format images written under the run's folder, running ``spec`` or, by
default, :func:`smoke_spec`: the registered router (the method with ``token_scores``) at its
``example`` parameters with one query per patch, followed by the registered stage that restores
pruned tokens (``stage_only`` and ``keep_pruned``): the experiment names no method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..core.compose import Compose
from ..core.errors import SpecError, TokenReduceError
from ..core.method import Reducer, format_spec, matched_spec, parse_spec
from .base import Experiment, RunContext, register_experiment

#: the tiny model of smoke mode: the mosaics' grid (56x56, patch 4 -> 14 x 14), depth 6 as the recipe's
TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 0, "embed_dim": 32, "depth": 6,
                   "num_heads": 2, "mlp_ratio": 2.0}}


@dataclass(frozen=True)
class DiagnosticsConfig:
    """``checkpoint``: a dense-task (segment) training checkpoint whose reducer has a router stage
    (required, except in smoke mode); ``data_dir``: where the test set is; ``images``: a fixed random
    subset of that many test items (None: all); ``seeds``: seeds of the random scorer; ``batch``;
    ``spec``: in smoke mode, the spec the tiny model runs (None: :func:`smoke_spec`); ``tiny``: smoke mode."""

    checkpoint: str | None = None
    data_dir: str | None = None
    images: int | None = None
    seeds: int | tuple[int, ...] = (0, 1, 2)
    batch: int = 250
    spec: str | None = None
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint is None and not self.tiny:
            raise SpecError("cropr_diagnostics: give checkpoint='...', a segmentation training checkpoint "
                            "(e.g. runs/cropr_seg/cropr-s0)")
        seeds = (self.seeds,) if isinstance(self.seeds, int) else tuple(self.seeds)
        if not seeds:
            raise SpecError("cropr_diagnostics: seeds must name at least one random scorer seed")
        object.__setattr__(self, "seeds", seeds)
        if self.images is not None and self.images < 1:
            raise SpecError(f"cropr_diagnostics: images must be >= 1 or None, got {self.images}")


def summary_metrics(miou: dict[str, Any], modules: list[dict[str, Any]], metric: str) -> dict[str, float]:
    """The scalars a study reads as an evaluated arm's metrics: the task metric pruning by the
    training-time score t (under the metric's own name, so it pairs with the trained arm's deployed
    value), by the deployed score s, by the fixed random scorer, unpruned; the Spearman correlation
    of s and t and the kept-set overlap, each averaged over the modules."""
    def mean(key: str) -> float:
        return sum(m[key] for m in modules) / len(modules) if modules else float("nan")

    return {metric: miou["softmax"], f"{metric}_deployed": miou["logits"], f"{metric}_fixed": miou["fixed"],
            f"{metric}_unpruned": miou["unpruned"], "spearman": mean("spearman"), "overlap": mean("overlap")}


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation of each row of a and b (B, M), (B,) float64 (no tie correction)."""
    ra = a.double().argsort(1).argsort(1).double()
    rb = b.double().argsort(1).argsort(1).double()
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return (ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1)).clamp_min(1e-12)


def kept_overlap(a: Tensor, b: Tensor, k: int) -> Tensor:
    """|top-k(a) n top-k(b)| / k per row of a and b (B, M), (B,) float64."""
    B, M = a.shape
    ka = torch.zeros(B, M, dtype=torch.bool, device=a.device).scatter_(1, a.topk(k, 1).indices, True)
    kb = torch.zeros(B, M, dtype=torch.bool, device=a.device).scatter_(1, b.topk(k, 1).indices, True)
    return (ka & kb).sum(1).double() / k


class Agreement:
    """Probe of a router stage (``Cropr.probe``): per block, sums of the per-image Spearman and kept-set
    overlap of the 'logits' and 'softmax' scores of the tokens present, before the stage prunes."""

    def __init__(self, stage: Reducer) -> None:
        self.stage = stage
        self.sums: dict[int, list[float]] = {}  # block -> [spearman, overlap, images, tokens, kept]

    @torch.no_grad()
    def __call__(self, block: int, x: Tensor, state: Any, keep: int) -> None:
        s = self.stage.token_scores(x, block, "logits").float()  # (B, M)
        t = self.stage.token_scores(x, block, "softmax").float()
        row = self.sums.setdefault(block, [0.0, 0.0, 0.0, float(s.shape[1]), float(keep)])
        row[0] += float(spearman(s, t).sum())
        row[1] += float(kept_overlap(s, t, keep).sum())
        row[2] += s.shape[0]

    def rows(self) -> list[dict[str, Any]]:
        return [{"block": b, "tokens": int(r[3]), "kept": int(r[4]), "spearman": r[0] / r[2], "overlap": r[1] / r[2],
                 "images": int(r[2])} for b, r in sorted(self.sums.items())]


def smoke_spec(grid: int, classes: int = 11) -> str:
    """The smoke model's spec, found by declaration: the registered router (a method with
    ``token_scores``) at its ``example`` parameters with one query per patch of a ``grid`` x ``grid``
    map and ``classes`` outputs (the mosaics'), then the registered restoring stage (``stage_only`` and
    ``keep_pruned``: Last Layer Fusion) at its defaults."""
    from ..core.method import get_method, list_methods

    classes_of = [get_method(n) for n in list_methods()]
    routers = [c for c in classes_of if callable(getattr(c, "token_scores", None))]
    restore = [c for c in classes_of if c.stage_only and c.keep_pruned]
    if len(routers) != 1 or len(restore) != 1:
        raise TokenReduceError("cropr_diagnostics smoke mode needs exactly one registered router method and one "
                               f"restoring stage, found {[c.name for c in routers]} and {[c.name for c in restore]}")
    router = format_spec(routers[0].name, {**routers[0].example, "queries": grid * grid, "classes": classes})
    return f"{router} + {restore[0].name}"


def _stages(reducer: Reducer) -> list[Reducer]:
    return list(reducer.stages) if isinstance(reducer, Compose) else [reducer]


def _router(stages: list[Reducer]) -> int:
    """Index of the stage that scores with learned queries (it has ``token_scores``)."""
    found = [i for i, s in enumerate(stages) if callable(getattr(s, "token_scores", None))]
    if len(found) != 1:
        raise TokenReduceError(f"cropr_diagnostics needs exactly one router stage (a reducer with token_scores, e.g. "
                               f"Cropr's training form); the checkpoint's spec has {len(found)}: "
                               f"{' + '.join(s.spec() for s in stages)}")
    return found[0]


def _with_stage(stages: list[Reducer], i: int, spec: str) -> str:
    return " + ".join(spec if j == i else s.spec() for j, s in enumerate(stages))


@register_experiment("cropr_diagnostics")
class CroprDiagnostics(Experiment):
    """Per module: Spearman and kept-set overlap of the deployed vs the training-time score; mIoU with
    each scorer, with a random scorer at the same schedule and unpruned."""

    Config = DiagnosticsConfig
    claim = ("Token Cropr's inference score (sum over queries of raw logits) selects the tokens its training "
             "optimises (sum over queries of per-query softmax weights). Falsifier, on a dense task with one query "
             "per output patch: their rank agreement and kept-set overlap per module, the mIoU with each, and a "
             "fixed random scorer at the same schedule with LLF.")
    source = "review of Token Cropr (arXiv 2412.00965, CVPR 2025); docs/methods.md, section 'Token Cropr'"
    smoke = {"tiny": True, "images": 8, "seeds": (0, 1), "batch": 4}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from ..api import apply, get_info, reducer_of, remove

        cfg = self.cfg
        model, task, data, source = self._setup(ctx)
        trained = reducer_of(model)
        stages = _stages(trained)
        i = _router(stages)
        router = stages[i]
        state = {k: v.clone() for k, v in trained.state_dict().items()}
        trained_spec = trained.spec()
        ctx.log(f"cropr_diagnostics: {len(data)} test items, {source}, spec {trained_spec}")

        def evaluate() -> float:
            with ctx.autocast():
                return float(task.evaluate(model, data, batch_size=cfg.batch, device=ctx.device)[task.metric])

        probe = Agreement(router)
        router.probe = probe
        try:
            miou = {"logits": evaluate()}
        finally:
            router.probe = None
        name, params = parse_spec(router.spec())
        if params.get("score") not in (None, "logits"):
            raise TokenReduceError(f"cropr_diagnostics: the checkpoint prunes by score={params['score']!r}; "
                                   "it compares the deployed 'logits' score with the training-time one")
        apply(model, _with_stage(stages, i, format_spec(name, {**params, "score": "softmax"})), dense=True)
        reducer_of(model).load_state_dict(state)  # the same weights, the other scorer
        miou["softmax"] = evaluate()
        schedule = router.bind(get_info(model).host)  # the router stage alone: its counts and locs
        fixed = []  # the matched replay: a fixed pattern per seed, no scoring
        for seed in cfg.seeds:
            apply(model, _with_stage(stages, i, matched_spec(schedule, seed)), dense=True)
            fixed.append(evaluate())
        r = torch.tensor(fixed, dtype=torch.float64)
        miou["fixed"] = float(r.mean())
        miou["fixed_std"] = float(r.std()) if len(r) > 1 else 0.0
        miou["fixed_seeds"] = fixed
        miou["fixed_spec"] = _with_stage(stages, i, matched_spec(schedule, cfg.seeds[0]))
        remove(model)
        miou["unpruned"] = evaluate()
        rows = probe.rows()
        return {"checkpoint": source, "spec": trained_spec, "metric": task.metric, "items": len(data),
                "modules": rows, "miou": miou, "metrics": summary_metrics(miou, rows, task.metric)}

    def _setup(self, ctx: RunContext) -> tuple[nn.Module, Any, Dataset, str]:
        """(patched model in eval mode, bound task with its trained head, test data, where they came from)."""
        from ..data import data_config_from_model, subset
        from ..models import classes_of, read_checkpoint, task_weights
        from ..tasks import TaskContext, build_task

        cfg = self.cfg
        if cfg.tiny:
            model, task, data = self._tiny(ctx)
            return model, task, subset(data, cfg.images), "a tiny random model (smoke)"
        from ..models import load_model

        ckpt = read_checkpoint(cfg.checkpoint)
        model, meta = load_model(ckpt.path, ctx.device)
        if not meta.get("spec"):
            raise TokenReduceError(f"{ckpt.path} holds an unreduced model; cropr_diagnostics needs a router's "
                                   "checkpoint")
        task = build_task(meta.get("task", "classify"))
        task.bind(model, TaskContext(classes=list(meta.get("classes", []))))
        task.load_owned_state_dict(task_weights(ckpt))
        task.to(ctx.device)
        data_name = meta.get("data", {}).get("name", "fashion_mnist")
        data = task.dataset(data_name, "test", train=False, data_dir=cfg.data_dir, classes=classes_of(meta),
                            **data_config_from_model(model))
        return model.eval(), task, subset(data, cfg.images), str(ckpt.path)

    def _tiny(self, ctx: RunContext) -> tuple[nn.Module, Any, Dataset]:
        from ..api import apply
        from ..data import data_config_from_model
        from ..data.fashion_mnist import make_synthetic
        from ..models import build_model
        from ..tasks import TaskContext, build_task

        torch.manual_seed(0)
        model = build_model(TINY)
        apply(model, self.cfg.spec or smoke_spec(TINY["kwargs"]["img_size"] // TINY["kwargs"]["patch_size"]))
        root = make_synthetic(ctx.out_dir / "synthetic", n_train=8, n_test=4 * max(8, self.cfg.images or 8))
        task = build_task("segment")
        data = task.dataset("fashion_mnist", "test", train=False, data_dir=str(root), **data_config_from_model(model))
        task.bind(model, TaskContext(classes=list(data.classes)))
        return model.to(ctx.device).eval(), task.to(ctx.device), data

    def report(self, result: dict[str, Any]) -> str:
        rows = ["| module after block | tokens in | kept | Spearman(s, t) | kept-set overlap |",
                "|---:|---:|---:|---:|---:|"]
        rows += [f"| {m['block']} | {m['tokens']} | {m['kept']} | {m['spearman']:.3f} | {m['overlap']:.3f} |"
                 for m in result["modules"]]
        m = result["miou"]
        metric = result["metric"]
        table = [f"| scorer | {metric} |", "|---|---:|",
                 f"| deployed: sum of raw logits (s) | {m['logits']:.2f} |",
                 f"| training-time: sum of per-query softmax (t) | {m['softmax']:.2f} |",
                 f"| fixed random, same schedule (mean +- std over {len(m['fixed_seeds'])} seeds) | "
                 f"{m['fixed']:.2f} +- {m['fixed_std']:.2f} |",
                 f"| unpruned (same weights) | {m['unpruned']:.2f} |"]
        head = f"{result['checkpoint']}: {result['items']} test items, spec {result['spec']}"
        return "\n".join([head, "", *rows, "", *table])


__all__ = ["Agreement", "CroprDiagnostics", "DiagnosticsConfig", "kept_overlap", "spearman", "summary_metrics"]

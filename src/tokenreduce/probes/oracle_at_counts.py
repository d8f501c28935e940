"""``oracle_at_counts``: a trained pruner's metric next to the object-first oracle's at the same counts.

A review of EET (arXiv 2504.16691) asks how far a content-based scorer is from the best pruner at the
same cost. This experiment takes a checkpoint trained with a pruner (``ctp()``, ``topk(...)``, ...),
and on the same weights and the same test items evaluates its task's metric twice:

    own            the checkpoint's own reducer (its trained scorer)
    object_first   the ``oracle`` pruner at exactly the own reducer's per-block counts, blocks and
                   placement (``methods.oracle.oracle_spec`` of its schedule), fed per image the
                   fraction of object pixels in each patch (``patch_fractions`` of the test set's
                   object masks): it keeps the target's patches first, most covered first, then by
                   ``ties``
plus ``unpruned`` (the same weights, no reducer). A retrieval task's database items are fed their own
masks in the same way (the symmetric protocol encodes them through the pruned model).

Every metric of the task is reported per row; the ``metrics`` of the result are the object_first row's, with
its per-item results (``metrics["items"]``, tasks/items.py, in the test data's order), so that a study can
use this experiment as an evaluated arm (study/declare.py, ``Arm.evaluates``), pair it with the arm it
reads by seed and put the test items in the contrast's interval.

How the masks reach the pruner: each test item carries its mask as one extra input channel; a thin
wrapper module splits it off, turns it into patch fractions and calls the patched model inside
``oracle_priority``. The mask thus travels with its image through any loader, order or shard.

Smoke mode (``tiny=True``): a tiny random ViT (the scene grid, 12 blocks) on scenes made from
synthetic Fashion-MNIST-format images, pruned by the matched random replay of a fixed schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..core.errors import SpecError, TokenReduceError
from ..data.scenes import EVAL_SUBSET
from .base import Experiment, RunContext, register_experiment

#: smoke mode's model: the scene grid (56x56, patch 4 -> 14 x 14), 12 blocks, narrow
TINY = {"name": "vit_tiny_patch16_224",
        "kwargs": {"img_size": 56, "patch_size": 4, "in_chans": 1, "num_classes": 10, "embed_dim": 24, "depth": 12,
                   "num_heads": 2, "mlp_ratio": 2.0}}


@dataclass(frozen=True)
class OracleAtCountsConfig:
    """``checkpoint``: a model trained with a pruner (required, except in smoke mode); ``data``,
    ``data_dir``: the test set (default: the checkpoint's; it must have object masks: the scenes);
    ``subset``: a fixed random subset of the test items (as ``tokenreduce eval --subset``; None: all;
    default: the scene test bed's);
    ``ties``: the oracle's tie rule ('index' | 'cls_attn'); ``batch``; ``tiny``: smoke mode."""

    checkpoint: str | None = None
    data: str | None = None
    data_dir: str | None = None
    subset: int | None = EVAL_SUBSET
    ties: str = "index"
    batch: int = 250
    tiny: bool = False

    def __post_init__(self) -> None:
        if self.checkpoint is None and not self.tiny:
            raise SpecError("oracle_at_counts: give checkpoint='...', a model trained with a pruner")
        if self.subset is not None and self.subset < 1:
            raise SpecError(f"oracle_at_counts: subset must be >= 1 or None, got {self.subset}")
        if self.batch < 1:
            raise SpecError(f"oracle_at_counts: batch must be >= 1, got {self.batch}")


class MaskChannel(Dataset):
    """Items of ``base`` with the item's object mask as one more input channel:
    ``(cat(image (C, H, W), mask (1, H, W)), target)``; ``targets`` and ``classes`` are ``base``'s."""

    def __init__(self, base: Dataset, mask_of: Any) -> None:
        self.base, self.mask_of = base, mask_of
        self.classes = getattr(base, "classes", None)
        targets = getattr(base, "targets", None)
        if targets is None and hasattr(base, "tensors"):
            targets = base.tensors[1]
        self.targets = targets

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[Tensor, Any]:
        x, y = self.base[i]
        m = self.mask_of(i).to(x.dtype)[None]
        if m.shape[-2:] != x.shape[-2:]:
            raise TokenReduceError(f"oracle_at_counts: item {i}'s mask is {tuple(m.shape[-2:])}, its image "
                                   f"{tuple(x.shape[-2:])}")
        return torch.cat([x, m]), y


class MaskFed(nn.Module):
    """``model`` (patched with the oracle) fed its priority from the last input channel:
    x (B, C + 1, H, W) -> model(x[:, :C]) under ``oracle_priority(patch_fractions(x[:, C], grid))``."""

    def __init__(self, model: nn.Module, grid: tuple[int, int]) -> None:
        super().__init__()
        self.model, self.grid = model, grid

    def forward(self, x: Tensor) -> Tensor:
        from ..methods.oracle import oracle_priority, patch_fractions

        with oracle_priority(self.model, patch_fractions(x[:, -1] > 0.5, self.grid)):
            return self.model(x[:, :-1])


@register_experiment("oracle_at_counts")
class OracleAtCounts(Experiment):
    """The checkpoint's own pruner, the oracle at its counts and the unpruned model, on the same weights."""

    Config = OracleAtCountsConfig
    claim = ("A content-based scorer keeps the informative tokens. Falsifier: at the same per-block counts, an "
             "oracle that keeps the object's tokens first scores far higher on the same weights.")
    source = "review of EET (arXiv 2504.16691)"
    smoke = {"tiny": True, "subset": 8, "batch": 4}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        from ..api import apply, get_info, remove
        from ..methods.oracle import oracle_spec

        cfg = self.cfg
        model, task, data, source = self._setup(ctx)
        if data.masks is None:
            raise TokenReduceError(f"oracle_at_counts needs a test set with object masks (the scenes); "
                                   f"{data.info['name']!r} has none")
        info = get_info(model)
        own = info.spec
        oracle = oracle_spec(info.schedule, ties=cfg.ties)
        grid = tuple(info.host.grid)
        test = MaskChannel(data.test, lambda i: data.masks[i])
        database = MaskChannel(data.database, _object_masks(data.database))
        dev = torch.device(ctx.device)

        def evaluate(fed: bool) -> dict[str, Any]:
            with ctx.autocast():
                if fed:
                    return task.evaluate(MaskFed(model, grid), test, batch_size=cfg.batch, device=dev,
                                         database=database, items=True)
                return task.evaluate(model, data.test, batch_size=cfg.batch, device=dev, database=data.database)

        ctx.log(f"oracle_at_counts: {source}, {len(data.test)} test items; own {own}")
        rows = {"own": evaluate(False)}
        remove(model)
        apply(model, oracle)
        ctx.log(f"oracle_at_counts: {oracle}")
        rows["object_first"] = evaluate(True)
        remove(model)
        rows["unpruned"] = evaluate(False)
        per_item = rows["object_first"]["items"]
        rows = {k: _scalars(v) for k, v in rows.items()}
        return {"checkpoint": source, "spec": own, "oracle_spec": oracle, "metric": task.metric,
                "items": len(data.test), "counts": [int(info.schedule.counts[b]) for b in info.schedule.locs],
                "locs": list(info.schedule.locs), "rows": rows,
                "metrics": {**rows["object_first"], "items": per_item}}

    def _setup(self, ctx: RunContext) -> tuple[nn.Module, Any, Any, str]:
        """(model patched with its own reducer, in eval mode; its bound task; EvalData; where from)."""
        from ..bench.accuracy import bind_task
        from ..bench.evaluation import Reference, load_data
        from ..models import ModelSource, make_model, read_checkpoint

        cfg = self.cfg
        if cfg.tiny:
            return self._tiny(ctx)
        ckpt = read_checkpoint(cfg.checkpoint)
        built = make_model(ModelSource(checkpoint=ckpt), ctx.device)
        if not built.meta.get("spec"):
            raise TokenReduceError(f"{ckpt.path} holds an unreduced model; oracle_at_counts needs one trained with "
                                   "a pruner (its counts are the oracle's)")
        task = bind_task(built.model, ckpt)
        ref = Reference(str(ckpt.path), built.model.eval(), built.meta, task)
        return ref.model, task, load_data(ref, data=cfg.data, data_dir=cfg.data_dir, subset=cfg.subset), str(ckpt.path)

    def _tiny(self, ctx: RunContext) -> tuple[nn.Module, Any, Any, str]:
        from ..adapters.hosts import check_host
        from ..api import apply
        from ..bench.evaluation import Reference, load_data
        from ..core.method import matched_spec
        from ..core.schedule import from_counts
        from ..data.fashion_mnist import make_synthetic
        from ..models import build_model
        from ..tasks import TaskContext, build_task

        torch.manual_seed(0)
        model = build_model(TINY).to(ctx.device).eval()
        host = check_host(model)
        n = host.num_patches
        apply(model, matched_spec(from_counts(n, host.depth, (n // 2, n // 4), (3, 7), "block", "smoke"), 0))
        root = make_synthetic(ctx.out_dir / "synthetic", n_train=16, n_test=max(8, self.cfg.subset or 8))
        task = build_task("classify")
        task.bind(model, TaskContext(classes=[str(i) for i in range(10)]))
        ref = Reference("tiny", model, {"data": {"name": "fmnist_scenes"}}, task)
        return model, task, load_data(ref, data_dir=str(root), subset=self.cfg.subset), "a tiny random ViT (smoke)"

    def report(self, result: dict[str, Any]) -> str:
        keys = [k for k, v in result["rows"]["object_first"].items() if k != "n" and isinstance(v, (int, float))]
        head = (f"{result['checkpoint']}: {result['items']} test items; own = {result['spec']}, object_first = "
                f"{result['oracle_spec']} (counts {result['counts']} after blocks {result['locs']})")
        lines = [head, "", "| row | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
        for name, row in result["rows"].items():
            lines.append(f"| {name} | " + " | ".join(f"{row[k]:.2f}" if row.get(k) is not None else "-"
                                                     for k in keys) + " |")
        return "\n".join(lines)


def _object_masks(database: Dataset) -> Any:
    """``i -> mask`` of the database items (read when an item is, so a task that never encodes the
    database never builds it)."""
    def mask_of(i: int) -> Tensor:
        base = getattr(database, "base", database)
        if not callable(getattr(base, "object_mask", None)):
            raise TokenReduceError("oracle_at_counts: the database has no object masks")
        return base.object_mask(i)

    return mask_of


def _scalars(metrics: dict[str, Any]) -> dict[str, Any]:
    """The task's scalar metrics (curves and per-class lists left out)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


__all__ = ["MaskChannel", "MaskFed", "OracleAtCounts", "OracleAtCountsConfig"]

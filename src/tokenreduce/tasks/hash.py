"""``hash``: deep hashing on top of a classifier, scored by retrieval mAP (Hamming ranking).

The deep-hashing baseline of EET (arXiv 2504.16691; official code github.com/WhiteJiang/EET,
``model/vit.py``, ``train_model.py``, ``utils.py``). There the hash head sits on the class
logits: LayerNorm -> CLS token -> class head Linear(D, C) -> hash head Linear(C, bits). Here the
model keeps its own head (whatever pooling it has) and the task owns ``head = Linear(C, bits)``
on its logits (B, C):

    h = W z + b,  z = model(x) (B, C),  h (B, bits);  code = sign(h) in {-1, +1} (0 -> +1)

Losses (names as returned, already weighted):
    ``hash``      ``hash_weight * MSE(h, t)``, mean over batch and bits, toward fixed +-1 target
                  codes t (B, bits);
    ``ce``        ``ce_weight * CE(z, y)`` with label smoothing ``ctx.label_smoothing`` (EET: 0.1 x
                  CE next to a unit-weight MSE); left out when ce_weight = 0;
    ``aux/<name>`` each auxiliary loss the model's reducer emitted in this forward.
Stats: ``acc`` (top-1 of z, percent), ``bit_acc`` (percent of bits where sign(h) = t).

Target codes (fixed at :meth:`bind`, buffers, so checkpoints hold them):
    ``targets='class'``: one code per class, ``class_codes`` (C, bits). Drawn at random with a
        seeded generator (``code_seed``, default the run's seed), each bit balanced over the
        classes (ceil(C/2) classes at +1, the rest at -1); of 64 such draws the one with the
        largest minimum Hamming distance between two classes is kept (first on ties). With fewer
        than log2(C) bits some classes necessarily share a code.
    ``targets='image'``: one code per training image, ``image_codes`` (n, bits), row i = the code
        of the i-th training item; initialised from its class code (so the values equal 'class'
        until something else fills the table with :meth:`set_image_codes`, e.g. EET's per-image
        FISH codes). Training items then carry their index: :meth:`dataset` with ``train=True``
        yields targets ``[label, index]`` (collated (B, 2)), ``index`` = the position in the
        dataset it returned, and ``ctx.train_labels`` must list that dataset's labels in that order
        (a mismatch is caught in ``forward``: the stored label of the row must equal the label).

Retrieval (:meth:`evaluate`): queries = ``data`` encoded by the model, ``sign(h)``; the
database = ``database`` (the training set; ``db_subset`` caps it to a fixed random subset,
seed 0, the same items for both protocols), relevant = same class. Protocols:
    ``asym``  database codes = the learned TARGET codes of the database items (class code of
              their label, or their per-image row) - what EET's code reports (``calc_map_k`` of
              test codes against ``train_codes``); needs only the database's labels;
    ``sym``   database codes = sign(h) of the database images encoded by the model.
``protocol='both'`` computes both; the primary ``map`` is then the asymmetric one (EET's).
Ranking, tie rule (equal distance -> lower database index first) and the AP formula:
:mod:`tokenreduce.tasks.retrieval`. Reported in percent: ``map``, ``map_<p>``, ``p@<k>_<p>``;
PR curves ``pr_<p>`` (fractions) per protocol p; also ``top1`` of the logits, ``n_query``,
``n_db``, ``bits``, ``protocols``. With ``database=None`` the asymmetric protocol runs on
``ctx.train_labels`` (the symmetric one, which needs images, is then skipped and ``protocols``
says so).

Deviations from EET: per-class random targets by default (EET solves per-image FISH targets,
which the ``eet`` task fills with :meth:`set_image_codes`); a deterministic tie rule (EET sorts unstably);
queries without a relevant database item are left out of the mean (EET counts them as 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from ..api import capture
from ..core.errors import SpecError, TokenReduceError
from ..data import subset
from . import _dist
from . import retrieval as R
from .base import Task, TaskContext, TaskOutput, dataset_labels, register_task
from .items import encode

Targets = Literal["class", "image"]
TARGETS: tuple[str, ...] = get_args(Targets)
Protocol = Literal["both", "asym", "sym"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
CODE_DRAWS = 64  # candidate class-code sets drawn; the best separated one is kept


@dataclass(frozen=True)
class HashConfig:
    """``bits``: code length (>= 2); ``targets``: 'class' | 'image'; ``protocol``: 'both' | 'asym' |
    'sym'; ``hash_weight``, ``ce_weight``: loss weights; ``code_seed``: seed of the class codes
    (None: the run's seed); ``db_subset``: evaluate against a fixed random subset of this many
    database items (None: all); ``ks``: the k of precision@k."""

    bits: int = 32
    targets: Targets = "class"
    protocol: Protocol = "both"
    hash_weight: float = 1.0
    ce_weight: float = 0.1
    code_seed: int | None = None
    db_subset: int | None = None
    ks: int | tuple[int, ...] = (1, 10, 100, 1000)

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or self.bits < 2:
            raise SpecError(f"hash: bits must be an integer >= 2 (e.g. 16, 32, 48, 64), got {self.bits!r}")
        if self.targets not in TARGETS:
            raise SpecError(f"hash: unknown targets {self.targets!r}; choose from {', '.join(TARGETS)}")
        if self.protocol not in PROTOCOLS:
            raise SpecError(f"hash: unknown protocol {self.protocol!r}; choose from {', '.join(PROTOCOLS)}")
        if not (self.hash_weight >= 0 and self.ce_weight >= 0) or self.hash_weight + self.ce_weight == 0:
            raise SpecError(f"hash: weights must be >= 0 and not both 0, got hash_weight={self.hash_weight}, "
                            f"ce_weight={self.ce_weight}")
        if self.db_subset is not None and (not isinstance(self.db_subset, int) or self.db_subset < 1):
            raise SpecError(f"hash: db_subset must be a positive number of items or None, got {self.db_subset!r}")
        ks = (self.ks,) if isinstance(self.ks, int) else tuple(self.ks)
        if not ks or not all(isinstance(k, int) and k >= 1 for k in ks):
            raise SpecError(f"hash: ks must be positive integers, got {self.ks!r}")
        object.__setattr__(self, "ks", ks)


def class_codes(num_classes: int, bits: int, seed: int, draws: int = CODE_DRAWS) -> Tensor:
    """(C, bits) int8 +-1 codes, each bit balanced over the classes (ceil(C/2) at +1); the best
    separated (largest minimum pairwise Hamming distance, first on ties) of ``draws`` seeded draws."""
    if num_classes < 1 or bits < 1:
        raise TokenReduceError(f"class codes need >= 1 class and >= 1 bit, got {num_classes}, {bits}")
    g = torch.Generator().manual_seed(int(seed))
    column = torch.tensor([1] * -(-num_classes // 2) + [-1] * (num_classes // 2), dtype=torch.int8)
    best, best_d = None, -1
    for _ in range(draws if num_classes > 1 else 1):
        codes = torch.stack([column[torch.randperm(num_classes, generator=g)] for _ in range(bits)], 1)  # (C, bits)
        f = codes.float()
        dist = (bits - f @ f.T) / 2 + torch.eye(num_classes) * (bits + 1)  # diagonal out of the minimum
        d = int(dist.min()) if num_classes > 1 else bits
        if d > best_d:
            best, best_d = codes, d
    return best


def binarize(h: Tensor) -> Tensor:
    """sign(h) with 0 -> +1, as float +-1 (same shape)."""
    return torch.where(h >= 0, 1.0, -1.0).to(h.dtype if h.is_floating_point() else torch.float32)


class _Indexed(Dataset):
    """Items ``(image, tensor([label, i]))``: the training set as per-image targets need it."""

    def __init__(self, base: Dataset) -> None:
        self.base = base
        self.classes = getattr(base, "classes", None)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int):
        image, label = self.base[i]
        return image, torch.tensor([int(label), int(i)], dtype=torch.long)


def labels_of(targets: Tensor) -> Tensor:
    """(B,) labels from targets (B,) or (B, 2) [label, index]."""
    return targets[:, 0] if targets.dim() == 2 else targets


@register_task("hash")
class Hash(Task):
    """Deep hashing: ``Linear(C, bits)`` on the model's logits, MSE to fixed +-1 codes (module
    docstring: losses, target codes, the two retrieval protocols, the reported metrics)."""

    Config = HashConfig
    metric = "map"
    example: dict[str, Any] = {"bits": 8}

    def bind(self, model: nn.Module, ctx: TaskContext) -> None:
        super().bind(model, ctx)
        cfg = self.cfg
        if ctx.teacher is not None or ctx.distill:
            raise TokenReduceError("hash: distillation is not part of the hashing baseline; drop --teacher/--distill")
        num_classes = getattr(model, "num_classes", None)
        if not isinstance(num_classes, int) or num_classes < 1:
            raise TokenReduceError("hash: the model needs a classification head (num_classes >= 1): the hash head "
                                   "reads its logits")
        if ctx.classes and len(ctx.classes) != num_classes:
            raise TokenReduceError(f"hash: the model has {num_classes} outputs but the data {len(ctx.classes)} classes")
        seed = ctx.seed if cfg.code_seed is None else cfg.code_seed
        self.head = nn.Linear(num_classes, cfg.bits)
        self.register_buffer("class_codes", class_codes(num_classes, cfg.bits, seed))  # (C, bits) int8
        labels = ctx.train_labels
        if labels is not None:
            labels = torch.as_tensor(labels, dtype=torch.long).cpu()
            if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
                raise TokenReduceError(f"hash: training labels outside 0..{num_classes - 1}")
        self._train_labels = labels  # not saved: the asymmetric database when evaluate gets none
        self._matched = False  # a training batch's items checked against the table (target_codes)
        if cfg.targets == "image":
            # bound for evaluation (no training labels) the table starts empty and takes its size
            # from the checkpoint (load_owned_state_dict); training on an empty table stops clearly
            if labels is None:
                labels = torch.zeros(0, dtype=torch.long)
            self.register_buffer("image_labels", labels.clone())  # (n,) to check each row's item
            self.register_buffer("image_codes", self.class_codes[labels].clone())  # (n, bits) int8
        dev = self._device_of(model)  # owned tensors start where the model is
        self.head.to(dev)
        for name in ("class_codes", "image_labels", "image_codes"):
            if hasattr(self, name):
                setattr(self, name, getattr(self, name).to(dev))

    @staticmethod
    def _device_of(model: nn.Module) -> torch.device:
        p = next(model.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def load_owned_state_dict(self, sd: dict[str, Tensor]) -> None:
        """As the base class; a per-image table bound empty (evaluation) takes the saved size."""
        for name in ("image_labels", "image_codes"):
            if name in sd and getattr(self, name, None) is not None and getattr(self, name).numel() == 0:
                setattr(self, name, torch.empty_like(sd[name], device=getattr(self, name).device))
        super().load_owned_state_dict(sd)

    def set_image_codes(self, codes: Tensor) -> None:
        """Replace the per-image targets (``targets='image'``) by ``codes`` (n, bits) of +-1."""
        if self.cfg.targets != "image":
            raise TokenReduceError("set_image_codes needs hash(targets='image')")
        if tuple(codes.shape) != tuple(self.image_codes.shape) or not bool((codes.abs() == 1).all()):
            raise TokenReduceError(f"per-image codes must be +-1 of shape {tuple(self.image_codes.shape)}, "
                                   f"got {tuple(codes.shape)}")
        self.image_codes.copy_(codes.to(self.image_codes))

    def dataset(self, name: str, split: str, *, train: bool, **data_kw: Any) -> Dataset:
        """``data.build_dataset``; with ``targets='image'`` and ``train=True`` each item's target
        is ``[label, index]`` (see the module docstring)."""
        ds = super().dataset(name, split, train=train, **data_kw)
        return _Indexed(ds) if train and self.cfg.targets == "image" else ds

    # -- training

    def target_codes(self, targets: Tensor) -> Tensor:
        """(B, bits) float +-1 target codes of a batch's targets ((B,) labels or (B, 2) [label, index])."""
        labels = labels_of(targets)
        if self.cfg.targets == "class":
            return self.class_codes[labels].float()
        if targets.dim() != 2:
            raise TokenReduceError("hash(targets='image') trains on items that carry their index; build the "
                                   "training set with the task's dataset(..., train=True)")
        index = targets[:, 1]
        n = self.image_codes.shape[0]
        if n == 0 or ((not index.is_cuda or not self._matched)
                      and (bool((index < 0).any() or (index >= n).any())
                           or not bool((self.image_labels[index] == labels).all()))):
            raise TokenReduceError("hash(targets='image'): a training item's index/label does not match the "
                                   f"{n} per-image targets made at bind time; TaskContext.train_labels must be the "
                                   "labels of the dataset returned by the task's dataset(), in its order")
        # on a GPU each check is a host sync: after a first batch that matched, an index out of range still
        # stops there (a device-side assert), and a dataset in another order would have failed the first batch
        self._matched = True
        return self.image_codes[index].float()

    def forward(self, images: Tensor, targets: Tensor) -> TaskOutput:
        """images (B, C, H, W), targets (B,) labels or (B, 2) [label, index]."""
        labels = labels_of(targets)
        with capture(self.model) as seen:
            logits = self.model(images)  # (B, C)
        h = self.head(logits)  # (B, bits)
        t = self.target_codes(targets)
        losses = {"hash": self.cfg.hash_weight * F.mse_loss(h.float(), t)}
        if self.cfg.ce_weight:
            losses["ce"] = self.cfg.ce_weight * F.cross_entropy(logits, labels,
                                                                label_smoothing=self.ctx.label_smoothing)
        info = seen.last
        if info is not None:
            losses.update({f"aux/{k}": v for k, v in info.aux_losses.items()})
        with torch.no_grad():
            stats = {"acc": 100.0 * (logits.argmax(-1) == labels).float().mean(),
                     "bit_acc": 100.0 * (binarize(h) == t).float().mean()}
        return TaskOutput(losses, logits, stats)

    # -- evaluation

    def _encode(self, model: nn.Module, data: Dataset, batch_size: int, device: torch.device
                ) -> tuple[Tensor, Tensor, Tensor]:
        """(codes (n, bits) float +-1, labels (n,), correct (n,) 0/1 float) of ``data`` through model and
        head, in dataset order (each process encodes its shard; gathered in a process group)."""
        weight, bias = self.head.weight.to(device), self.head.bias.to(device)
        codes, labels, correct = [], [], []
        for images, targets in _dist.shard_loader(data, batch_size, device):
            logits = model(images.to(device, non_blocking=True))
            if logits.shape[-1] != weight.shape[1]:
                raise TokenReduceError(f"hash: the model gives {logits.shape[-1]} outputs, the hash head reads "
                                       f"{weight.shape[1]}")
            y = labels_of(torch.as_tensor(targets)).to(device)
            codes.append(binarize(F.linear(logits.float(), weight.float(), bias.float())))
            labels.append(y)
            correct.append((logits.argmax(-1) == y).float())  # float: every backend gathers it
        if not codes:
            codes, labels, correct = [torch.empty(0, weight.shape[0], device=device)], [
                torch.empty(0, dtype=torch.long, device=device)], [torch.empty(0, device=device)]
        n = len(data)
        return (_dist.gather_shards(torch.cat(codes), n), _dist.gather_shards(torch.cat(labels), n),
                _dist.gather_shards(torch.cat(correct), n))

    def _database(self, database: Dataset | None) -> tuple[Dataset | None, Tensor, Tensor]:
        """(database items to encode or None, their labels (m,), their rows in the training set (m,))."""
        if database is None:
            if self._train_labels is None:
                raise TokenReduceError("hash evaluation needs a database: pass database= (the training set) or bind "
                                       "the task with TaskContext.train_labels")
            n = len(self._train_labels)
            rows = self._subset_rows(n)
            return None, self._train_labels[rows], rows

        n = len(database)
        if n == 0:
            raise TokenReduceError("hash evaluation: the database is empty")
        sub = subset(database, self.cfg.db_subset, seed=0)
        rows = torch.as_tensor(getattr(sub, "indices", range(n)) if sub is not database else range(n),
                               dtype=torch.long)
        labels = dataset_labels(sub)
        if labels is None:  # no per-item label list: read the items (loads the images once)
            labels = torch.tensor([int(labels_of(torch.as_tensor(sub[i][1])).item()) for i in range(len(sub))])
        return sub, labels, rows

    def _subset_rows(self, n: int) -> Tensor:
        # the same fixed random choice as data.subset(seed=0), so both database kinds agree
        if self.cfg.db_subset is None or self.cfg.db_subset >= n:
            return torch.arange(n)
        g = torch.Generator().manual_seed(0)
        return torch.randperm(n, generator=g)[: self.cfg.db_subset].sort().values

    def _asym_codes(self, labels: Tensor, rows: Tensor) -> Tensor:
        """(m, bits) target codes of database items: class codes of ``labels``, or per-image ``rows``."""
        if self.cfg.targets == "class":
            return self.class_codes.cpu()[labels].float()
        n = self.image_codes.shape[0]
        img_labels = self.image_labels.cpu()
        if int(rows.max()) >= n or not bool((img_labels[rows] == labels).all()):
            raise TokenReduceError(f"hash(targets='image'): the database is not the training set of the {n} "
                                   "per-image targets (asymmetric protocol); pass that training set or use "
                                   "protocol='sym'")
        return self.image_codes.cpu()[rows].float()

    @torch.inference_mode()
    def evaluate(self, model: nn.Module, data: Dataset, *, batch_size: int = 500,
                 device: str | torch.device = "cpu", database: Dataset | None = None,
                 items: bool = False) -> dict[str, Any]:
        """Retrieval metrics of ``model`` + this task's hash head: ``data`` = queries,
        ``database`` = the training set (module docstring: protocols, keys, units). With ``items``:
        each query's correct or not (``top1``) and AP per protocol (``map_<p>``; NaN for a query with
        no relevant item, which the mean leaves out), under ``items``."""
        if not hasattr(self, "head"):
            raise TokenReduceError("hash: bind the task to a model before evaluating")
        device = torch.device(device)
        protos = ["asym", "sym"] if self.cfg.protocol == "both" else [self.cfg.protocol]
        db_items, db_labels, rows = self._database(database)
        if db_items is None and "sym" in protos:
            if protos == ["sym"]:
                raise TokenReduceError("hash(protocol='sym') needs database= (the training set images)")
            protos = ["asym"]
        was_training = model.training
        model.eval()
        try:
            q_codes, q_labels, correct = self._encode(model, data, batch_size, device)
            if q_codes.shape[0] == 0:
                raise TokenReduceError("hash evaluation: the query set is empty")
            out: dict[str, Any] = {"bits": self.cfg.bits, "n_query": int(q_codes.shape[0]), "n_db": int(len(rows)),
                                   "top1": 100.0 * correct.float().mean().item(), "protocols": protos}
            per_item = {"top1": encode(correct > 0.5)}
            for p in protos:
                if p == "asym":
                    db_codes = self._asym_codes(db_labels, rows).to(device)
                    labels = db_labels.to(device)
                else:
                    db_codes, labels, _ = self._encode(model, db_items, batch_size, device)
                metrics, aps = self._metrics(p, q_codes, q_labels, db_codes, labels)
                out.update(metrics)
                per_item[f"map_{p}"] = encode(aps)
        finally:
            model.train(was_training)
        out["map"] = out[f"map_{protos[0]}"]
        if items:
            out["items"] = per_item
        return out

    def _metrics(self, p: str, q: Tensor, ql: Tensor, db: Tensor, dl: Tensor) -> tuple[dict[str, Any], Tensor]:
        """Protocol ``p``'s metrics, and each query's AP (Q,)."""
        per_query = R.per_query_ap_and_precision(q, ql, db, dl, ks=self.cfg.ks)
        out: dict[str, Any] = {f"map_{p}": 100.0 * R.mean_defined(per_query[:, 0], "mAP")}
        out.update({f"p@{k}_{p}": 100.0 * R.mean_defined(per_query[:, 1 + i], f"precision@{k}")
                    for i, k in enumerate(self.cfg.ks)})
        out[f"pr_{p}"] = R.pr_curve(q, ql, db, dl)
        return out, per_query[:, 0]

    def plot(self, metrics: dict[str, Any], out_dir: str | Path) -> list[Path]:
        """``pr_<bits>bits.png`` under ``out_dir``: the precision-recall curve of each protocol."""
        curves = {f"{p} (mAP {metrics[f'map_{p}']:.2f})": metrics[f"pr_{p}"] for p in ("asym", "sym")
                  if f"pr_{p}" in metrics}
        if not curves:
            return []
        bits = metrics.get("bits", self.cfg.bits)
        title = f"hash {bits} bits: Hamming radius 0..{bits}"
        return [R.plot_pr_curve(curves, Path(out_dir) / f"pr_{bits}bits.png", title=title)]


__all__ = ["Hash", "HashConfig", "binarize", "class_codes"]

"""The ``hash`` task on a tiny timm ViT: losses, a training step, codes, both retrieval protocols."""

from __future__ import annotations

import pytest
import torch
from conftest import make_host
from torch.utils.data import Dataset

import tokenreduce.data
from tokenreduce.core.errors import SpecError, TokenReduceError
from tokenreduce.tasks import TaskContext, build_task
from tokenreduce.tasks import hash as H
from tokenreduce.tasks import retrieval as R

CLASSES = [str(i) for i in range(10)]


class Toy(Dataset):
    """n random 32x32 images, label i % 10, with ``targets`` and ``classes`` like the real sets."""

    def __init__(self, n: int, seed: int) -> None:
        self.x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
        self.targets = [i % 10 for i in range(n)]
        self.classes = CLASSES

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        return self.x[i], self.targets[i]


def _bound(spec: str = "hash(bits=8)", train: Dataset | None = None):
    model = make_host("deit")
    task = build_task(spec)
    labels = torch.tensor(train.targets) if train is not None else None
    task.bind(model, TaskContext(classes=CLASSES, train_labels=labels, seed=0, label_smoothing=0.1))
    return task


def test_forward_losses_and_one_step_changes_the_head(images):
    task = _bound()
    task.train()
    labels = torch.tensor([0, 3, 7])
    out = task(images, labels)
    assert set(out.losses) == {"hash", "ce"} and all(torch.isfinite(v) for v in out.losses.values())
    assert out.logits.shape == (3, 10) and set(out.stats) == {"acc", "bit_acc"}
    expected = torch.nn.functional.mse_loss(task.head(out.logits), task.class_codes[labels].float())
    assert out.losses["hash"].item() == pytest.approx(expected.item(), rel=1e-5)
    before = task.head.weight.detach().clone()
    opt = torch.optim.SGD([p for g in task.param_groups(0.1, 0.0) for p in g["params"]], lr=0.1, momentum=0.9)
    sum(out.losses.values()).backward()
    assert task.head.weight.grad.abs().sum() > 0 and task.model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(before, task.head.weight)
    assert {k for k in task.owned_state_dict()} == {"head.weight", "head.bias", "class_codes"}


def test_class_codes_are_balanced_distinct_and_seeded():
    c = H.class_codes(10, 16, seed=0)
    assert c.shape == (10, 16) and set(c.unique().tolist()) == {-1, 1}
    assert c.sum(0).abs().max() == 0  # each bit: 5 classes at +1, 5 at -1
    assert len({tuple(r) for r in c.tolist()}) == 10
    assert torch.equal(c, H.class_codes(10, 16, seed=0)) and not torch.equal(c, H.class_codes(10, 16, seed=1))
    assert H.binarize(torch.tensor([-0.5, 0.0, 2.0])).tolist() == [-1.0, 1.0, 1.0]
    model = make_host("deit")
    for bits in (16, 32, 48, 64):
        task = build_task(f"hash(bits={bits})")
        task.bind(model, TaskContext(classes=CLASSES))
        assert task.class_codes.shape == (10, bits) and task.head.out_features == bits


@pytest.mark.parametrize("spec,match", [("hash(bits=1)", "bits must be an integer >= 2"),
                                        ("hash(targets='pixel')", "targets takes 'class' or 'image'"),
                                        ("hash(protocol='x')", "protocol takes 'both', 'asym' or 'sym'"),
                                        ("hash(hash_weight=0, ce_weight=0)", "not both 0"),
                                        ("hash(db_subset=0)", "db_subset")])
def test_bad_specs_are_clear_errors(spec, match):
    with pytest.raises(SpecError, match=match):
        build_task(spec)


def test_evaluate_both_protocols_match_direct_computation(tmp_path):
    task = _bound("hash(bits=8, ks=(1, 5))", train=Toy(20, 1))
    query, db = Toy(8, 2), Toy(20, 1)
    m = task.evaluate(task.model, query, batch_size=10, database=db)  # the database in two batches
    assert m["protocols"] == ["asym", "sym"] and m["map"] == m["map_asym"]
    assert m["n_query"] == 8 and m["n_db"] == 20 and m["bits"] == 8
    for key in ("map_sym", "p@1_asym", "p@5_asym", "p@1_sym", "p@5_sym", "top1"):
        assert 0.0 <= m[key] <= 100.0
    assert len(m["pr_asym"]["recall"]) == 9 and m["pr_sym"]["recall"][-1] == pytest.approx(1.0)
    # independently: codes = sign(head(model(x))); asymmetric database = class codes of the labels
    with torch.no_grad():
        q = H.binarize(task.head(task.model(query.x)))
        d = H.binarize(task.head(task.model(db.x)))
    ql, dl = torch.tensor(query.targets), torch.tensor(db.targets)
    asym = R.mean_average_precision(q, ql, task.class_codes[dl].float(), dl)
    assert m["map_asym"] == pytest.approx(100 * asym)
    assert m["map_sym"] == pytest.approx(100 * R.mean_average_precision(q, ql, d, dl))
    assert m["p@5_sym"] == pytest.approx(100 * R.precision_at_k(q, ql, d, dl, ks=(5,))[5])
    paths = task.plot(m, tmp_path)
    assert [p.name for p in paths] == ["pr_8bits.png"] and paths[0].read_bytes()[:4] == b"\x89PNG"


def test_evaluate_db_subset_and_database_from_train_labels():
    train = Toy(30, 1)
    task = _bound("hash(bits=8, db_subset=12)", train=train)
    m = task.evaluate(task.model, Toy(6, 2), database=train)
    assert m["n_db"] == 12
    sub = tokenreduce.data.subset(train, 12, seed=0)
    with torch.no_grad():
        q = H.binarize(task.head(task.model(torch.stack([Toy(6, 2)[i][0] for i in range(6)]))))
    dl = torch.tensor([train.targets[i] for i in sub.indices])
    ref = R.mean_average_precision(q, torch.arange(6) % 10, task.class_codes[dl].float(), dl)
    assert m["map_asym"] == pytest.approx(100 * ref)
    # no database given: the asymmetric protocol runs on the bound training labels, same subset
    m2 = task.evaluate(task.model, Toy(6, 2))
    assert m2["protocols"] == ["asym"] and m2["map"] == pytest.approx(m["map_asym"]) and "map_sym" not in m2
    with pytest.raises(TokenReduceError, match="needs database"):
        _bound("hash(bits=8, protocol='sym')", train=train).evaluate(task.model, Toy(6, 2))


def test_per_image_targets(monkeypatch):
    train = Toy(20, 1)
    monkeypatch.setattr(tokenreduce.tasks.base, "build_dataset", lambda *a, **k: train)
    task = _bound("hash(bits=8, targets='image', protocol='asym')", train=train)
    ds = task.dataset("toy", "train", train=True)
    image, target = ds[13]
    assert target.tolist() == [3, 13] and task.dataset("toy", "test", train=False) is train
    assert torch.equal(task.image_codes, task.class_codes[torch.tensor(train.targets)])
    assert "image_codes" in task.owned_state_dict()
    targets = torch.stack([ds[i][1] for i in (1, 13, 4)])  # (3, 2) [label, index]
    images = torch.stack([ds[i][0] for i in (1, 13, 4)])
    new = torch.where(torch.rand(20, 8, generator=torch.Generator().manual_seed(0)) < 0.5, 1, -1)
    task.set_image_codes(new)
    assert torch.equal(task.target_codes(targets), new[[1, 13, 4]].float())
    assert torch.isfinite(task(images, targets).losses["hash"])
    with pytest.raises(TokenReduceError, match="does not match"):
        task.target_codes(torch.tensor([[2, 13]]))  # item 13 has label 3
    with pytest.raises(TokenReduceError, match="carry their index"):
        task.target_codes(torch.tensor([3]))
    # asymmetric database = the per-image rows of the training set
    m = task.evaluate(task.model, Toy(6, 2), database=train)
    with torch.no_grad():
        q = H.binarize(task.head(task.model(Toy(6, 2).x)))
    ref = R.mean_average_precision(q, torch.arange(6) % 10, new.float(), torch.tensor(train.targets))
    assert m["map_asym"] == pytest.approx(100 * ref)
    # bound for evaluation (no training labels), the per-image table takes its size from the checkpoint
    fresh = build_task("hash(bits=8, targets='image', protocol='asym')")
    fresh.bind(task.model, TaskContext(classes=CLASSES, seed=0))
    with pytest.raises(TokenReduceError, match="does not match|carry"):
        fresh.target_codes(torch.tensor([[3, 13]]))  # an empty table trains on nothing
    fresh.load_owned_state_dict(task.owned_state_dict())
    assert torch.equal(fresh.image_codes, new.to(fresh.image_codes)) and fresh.image_labels.shape == (20,)
    assert fresh.evaluate(task.model, Toy(6, 2), database=train)["map_asym"] == pytest.approx(m["map_asym"])


def test_checkpoint_round_trip_keeps_codes():
    a = _bound("hash(bits=8, code_seed=3)")
    b = _bound("hash(bits=8, code_seed=4)")
    assert not torch.equal(a.class_codes, b.class_codes)
    b.load_owned_state_dict(a.owned_state_dict())
    assert torch.equal(a.class_codes, b.class_codes) and torch.equal(a.head.weight, b.head.weight)

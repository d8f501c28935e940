"""Token Cropr: the collapsed scorer keeps what the per-query scorer keeps, the stop-gradient, the
auxiliary predictions scored by the tasks, the warm-up, the deployed form and its checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import Interrupted, make_host, stop_at
from timm.models.vision_transformer import VisionTransformer

import tokenreduce as tr
from tokenreduce.bench import count_macs, flop_counter_macs
from tokenreduce.data.fashion_mnist import CLASSES, make_synthetic
from tokenreduce.models import deploy, export_inference, load_model, read_checkpoint, save_checkpoint
from tokenreduce.tasks import TaskContext, build_task
from tokenreduce.train.loop import TrainConfig, train

SPEC = "cropr(r=10, classes=10)"


def _reducer(model):
    return tr.reducer_of(model)


def _images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def test_one_query_collapsed_scorer_keeps_what_the_per_query_scorer_keeps() -> None:
    model = tr.apply(make_host("deit"), "cropr(r=12, queries=1, classes=10)", trace=True)
    images = _images(6)
    with torch.no_grad():
        model.train()  # per-query logits A = Q X^T summed over queries (the aggregator's path)
        model(images)
        trained = tr.get_info(model)
        model.eval()  # the collapsed score X q, q = sum of the queries
        model(images)
        deployed = tr.get_info(model)
    assert trained.tokens_per_block == deployed.tokens_per_block == [52, 40, 28, 28]
    assert set(trained.snapshots) == set(deployed.snapshots) == {0, 1, 2}
    for block in trained.snapshots:
        assert torch.equal(trained.snapshots[block], deployed.snapshots[block]), block
    assert torch.equal(trained.index, deployed.index)


def test_collapsed_score_is_the_sum_of_the_per_query_logits() -> None:
    model = tr.apply(make_host("registers"), "cropr(r=5, queries=7, heads=2, classes=10)")
    reducer = _reducer(model)
    x = torch.randn(3, 64 + 3, 64)
    router = reducer.stages[1]
    per_query = router.logits(x).sum((1, 2))[:, 3:]  # (B, M): summed over heads and queries
    torch.testing.assert_close(reducer.token_scores(x, 1), per_query, rtol=1e-5, atol=1e-5)
    soft = (router.logits(x) * 32**-0.5).softmax(-1).sum((1, 2))[:, 3:]
    torch.testing.assert_close(reducer.token_scores(x, 1, "softmax"), soft)


def test_auxiliary_losses_give_no_gradient_to_the_backbone() -> None:
    model = tr.apply(make_host("layerscale").train(), "cropr(r=8, queries=3, classes=10)")
    with tr.capture(model) as seen:  # the live record: the predictions keep their graph
        out = model(_images())
    aux = seen.last.aux_outputs
    assert set(aux) == {"cropr0", "cropr1", "cropr2"} and all(v.shape == (4, 3, 10) for v in aux.values())
    sum(v.logsumexp(-1).mean() for v in aux.values()).backward(retain_graph=True)
    backbone = {n: p for n, p in model.named_parameters() if not n.startswith("tokenreduce.")}
    router = {n: p for n, p in model.named_parameters() if n.startswith("tokenreduce.")}
    assert all(p.grad is None for p in backbone.values()), [n for n, p in backbone.items() if p.grad is not None]
    assert all(p.grad is not None and p.grad.any() for p in router.values())
    # and the main loss reaches the backbone, not the routers (selection is not differentiable)
    model.zero_grad(set_to_none=True)
    out.logsumexp(-1).mean().backward()
    assert all(p.grad is None for p in router.values())
    assert all(p.grad is not None for p in backbone.values())


def test_tasks_score_the_auxiliary_predictions_with_their_criterion() -> None:
    torch.manual_seed(0)
    model = tr.apply(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2,
                                       num_classes=10), "cropr(r=3, classes=10)")
    task = build_task("classify")
    task.bind(model, TaskContext(classes=list(CLASSES), label_smoothing=0.1))
    images, labels = _images(), torch.tensor([0, 3, 9, 1])
    out = task(images, labels)
    assert set(out.losses) == {"ce", "aux/cropr0", "aux/cropr1"}
    pred = tr.get_info(model).aux_outputs["cropr1"][:, 0]
    torch.testing.assert_close(out.losses["aux/cropr1"], F.cross_entropy(pred, labels, label_smoothing=0.1))
    tr.apply(model, "cropr(r=3, classes=10, queries=2)")
    with pytest.raises(tr.TokenReduceError, match=r"one prediction per image"):
        task(images, labels)


@pytest.mark.parametrize("deterministic_cuda", [False, True])
def test_segment_scores_per_patch_auxiliary_predictions(deterministic_cuda: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --deterministic on CUDA every pixel and cell CE takes the 1-D NLL (the 2-D kernel raises
    there): the branch is forced here on the CPU and no 4-D input may reach cross_entropy."""
    import tokenreduce.tasks.segment as segment

    if deterministic_cuda:
        monkeypatch.setattr(segment, "_deterministic_cuda", lambda t: True)
        plain = F.cross_entropy

        def rows_only(logits, *args, **kw):
            assert logits.dim() == 2, f"a {logits.dim()}-D cross-entropy: no deterministic CUDA kernel"
            return plain(logits, *args, **kw)
        monkeypatch.setattr(segment.F, "cross_entropy", rows_only)
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=56, patch_size=8, in_chans=1, embed_dim=32, depth=3, num_heads=2,
                            num_classes=10)  # 7 x 7 = 49 patches
    model = tr.apply(vit, "cropr(r=6, queries=49, classes=11)")
    task = build_task("segment")
    task.bind(model, TaskContext(classes=list(CLASSES)))
    images = torch.randn(2, 1, 56, 56)
    masks = torch.randint(0, 11, (2, 56, 56))
    out = task(images, masks)
    assert set(out.losses) == {"ce", "aux/cropr0", "aux/cropr1"}
    pred = tr.get_info(model).aux_outputs["cropr0"]  # (B, 49, 11)
    cells = pred.transpose(1, 2).reshape(2, 11, 7, 7)
    target = masks[:, ::8, ::8]  # nearest-neighbour sampling at the patch grid
    torch.testing.assert_close(out.losses["aux/cropr0"], F.cross_entropy(cells.movedim(1, -1).reshape(-1, 11),
                                                                       target.reshape(-1)))
    sum(out.losses.values()).backward()
    assert all(p.grad is not None for n, p in task.named_parameters() if ".stages." in n)
    tr.apply(model, "cropr(r=6, queries=49, classes=10)", dense=True)
    with pytest.raises(tr.TokenReduceError, match=r"\(B, 49, 11\)"):
        task(images, masks)


def test_warmup_raises_the_rate_linearly_and_counts_training_steps() -> None:
    model = tr.apply(make_host("deit"), "cropr(r=8, classes=10, warmup_steps=4)")
    reducer = _reducer(model)
    assert "tokenreduce.step" in model.state_dict()
    model.train()
    seen = []
    for _ in range(6):
        with torch.no_grad():
            model(_images(2))
        seen.append(tr.get_info(model).tokens_per_block)
    # R(t) = floor(8 t / 4) = 0, 2, 4, 6, then 8; the first module prunes one more
    assert seen[0] == [64, 64, 64, 64]
    assert seen[1] == [62, 60, 58, 58]
    assert seen[4] == seen[5] == [56, 48, 40, 40]
    assert int(reducer.step) == 6
    model.eval()
    with torch.no_grad():
        model(_images(2))
    assert tr.get_info(model).tokens_per_block == [56, 48, 40, 40] and int(reducer.step) == 6


def test_the_warmup_reads_its_step_once_and_again_after_a_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rate is a shape, so the step is counted on the host: the buffer is read once (no sync per step)
    and again after load_state_dict (a resumed run continues from the loaded step)."""
    model = tr.apply(make_host("deit"), "cropr(r=8, classes=10, warmup_steps=4)").train()
    reducer = _reducer(model)
    reads = []
    plain = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(1) or plain(t))
    with torch.no_grad():
        for _ in range(3):
            model(_images(2))
        assert len(reads) == 1 and int(reducer.step) == 3
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model(_images(2))
        model.load_state_dict(state)  # back to step 3: R(3) = 6, the first module one more
        model(_images(2))
    assert len(reads) == 2 and int(reducer.step) == 4
    assert tr.get_info(model).tokens_per_block == [58, 52, 46, 46]


def test_deployed_model_has_no_aggregator_or_aux_parameters(tmp_path: Path) -> None:
    model = tr.apply(make_host("distilled"), "cropr(r=9, queries=4, heads=2, classes=10, warmup_steps=3)")
    images = _images()
    with torch.no_grad():
        ref = model(images)
    trained_keys = {k for k in model.state_dict() if k.startswith("tokenreduce.")}
    assert any("queries" in k for k in trained_keys) and any("head" in k for k in trained_keys)
    deploy(model)
    spec = tr.get_info(model).spec
    assert "inference=True" in spec and "classes=None" in spec
    reducer = _reducer(model)
    assert not list(reducer.parameters())
    assert {k for k in model.state_dict() if k.startswith("tokenreduce.")} == {f"tokenreduce.stages.{i}.q"
                                                                                for i in range(3)}
    with torch.no_grad():
        torch.testing.assert_close(model(images), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(tr.TokenReduceError, match="cannot be trained"):
        model.train()(images)
    assert reducer.for_inference() is reducer


def test_inference_checkpoint_reloads_deployed_and_training_checkpoint_keeps_everything(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3,
                                                      "num_heads": 2, "num_classes": 10}}
    from tokenreduce.models import build_model

    model = tr.apply(build_model(cfg), "cropr(r=3, classes=10, queries=2)").eval()
    images = _images()
    with torch.no_grad():
        ref = model(images)
    save_checkpoint(tmp_path / "train.safetensors", model, meta={"model": cfg, "spec": tr.get_info(model).spec})
    train_keys = set(read_checkpoint(tmp_path / "train.safetensors").weights)
    assert any(k.endswith(".queries") for k in train_keys) and any(".head." in k for k in train_keys)
    export_inference(tmp_path / "train.safetensors", tmp_path / "infer.safetensors")
    keys = {k for k in read_checkpoint(tmp_path / "infer.safetensors").weights if k.startswith("tokenreduce.")}
    assert keys == {"tokenreduce.stages.0.q", "tokenreduce.stages.1.q"}
    deployed, meta = load_model(tmp_path / "infer.safetensors")
    assert "inference=True" in meta["spec"]
    back, _ = load_model(tmp_path / "train.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(deployed(images), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(images), ref, rtol=0, atol=0)
    assert any(".queries" in n for n, _ in back.named_parameters())


def test_training_resumes_exactly_with_the_step_counter(tmp_path: Path) -> None:
    data = str(make_synthetic(tmp_path / "fmnist", n_train=48, n_test=16))
    model = {"name": "vit_tiny_patch16_224",
             "kwargs": {"img_size": 28, "patch_size": 7, "embed_dim": 32, "depth": 3, "num_heads": 2, "in_chans": 1,
                        "num_classes": 10}}
    cfg = TrainConfig(model=model, spec="cropr(r=3, classes=10, warmup_steps=4)", data=data, epochs=2,
                      batch_size=16, lr=3e-3, warmup_epochs=0.5, threads=1, quiet=True, deterministic=True,
                      out=str(tmp_path / "a"), ckpt_every=2)
    full = train(cfg)
    assert "train_aux/cropr0" in full["history"][0] and full["steps"] == 6
    cut = dataclasses.replace(cfg, out=str(tmp_path / "b"))
    with pytest.raises(Interrupted):
        train(cut, on_step=stop_at(3))
    train(dataclasses.replace(cut, resume=True))
    a, b = read_checkpoint(tmp_path / "a").weights, read_checkpoint(tmp_path / "b").weights
    assert int(a["tokenreduce.step"]) == 6
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("score", ["logits", "softmax"])
def test_declared_scoring_macs_match_flop_counter(score: str) -> None:
    model = tr.apply(make_host("registers"), f"cropr(r=7, queries=3, classes=10, score={score!r})")
    report = count_macs(model)
    measured = flop_counter_macs(model) - (report.total - report.scoring)
    assert report.scoring == measured


def test_bad_specs_are_clear() -> None:
    host = make_host("deit")
    cases = {
        "cropr(r=4)": "give classes=K",
        "cropr(r=4, classes=10, heads=3)": "heads=3 does not divide",
        "cropr(r=30, classes=10)": "prunes all 64 patch tokens",
        "cropr(r=4, inference=True, score='softmax')": "score='softmax' needs the training form",
        "cropr(r=4, classes=10, score='mean')": "score='mean' is invalid; score takes 'logits' or 'softmax'",
        "cropr(r=-1, classes=10)": "r=-1 must be an int >= 0",
        "cropr(r=2, classes=10, locs=(5,))": "beyond the model's depth",
    }
    for spec, message in cases.items():
        with pytest.raises(tr.SpecError, match=message):
            tr.apply(host, spec)
    # the deployed form needs no classes and prunes with q
    tr.apply(host, "cropr(r=4, inference=True)")
    assert tr.get_info(host).schedule.counts == (59, 55, 51, 51)


def test_diagnostic_scores_rank_alike_with_one_query_and_measures_are_right() -> None:
    from tokenreduce.probes.cropr_diagnostics import kept_overlap, spearman

    a = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    torch.testing.assert_close(spearman(a, a[:1].expand(2, 4)), torch.tensor([1.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(kept_overlap(a, a[:1].expand(2, 4), 2), torch.tensor([1.0, 0.0], dtype=torch.float64))
    model = tr.apply(make_host("deit"), "cropr(r=8, classes=10)")
    reducer = _reducer(model)
    x = torch.randn(4, 65, 64, generator=torch.Generator().manual_seed(0))
    s, t = reducer.token_scores(x, 0, "logits"), reducer.token_scores(x, 0, "softmax")
    # one query: the softmax is monotone in the logit, so the two scores rank tokens identically
    torch.testing.assert_close(spearman(s, t), torch.ones(4, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(kept_overlap(s, t, 20), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("depth", [4, 6])
def test_default_placement_with_llf_is_the_official_count(depth: int) -> None:
    """The official model (github.com/benbergner/cropr, cls/vision_transformer.py) builds n_blk - 2
    modules with Last Layer Fusion (after blocks 0 .. n_blk - 3) and n_blk - 1 without."""
    torch.manual_seed(0)
    host = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=depth, num_heads=2, num_classes=10)
    model = tr.apply(host, "cropr(r=2, classes=10) + llf()")
    cropr = _reducer(model).stages[0]
    assert len(cropr.stages) == depth - 2
    pruned = [64 - 3 - 2 * i for i in range(depth - 2)]  # r + first at the first module, r after
    assert tr.get_info(model).schedule.counts == (*pruned, 64, 64)
    tr.remove(model)
    alone = tr.apply(host, "cropr(r=2, classes=10)")
    assert len(_reducer(alone).stages) == depth - 1

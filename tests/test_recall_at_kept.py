"""The ``recall_at_kept`` experiment: its pieces on hand-made inputs, and a run on a tiny model checked
against an independent computation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tokenreduce
from tokenreduce.core.errors import SpecError
from tokenreduce.data import FashionMNIST, build_dataset, data_config_from_model
from tokenreduce.models import build_model
from tokenreduce.probes import RunContext, build_experiment
from tokenreduce.probes import recall_at_kept as R

SPEC = "ctp(counts=(24, 12), locs=(1, 2))"  # on the 7x7-patch smoke model


def test_patch_foreground_uses_the_raw_threshold():
    raw = torch.zeros(1, 4, 4, dtype=torch.uint8)
    raw[0, 0, :2] = 52  # top-left 2x2 patch: 2 of 4 pixels above 51
    raw[0, 1, 0] = 51  # exactly the threshold: background
    raw[0, 2:, 2:] = 255  # bottom-right patch: all foreground
    f = R.patch_foreground(raw, (2, 2), threshold=51)
    assert f.tolist() == [[0.5, 0.0, 0.0, 1.0]]


def test_recall_of_tokens_counts_members():
    fg = torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # patches 0 and 2 on the object
    # tokens after a reduction: the class token, patch 2 alone, patches 0+1 merged, patch 3 alone
    snap = torch.zeros(1, 4, 5)
    snap[0, 0, 0] = 1
    snap[0, 1, 3] = 1
    snap[0, 2, [1, 2]] = 1
    snap[0, 3, 4] = 1
    total, n = R.recall_of_tokens(snap, fg, num_prefix=1)
    assert n == 3 and total == pytest.approx(1.0 + 0.5 + 0.0)


def test_oracle_keeps_foreground_first():
    frac = torch.tensor([[0.9, 0.5, 0.4, 0.0], [0.0, 0.0, 0.0, 1.0]])  # 2 and 1 foreground patches
    assert R.oracle_recall(frac, 1) == pytest.approx(1.0)
    assert R.oracle_recall(frac, 2) == pytest.approx((1.0 + 0.5) / 2)
    assert R.oracle_recall(frac, 4) == pytest.approx((0.5 + 0.25) / 2)


def test_spec_is_required_outside_smoke_mode():
    with pytest.raises(SpecError, match="give spec="):
        build_experiment("recall_at_kept")
    with pytest.raises(SpecError, match="threshold"):
        build_experiment(f"recall_at_kept(spec={SPEC!r}, threshold=300)")


def test_tiny_run_matches_an_independent_computation(tmp_path: Path):
    exp = build_experiment(f"recall_at_kept(spec={SPEC!r}, images=16, seeds=(0, 1), batch=5)", smoke=True)
    result = exp.run(RunContext(threads=1, out_dir=tmp_path, log=lambda m: None))
    assert [b["block"] for b in result["blocks"]] == [1, 2] and [b["kept"] for b in result["blocks"]] == [24, 12]
    assert result["spec"] == tokenreduce.build_reducer(SPEC).spec() and len(result["matched_specs"]) == 2
    # independently: the same model and images, per-pixel loops, the kept patches from get_info
    torch.manual_seed(0)
    model = build_model(R.TINY).eval()
    raw = FashionMNIST("test", data_dir=tmp_path / "data").images  # (16, 28, 28)
    fg = torch.zeros(16, 49)
    for i in range(7):
        for j in range(7):
            fg[:, 7 * i + j] = ((raw[:, 4 * i:4 * i + 4, 4 * j:4 * j + 4] > 51).float().mean((1, 2)) >= 0.5).float()
    ds = build_dataset(str(tmp_path / "data"), "test", **data_config_from_model(model))
    x = torch.stack([ds[i][0] for i in range(16)])
    for row in result["blocks"]:
        assert row["base_rate"] == pytest.approx(float(fg.mean()))
        want = sum(min(row["kept"], int(n)) / row["kept"] for n in fg.sum(1)) / 16
        assert row["oracle_recall"] == pytest.approx(want)
        assert row["oracle_recall"] >= row["spec"] - 1e-9 and row["oracle_recall"] >= max(row["matched_seeds"]) - 1e-9
        assert row["matched"] == pytest.approx(sum(row["matched_seeds"]) / 2)
    tokenreduce.apply(model, SPEC, trace=True)
    with torch.no_grad():
        model(x)
    snaps = tokenreduce.get_info(model).snapshots
    for row in result["blocks"]:
        kept = snaps[row["block"]][:, 1:, 1:].argmax(-1)  # (16, kept) the patch each kept token is
        assert row["spec"] == pytest.approx(float(fg.gather(1, kept).mean()))
    report = exp.report(result)
    assert "| 1 | 24 / 49 |" in report and "oracle" in report

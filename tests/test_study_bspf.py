"""The bspf study (experiments/bspf_arms.py): its committed tables regenerate from the stored run JSONs
with the figures of results/bspf/README.md, a probe on an arm's run, and the tied arm rebuilt as the
stored run was (a weight transform of the reference). The registry-wide smoke test in
tests/test_studies.py runs its smoke (the symmetry probes included)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tokenreduce.experiments import get_study
from tokenreduce.experiments.runner import Layout, load_runs, plan
from tokenreduce.experiments.tables import summary

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bspf"


def _runs() -> dict:
    return load_runs(Layout(RESULTS, ROOT / "runs" / "bspf"))


def test_the_committed_bspf_tables_regenerate_from_the_stored_runs():
    study, runs = get_study("bspf")(), _runs()
    assert len(runs) == 18  # 4 arms x 3 seeds, the speed run, five symmetry runs
    text = summary(study, runs)
    assert text == (RESULTS / "summary.md").read_text()
    assert "| full attention | 0, 1, 2 | 90.15 ± 0.15 | - |" in text
    assert "| chunked alone | 0, 1, 2 | 87.83 ± 0.06 |" in text
    assert "| chunked + pruning + fusion | 0, 1, 2 | 85.97 ± 0.05 |" in text
    assert "| the same, W_q = W_k | 0, 1, 2 | 83.35 ± 0.10 |" in text
    rows = {r["label"]: r for r in runs["speed"]["result"]["results"]}
    chunked = rows["chunked(size=7) [fine-tuned x3]"]
    assert (f"{chunked['speedup']:.2f}", f"{chunked['latency_speedup']:.2f}", f"{chunked['macs'] / 1e6:.1f}") == \
        ("0.78", "0.66", "40.1")
    assert "| 0.78 | 0.66 |" in text and "| 0.90 | 0.49 |" in text


def test_the_symmetry_figures_of_the_readme_are_the_stored_runs():
    runs = _runs()
    tied = [v for s in (0, 1, 2) for v in runs[f"symmetry_tied_s{s}"]["result"]["variants"]
            if v["kernel"] == "as loaded"]
    blocks = [b for v in tied for b in v["blocks"]]
    assert f"{max(b['attn_asym_max'] for b in blocks):.3f}" == "0.984"
    ratio = [b["attn_asym_mean"] / b["attn_mean"] for b in blocks]
    assert f"{statistics.fmean(ratio):.3f} ± {statistics.stdev(ratio):.3f}" == "0.441 ± 0.050"
    first = [b["token_agreement"] for b in blocks if b["block"] == 1]
    assert f"{statistics.fmean(first):.1f} ± {statistics.stdev(first):.1f}" == "88.6 ± 0.7"
    assert f"{statistics.fmean(v['pred_agreement'] for v in tied):.2f}" == "95.19"
    untied = runs["symmetry_reference_untied"]["result"]["variants"][0]
    assert (untied["kernel"], f"{untied['top1_exact']:.2f}", f"{untied['top1_mirrored']:.2f}") == \
        ("as loaded", "62.86", "64.00")


def test_a_probe_on_an_arm_reads_that_arms_run():
    needs = {u.id: u.needs for u in plan(get_study("bspf")())}
    assert needs["symmetry_tied_s1"] == ("bspf_tied-s1",) and needs["symmetry_reference_tied"] == ()


def test_the_tied_arm_is_the_reference_tied_as_the_stored_run_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from tokenreduce.train import recipes

    monkeypatch.setattr(recipes, "reference_checkpoint", lambda recipe="fmnist-vit": tmp_path / "ref.safetensors")
    study, runs = get_study("bspf")(), _runs()
    p = study.point("bspf_tied", {"seed": 0})
    fields = study.train_fields(p, tmp_path)
    stored = runs[p.id]["config"]
    assert fields["model"] == stored["model"] and fields["model"]["transforms"] == ["tie_qk"]
    assert fields["init"] == str(tmp_path / "ref.safetensors") and fields["spec"] == stored["spec"]
    assert study.train_fields(study.point("full", {"seed": 0}), tmp_path)["model"] is None  # untouched arms

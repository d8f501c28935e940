"""The imagepiece study (experiments/imagepiece_controls.py): its committed tables regenerate from the
stored run JSONs with the figures of results/imagepiece/README.md (the registry-wide smoke test in
tests/test_studies.py runs its smoke)."""

from __future__ import annotations

from pathlib import Path

from tokenreduce.experiments import get_study
from tokenreduce.experiments.runner import Layout, load_runs
from tokenreduce.experiments.tables import summary, verdicts

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "imagepiece"


def _runs() -> dict:
    return load_runs(Layout(RESULTS, ROOT / "runs" / "imagepiece"))


def test_the_committed_imagepiece_tables_regenerate_from_the_stored_runs():
    study, runs = get_study("imagepiece")(), _runs()
    assert len(runs) == 35  # 11 arms x 3 seeds and the two speed runs
    text = summary(study, runs)
    assert text == (RESULTS / "summary.md").read_text()
    # the figures of the README (made by the earlier summarize.py from the same JSONs)
    assert "| patch-none | 0, 1, 2 | 75.83 ± 0.34 | - |" in text
    assert "| conv-none | 0, 1, 2 | 84.49 ± 0.76 | 8.66 ± 0.54 |" in text
    assert "| conv-imagepiece | 0, 1, 2 | 84.25 ± 0.34 | 8.41 ± 0.36 |" in text
    assert "| conv-tome-hyper | 0, 1, 2 | 84.16 ± 0.72 |" in text
    assert "| evit(keep=0.74, locs=(1, 3, 4)) | method |" in text and "| 1.09 | 0.80 | 0.90 | 0.80 |" in text
    measured = {j.expect.claim: j for j in verdicts(study, runs)}
    fixed = measured["re-tokenization adds accuracy with the stem held fixed (conv)"]
    assert f"{sum(fixed.diffs) / 3:.2f}" == "-0.25" and fixed.verdict.word != "reproduced"
    assert measured["the conv stem alone (no re-tokenization, no pruning) adds accuracy"].verdict.word == "reproduced"


def test_the_arms_of_a_regime_have_the_macs_the_readme_quotes():
    runs = _runs()
    rows = {r["spec"]: r["macs"] for r in runs["speed_conv"]["result"]["results"] if r["kind"] in ("unpatched",
                                                                                                       "method")}
    base = rows[None]
    assert f"{base / rows['imagepiece(locs=(1, 2, 4))']:.2f}" == "1.32"
    assert f"{base / rows['evit(keep=0.44, locs=(1, 3, 4))']:.2f}" == "1.83"


def test_a_rerun_trains_each_arm_as_the_stored_run_was_trained(tmp_path: Path):
    study, runs = get_study("imagepiece")(), _runs()
    for p in study.points():
        stored = runs[p.id]["config"]
        fields = study.train_fields(p, tmp_path)
        assert (fields["model"]["stem"], fields["spec"], fields["seed"]) == \
            (stored["model"]["stem"], stored["spec"], stored["seed"]), p.id
        assert {k: fields[k] for k in ("epochs", "subset", "lr", "batch_size")} == \
            {k: stored[k] for k in ("epochs", "subset", "lr", "batch_size")}

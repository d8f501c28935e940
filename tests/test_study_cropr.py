"""The Token Cropr studies (experiments/cropr_arms.py) and the hashing baseline (experiments/hash_baseline.py):
their committed tables regenerate from the stored run JSONs with the committed numbers, and the random arm's
own seed follows the run's. Their smokes run in tests/test_studies.py (every registered study)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenreduce.experiments import get_study
from tokenreduce.experiments.runner import Layout, load_runs
from tokenreduce.experiments.tables import summary

ROOT = Path(__file__).resolve().parents[1]


def _summary(name: str) -> tuple[str, int]:
    study = get_study(name)()
    runs = load_runs(Layout(ROOT / "results" / name, ROOT / "runs" / name))
    return summary(study, runs), len(runs)


@pytest.mark.parametrize("name, n_runs, rows", [
    ("cropr", 15, ["| Token Cropr | 0, 1, 2 | 87.54 ± 0.30 |", "| random | 0, 1, 2 | 88.81 ± 0.51 |",
                   "| top-k | 0, 1, 2 | 87.54 ± 0.22 |", "| EViT | 0, 1, 2 | 87.09 ± 0.15 |",
                   "| unpruned (same fine-tune) | 0, 1, 2 | 90.14 ± 0.15 |"]),
    ("cropr_seg", 18, ["| Token Cropr | 0, 1, 2 | 25.57 ± 1.01 |", "| random | 0, 1, 2 | 26.48 ± 0.57 |",
                       "| top-k | 0, 1, 2 | 27.05 ± 0.30 |", "| EViT | 0, 1, 2 | 7.73 ± 1.03 |",
                       "| unpruned (same recipe) | 0, 1, 2 | 26.98 ± 0.77 | 69.12 ± 0.44 |",
                       # the diagnostics, one evaluated run per seed: the training-time score t, the deployed s
                       "| Cropr's weights pruned by the training-time score t | 0, 1, 2 | 21.80 ± 2.99 | - "
                       "| -5.19 ± 2.24 | 25.57 ± 1.01 | 22.06 ± 2.02 | 0.37 ± 0.06 | 0.74 ± 0.02 | - |"]),
    ("platform", 9, ["| hash head, unpruned | 0, 1, 2 | 77.44 ± 1.60 | 73.14 ± 1.22 | 73.86 ± 2.72 |",
                     "| hash head, unpruned | 0, 1, 2 | 73.61 ± 3.78 | 73.48 ± 2.70 | 67.68 ± 4.31 |",
                     "| hash head, unpruned | 0, 1, 2 | 67.74 ± 7.64 | 76.56 ± 3.15 | 61.08 ± 8.80 |"]),
])
def test_the_committed_tables_regenerate_from_the_stored_runs(name: str, n_runs: int, rows: list[str]):
    text, n = _summary(name)
    assert n == n_runs and "not run" not in text
    assert text == (ROOT / "results" / name / "summary.md").read_text()
    for row in rows:  # the figures the README and the earlier summaries committed
        assert row in text, row


def test_the_random_arm_prunes_with_the_runs_seed(tmp_path: Path):
    """The run's TrainConfig spec is the one the stored run trained with: ``seed={seed}`` filled in per run."""
    study = get_study("cropr")(smoke=True)
    stored = load_runs(Layout(ROOT / "results" / "cropr", ROOT / "runs" / "cropr"))
    for p in study.points():
        if p.arm == "random":
            spec = study.train_fields(p, tmp_path)["spec"]
            assert spec.endswith(f"seed={p.values['seed']})") and stored[p.id]["config"]["spec"] == spec

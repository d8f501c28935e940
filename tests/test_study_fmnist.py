"""The Fashion-MNIST studies (experiments/fmnist_budget.py, experiments/reference_fmnist.py): their committed
tables regenerate from the stored run JSONs with the committed numbers, and the backends README's figures are
the stored bench runs'. Their smokes run in tests/test_studies.py (every registered study)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenreduce.experiments import get_study
from tokenreduce.experiments.runner import Layout, load_runs, plan
from tokenreduce.experiments.tables import summary, verdicts

ROOT = Path(__file__).resolve().parents[1]


def _stored(name: str) -> dict[str, dict]:
    return load_runs(Layout(ROOT / "results" / name, ROOT / "runs" / name))


def test_the_committed_fmnist_tables_regenerate_from_the_stored_runs():
    study = get_study("fmnist")()
    runs = _stored("fmnist")
    assert set(runs) == {u.id for u in plan(study)}  # 36 fine-tunes + free, final, matched, matched-onnxruntime
    text = summary(study, runs)
    assert text == (ROOT / "results" / "fmnist" / "summary.md").read_text()
    readme = (ROOT / "results" / "fmnist" / "README.md").read_text()
    # the README's figures (written by the shell scripts this study replaced), row by row from the runs
    assert "| random 1.5x: random(keep=0.6, locs=(1, 3, 4)) | 0, 1, 2 | 89.75 ± 0.07 | - |" in text
    assert "| ctp(counts=(24, 12, 3), locs=(1, 3, 4)) | training-free | 1.83 | 1.31 | 0.83 | 69.42 | 20.81 |" in text
    assert "| random(keep=0.6, locs=(1, 3, 4)) | training-free | 1.74 | 1.48 | 1.03 | 87.27 | 2.96 | 0.50 |" in text
    assert "| fine-tuned | 1.74 | 1.48 | 1.14 | 89.75 | 0.48 | 0.07 |" in text  # final: random 1.5x, fine-tuned
    assert "| fine-tuned | 3.24 | 1.67 | 0.63 | 87.64 | 2.59 | 0.16 |" in text  # final: ToMe 2x, fine-tuned
    assert "| fine-tuned | 1.87 | 1.68 | 1.53 | 89.57 | 0.66 | 0.12 |" in text  # onnxruntime: random keep 0.55
    for figure in ("| random | 1.5x | `keep=0.6, locs=(1, 3, 4)` | 1.74 | 1.48 / 1.14 | 2.96 +- 0.50 | **0.48",
                   "| tome | 2x (not reached) | `r=(17, 16, 8, 4, 2, 1)` | 3.24 | 1.67 / 0.63 | 13.96 | 2.59 +- 0.16 |",
                   "| random `keep=0.55` (top-k's token counts) | 1.87 | 1.50 / 1.03 | 1.68 / 1.53 | 0.66 +- 0.12 |"):
        assert figure in readme
    words = {j.expect.arm: (j.verdict.word, j.verdict.test.n) for j in verdicts(study, runs)}
    assert words == {"topk-1.5x": ("contradicted", 3), "imagepiece-1.5x": ("contradicted", 3),
                     "evit-2x": ("contradicted", 3)}


def test_the_fine_tune_runs_say_where_their_numbers_come_from():
    runs = _stored("fmnist")
    final = {r["checkpoint"]: r["top1"] for row in runs["final"]["result"]["results"] for r in row["runs"]
             if row["kind"] == "fine-tuned"}
    for run_id in ("random-1.5x-s0", "tome-2x-s2"):
        doc = runs[run_id]
        assert doc["kind"] == "train" and "runs/final.json" in doc["converted"]
        assert doc["metrics"]["top1"] == final[doc["metrics"]["checkpoint"]]
    assert "runs/matched.json" in runs["random-matched-topk-1.5x-s1"]["converted"]


def test_the_committed_reference_table_regenerates_from_its_run():
    study = get_study("reference")()
    runs = _stored("reference")
    assert set(runs) == {"fmnist_vit-s0"}
    text = summary(study, runs)
    assert text == (ROOT / "results" / "reference" / "summary.md").read_text()
    assert "| fmnist-vit (from scratch) | 0 | 90.23 (n = 1) |" in text  # one seed: no ± std


def test_the_backends_readme_figures_are_the_stored_bench_runs():
    readme = (ROOT / "results" / "backends" / "README.md").read_text()

    def ratios(name: str, label: str) -> str:
        doc = json.loads((ROOT / "results" / "backends" / f"{name}.json").read_text())
        rows = {r["label"]: r for r in doc["results"]}
        return f"{rows[label]['speedup']:.2f} / {rows[label]['latency_speedup']:.2f}"

    assert f"| `tome(r=(15, 15, 9, 5, 2, 1))` | {ratios('fmnist-eager', 'tome(r=(15, 15, 9, 5, 2, 1))')} |" in readme
    assert f"| `ctp()` | {ratios('deit_small-eager', 'ctp()')} |" in readme
    onnx = ratios("fmnist-onnxruntime", "topk(keep=0.55, locs=(1, 3, 4))")
    assert f"| 1.60 / 1.00 | 0.95 / 0.89 | {onnx} |" in readme


def test_a_measure_reads_the_test_bed_reference_every_seed_of_its_arms_and_its_backend(tmp_path: Path, monkeypatch):
    from tokenreduce.experiments import entries
    from tokenreduce.experiments.runner import Runner

    study = get_study("fmnist")()
    monkeypatch.setattr(type(study.bed), "checkpoint", lambda self: "REF")
    seen = {}
    monkeypatch.setattr(entries, "evaluate", lambda ref, specs, tuned, **kw: seen.update(ref=ref, specs=specs,
                                                                                          tuned=tuned, **kw) or {})
    runner = Runner(study, Layout(tmp_path, tmp_path / "checkpoints"), threads=1, log=lambda msg: None)
    unit = runner.unit("matched-onnxruntime")
    assert unit.needs == tuple(f"{a}-s{s}" for a in ("random-1.5x", "topk-1.5x", "random-matched-topk-1.5x")
                               for s in (0, 1, 2))
    model = {"name": "vit_tiny_patch16_224", "kwargs": {"depth": 1}}
    for run_id in unit.needs:  # records whose checkpoints are gone: a measure reads the records only
        path = runner.layout.json(run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": {"model": model, "seed": int(run_id[-1])},
                                    "metrics": {"checkpoint": f"gone/{run_id}", "top1": 50.0}}))
    runner.run_one(unit)
    assert seen["ref"] == "REF" and seen["specs"] == ("random(keep=0.55, locs=(1, 3, 4))",)
    assert seen["tuned"] == [{"name": n, "model": model, "seed": int(n[-1]),
                              "metrics": {"checkpoint": f"gone/{n}", "top1": 50.0}} for n in unit.needs]
    assert seen["speed"] == {"backend": "onnxruntime"}

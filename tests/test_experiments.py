"""Experiments: the registry and command, and every registered experiment end to end in smoke mode."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import TEST_EXPERIMENTS

from tokenreduce.cli import main
from tokenreduce.core.errors import SpecError
from tokenreduce.probes import (
    Experiment,
    ProbeRequest,
    RunContext,
    build_experiment,
    list_experiments,
    register_experiment,
)


@dataclass(frozen=True)
class _SquareConfig:
    n: int = 1000
    scale: float = 1.0


@register_experiment("square_test", TEST_EXPERIMENTS)
class _Square(Experiment):
    """A test-only experiment: the sum of the first n squares, closed form vs loop."""

    Config = _SquareConfig
    claim = "sum_{i<n} i^2 = (n-1) n (2n-1) / 6"
    source = "test"
    smoke = {"n": 10}

    def run(self, ctx: RunContext) -> dict[str, Any]:
        n = self.cfg.n
        ctx.log(f"summing {n} squares")
        return {"n": n, "loop": self.cfg.scale * sum(i * i for i in range(n)),
                "closed": self.cfg.scale * (n - 1) * n * (2 * n - 1) / 6}

    def report(self, result: dict[str, Any]) -> str:
        return f"| n | loop | closed |\n|---|---|---|\n| {result['n']} | {result['loop']} | {result['closed']} |"


def test_smoke_overrides_and_spec_parameters():
    assert build_experiment("square_test").cfg.n == 1000
    assert build_experiment("square_test", smoke=True).cfg.n == 10
    exp = build_experiment("square_test(n=5, scale=2.0)", smoke=True)  # given parameters win
    assert (exp.cfg.n, exp.cfg.scale) == (5, 2.0)
    assert exp.spec() == "square_test(n=5, scale=2.0)"


def test_bad_specs_name_the_choices():
    with pytest.raises(SpecError, match="valid experiments: .*recall_at_kept"):
        build_experiment("no_such_experiment")
    with pytest.raises(SpecError, match="valid parameters: n, scale"):
        build_experiment("square_test(m=3)")


def test_command_lists_runs_and_writes_results(tmp_path, capsys):
    assert main(["experiment"]) == 0
    listed = capsys.readouterr().out
    assert "recall_at_kept" in listed and "square_test" not in listed  # the tests' own are found, never listed
    out = tmp_path / "r.json"
    assert main(["experiment", "square_test(n=4)", "--results", str(out), "--threads", "1"]) == 0
    assert "| 4 | 14.0 | 14.0 |" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["experiment"] == "square_test(n=4, scale=1.0)" and doc["result"]["closed"] == 14.0
    assert doc["provenance"]["command"].startswith("tokenreduce experiment")
    assert main(["experiment", "nope"]) == 2


def test_the_command_and_a_study_run_an_experiment_from_one_request(tmp_path, monkeypatch, capsys):
    """``tokenreduce experiment SPEC --smoke`` builds the library's ProbeRequest, the request a study's probe is
    (study/execute.py runs it in a RunContext); the same request gives the same experiment and result."""
    from tokenreduce.study import execute

    made = []
    monkeypatch.setattr(ProbeRequest, "experiment", lambda self: made.append(self) or build_experiment(
        self.spec, smoke=self.smoke))
    assert main(["experiment", "square_test(scale=2.0)", "--smoke", "--threads", "1", "--out", str(tmp_path)]) == 0
    assert made == [ProbeRequest("square_test(scale=2.0)", smoke=True)]
    assert "| 10 | 570.0 | 570.0 |" in capsys.readouterr().out
    body = execute.execute(made[0], RunContext(threads=1, out_dir=tmp_path))
    assert body == {"experiment": "square_test(n=10, scale=2.0)", "result": {"n": 10, "loop": 570.0, "closed": 570.0}}


def _within(value: Any, lo: float, hi: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi


def _recall_at_kept(r: dict[str, Any], report: str) -> None:
    assert r.keys() >= {"checkpoint", "spec", "matched_specs", "images", "threshold", "grid", "blocks"}
    assert len(r["matched_specs"]) == 2 and r["images"] == 24  # the smoke's seeds and images
    assert r["blocks"], "no block reduced"
    for b in r["blocks"]:
        assert 1 <= b["kept"] < b["of"]
        assert all(_within(b[k], 0, 1) for k in ("base_rate", "spec", "matched", "oracle_recall")), b
        assert len(b["matched_seeds"]) == 2 and _within(b["matched_std"], 0, 1)
        assert f"| {b['block']} | {b['kept']} / {b['of']} | {b['base_rate']:.3f} | {b['spec']:.3f} |" in report


def _bspf_symmetry(r: dict[str, Any], report: str) -> None:
    assert r.keys() >= {"spec", "source", "tied", "images", "variants"}
    assert [v["kernel"] for v in r["variants"]] == ["as loaded", "non-symmetric"]
    for v in r["variants"]:
        assert all(_within(v[k], 0, 100) for k in ("top1_exact", "top1_mirrored", "pred_agreement")), v
        assert v["top1_diff"] == pytest.approx(v["top1_mirrored"] - v["top1_exact"])
        assert _within(v["logit_diff_mean"], 0, v["logit_diff_max"])
        assert v["blocks"] and all(_within(b["token_agreement"], 0, 100) and _within(b["entry_agreement"], 0, 100)
                                   and _within(b["attn_asym_mean"], 0, b["attn_asym_max"]) for b in v["blocks"])
        assert f"| {v['kernel']} |" in report and f"{v['top1_exact']:.2f} | {v['top1_mirrored']:.2f}" in report


def _cropr_diagnostics(r: dict[str, Any], report: str) -> None:
    assert r.keys() >= {"checkpoint", "spec", "metric", "items", "modules", "miou"} and r["metric"] == "miou"
    m = r["miou"]
    assert all(_within(m[k], 0, 100) for k in ("logits", "softmax", "fixed", "unpruned")), m
    assert len(m["fixed_seeds"]) == 2 and _within(m["fixed_std"], 0, 100)
    assert r["modules"], "no Cropr module was probed"
    for mod in r["modules"]:
        assert 1 <= mod["kept"] <= mod["tokens"] and _within(mod["spearman"], -1, 1) and _within(mod["overlap"], 0, 1)
        assert f"| {mod['block']} | {mod['tokens']} | {mod['kept']} | {mod['spearman']:.3f} |" in report
    assert f"| unpruned (same weights) | {m['unpruned']:.2f} |" in report
    metrics = r["metrics"]  # what a study reads as an evaluated arm's metrics
    assert metrics["miou"] == m["softmax"] and metrics["miou_deployed"] == m["logits"]
    assert metrics["spearman"] == pytest.approx(sum(x["spearman"] for x in r["modules"]) / len(r["modules"]))


def _oracle_at_counts(r: dict[str, Any], report: str) -> None:
    assert r.keys() >= {"checkpoint", "spec", "oracle_spec", "metric", "items", "counts", "locs", "rows", "metrics"}
    assert list(r["rows"]) == ["own", "object_first", "unpruned"] and r["items"] == 8
    assert r["counts"] == [98, 49] and r["locs"] == [3, 7]  # the smoke's fixed schedule on 196 patches
    assert r["oracle_spec"].startswith("oracle(counts=(98, 49), locs=(3, 7), where='block'")
    assert {k: v for k, v in r["metrics"].items() if k != "items"} == r["rows"]["object_first"]
    assert r["metrics"]["items"]["top1"]["n"] == r["items"]
    for name, row in r["rows"].items():
        assert _within(row["top1"], 0, 100) and row["n"] == 8, (name, row)
        assert f"| {name} | {row['top1']:.2f} |" in report


#: What each experiment's smoke result must hold: its keys, its claim's numbers finite and in range,
#: the report showing them. A new experiment adds its checker here.
CHECKS = {"recall_at_kept": _recall_at_kept, "bspf_symmetry": _bspf_symmetry, "cropr_diagnostics": _cropr_diagnostics,
          "oracle_at_counts": _oracle_at_counts}


@pytest.mark.parametrize("name", [n for n in list_experiments()])
def test_every_experiment_runs_its_forwards_at_the_precision_asked(name, tmp_path, capsys, monkeypatch):
    """--amp reaches the experiment (and a study's probes through the runner): its forwards run under the
    context's autocast, and the record names the precision."""
    from tokenreduce.probes.base import RunContext

    entered = []
    plain = RunContext.autocast

    def watched(ctx):
        entered.append(ctx.amp)
        return plain(ctx)
    monkeypatch.setattr(RunContext, "autocast", watched)
    out = tmp_path / "result.json"
    assert main(["experiment", name, "--smoke", "--out", str(tmp_path / "files"), "--results", str(out),
                 "--threads", "1", "--amp", "bf16", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert entered and set(entered) == {"bf16"}
    assert json.loads(out.read_text())["provenance"]["amp"] == "bf16"


def test_every_experiment_has_a_result_check():
    assert set(CHECKS) == {n for n in list_experiments()}


@pytest.mark.parametrize("name", [n for n in list_experiments()])
def test_every_experiment_runs_in_smoke_mode(name, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["experiment", name, "--smoke", "--out", str(tmp_path / "files"), "--results", str(out),
                 "--threads", "1"]) == 0
    report = capsys.readouterr().out
    assert report.strip(), f"{name} printed no report"
    doc = json.loads(out.read_text())
    assert doc["smoke"] is True and doc["result"], f"{name} returned no result"
    CHECKS[name](doc["result"], report)

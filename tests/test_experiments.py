"""Experiments: the registry and command, and every registered experiment end to end in smoke mode."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tokenreduce.cli import main
from tokenreduce.core.errors import SpecError
from tokenreduce.experiments import Experiment, RunContext, build_experiment, list_experiments, register_experiment


@dataclass(frozen=True)
class _SquareConfig:
    n: int = 1000
    scale: float = 1.0


@register_experiment("_square_test")
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
    assert build_experiment("_square_test").cfg.n == 1000
    assert build_experiment("_square_test", smoke=True).cfg.n == 10
    exp = build_experiment("_square_test(n=5, scale=2.0)", smoke=True)  # given parameters win
    assert (exp.cfg.n, exp.cfg.scale) == (5, 2.0)
    assert exp.spec() == "_square_test(n=5, scale=2.0)"


def test_bad_specs_name_the_choices():
    with pytest.raises(SpecError, match="valid experiments: .*_square_test"):
        build_experiment("no_such_experiment")
    with pytest.raises(SpecError, match="valid parameters: n, scale"):
        build_experiment("_square_test(m=3)")


def test_command_lists_runs_and_writes_results(tmp_path, capsys):
    assert main(["experiment"]) == 0
    assert "_square_test" in capsys.readouterr().out
    out = tmp_path / "r.json"
    assert main(["experiment", "_square_test(n=4)", "--results", str(out), "--threads", "1"]) == 0
    assert "| 4 | 14.0 | 14.0 |" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["experiment"] == "_square_test(n=4, scale=1.0)" and doc["result"]["closed"] == 14.0
    assert doc["provenance"]["command"].startswith("tokenreduce experiment")
    assert main(["experiment", "nope"]) == 2


@pytest.mark.parametrize("name", [n for n in list_experiments() if not n.startswith("_")])
def test_every_experiment_runs_in_smoke_mode(name, tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["experiment", name, "--smoke", "--out", str(tmp_path / "files"), "--results", str(out),
                 "--threads", "1"]) == 0
    report = capsys.readouterr().out
    assert report.strip(), f"{name} printed no report"
    doc = json.loads(out.read_text())
    assert doc["smoke"] is True and doc["result"], f"{name} returned no result"

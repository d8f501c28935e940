"""The prepared GPU check (scripts/device-check.sh): its wiring in the default tier, its CPU smoke in the slow one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokenreduce.study import get_study
from tokenreduce.study.plan import plan

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device-check.sh"


def test_the_script_parses_and_names_runs_the_studies_plan() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    runs = {re.sub(r"\$long", long, r) for r in re.findall(r'"((?:cropr|topk)-\$long-s0)"', text)
            for long in ("t937", "t9370")}
    assert len(runs) == 4
    assert runs <= {u.id for u in plan(get_study("cropr")(bed="scenes"))}
    assert {u.id for u in plan(get_study("backends")(bed="gpu"))} == {"deit_small-gpu-eager", "deit_small-gpu-graphs"}


@pytest.mark.slow  # a few minutes: the preset's smoke and two one-epoch smoke runs
def test_the_smoke_writes_the_records_and_its_log(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    subprocess.run(["bash", str(SCRIPT), "--smoke"], check=True, env=env, cwd=SCRIPT.parents[1], timeout=1500)
    log = (tmp_path / "device-check.log").read_text()
    assert "rc=0" in log and "rc=1" not in log and "rc=124" not in log, log[-2000:]
    for record in ("backends-gpu/runs/deit_small-gpu-eager.json", "cropr-scenes/runs/cropr-t937-s0.json",
                   "cropr-scenes/runs/topk-t937-s0.json"):
        assert json.loads((tmp_path / record).read_text())["smoke"] is True

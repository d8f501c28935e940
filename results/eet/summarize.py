"""Summarise results/eet (written by benchmark.sh) as markdown tables: per bit width, the four arms'
retrieval metrics (mean +- sample std over seeds) and their difference from the unpruned arm (a);
the speed of CTP against the unpruned model (one interleaved run); recall@kept per block."""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
ARMS = {"a": "unpruned (hash baseline)", "b": "CTP only", "c": "CTP + DKT", "d": "full EET (CTP + DKT + DRG)"}
RUN = re.compile(r"(?P<arm>[a-d])(?P<bits>\d+)-s(?P<seed>\d+)$")


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _runs() -> dict[int, dict[str, list[dict]]]:
    """bits -> arm -> metrics of each seed's run."""
    out: dict[int, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted((HERE / "runs").glob("*.json")):
        m = RUN.match(path.stem)
        if m:
            out[int(m["bits"])][m["arm"]].append(json.loads(path.read_text())["metrics"])
    return out


def arm_tables() -> list[str]:
    lines: list[str] = []
    for bits, arms in sorted(_runs().items()):
        base = {x["seed"]: x["map_asym"] for x in arms.get("a", [])}
        lines += [f"### {bits} bits", "",
                  "| arm | seeds | mAP asym % | mAP sym % | P@100 asym % | top-1 % | Δ mAP asym vs (a) | wall s |",
                  "|---|---|---|---|---|---|---|---|"]
        for arm, name in ARMS.items():
            m = arms.get(arm, [])
            if not m:
                continue
            # paired by seed: the same seed gives both arms the same data order and FISH targets
            delta = [x["map_asym"] - base[x["seed"]] for x in m if x["seed"] in base]
            seeds = ", ".join(str(x["seed"]) for x in m)
            lines.append(f"| ({arm}) {name} | {seeds} | {_ms([x['map_asym'] for x in m])} "
                         f"| {_ms([x['map_sym'] for x in m])} | {_ms([x['p@100_asym'] for x in m])} | "
                         f"{_ms([x['top1'] for x in m])} | {_ms(delta) if arm != 'a' else '-'} | "
                         f"{_ms([x['train_time_s'] for x in m])} |")
        lines.append("")
    return lines


def speed_table() -> list[str]:
    path = HERE / "speed" / "results.json"
    if not path.is_file():
        return []
    rows = json.loads(path.read_text())["results"]
    cols = [("label", "{}"), ("kind", "{}"), ("map", "{:.2f}"), ("macs_speedup", "{:.2f}"), ("img_per_s", "{:.0f}"),
            ("speedup", "{:.2f}"), ("latency_ms", "{:.2f}"), ("latency_speedup", "{:.2f}")]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[c]) if r.get(c) is not None else "-" for c, fmt in cols) + " |")
    return lines


def recall_table() -> list[str]:
    path = HERE / "recall_at_kept.json"
    if not path.is_file():
        return []
    res = json.loads(path.read_text())["result"]
    lines = [f"{res['spec']} on {res['checkpoint']}, {res['images']} test images; matched = "
             f"{res['matched_specs'][0].partition('(')[0]} at the same counts (mean ± std over "
             f"{len(res['matched_specs'])} seeds)", "",
             "| block | kept | base rate | spec | matched | oracle |", "|---|---|---|---|---|---|"]
    for b in res["blocks"]:
        lines.append(f"| {b['block']} | {b['kept']} / {b['of']} | {b['base_rate']:.3f} | {b['spec']:.3f} | "
                     f"{b['matched']:.3f} ± {b['matched_std']:.3f} | {b['oracle']:.3f} |")
    return lines


def main() -> int:
    print("\n".join(["## EET arms (fmnist-eet)", "", *arm_tables(), "## Speed (tokenreduce eval, one run)", "",
                     *speed_table(), "", "## recall@kept", "", *recall_table()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

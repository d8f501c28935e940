"""Summarise results/platform/{seg,hash}/*.json (written by benchmark.sh) as markdown tables:
mean +- sample std over seeds, and the wall time of each run (training + final evaluation)."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _load(folder: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((HERE / folder).glob("*.json"))]


def segment_table() -> list[str]:
    runs = _load("seg")
    if not runs:
        return []
    m = [r["metrics"] for r in runs]
    return [
        "| task | seeds | mIoU % | pixel acc % | wall s per run |",
        "|---|---|---|---|---|",
        f"| {m[0]['task']} | {', '.join(str(x['seed']) for x in m)} | {_ms([x['miou'] for x in m])} | "
        f"{_ms([x['pixel_acc'] for x in m])} | {_ms([x['train_time_s'] for x in m])} |",
    ]


def hash_table() -> list[str]:
    groups: dict[int, list[dict]] = defaultdict(list)
    for r in _load("hash"):
        groups[r["metrics"]["bits"]].append(r["metrics"])
    if not groups:
        return []
    lines = ["| bits | seeds | mAP asymmetric % | mAP symmetric % | P@100 asym % | P@100 sym % | top-1 % | "
             "wall s per run |", "|---|---|---|---|---|---|---|---|"]
    for bits in sorted(groups):
        m = groups[bits]
        lines.append(
            f"| {bits} | {', '.join(str(x['seed']) for x in m)} | {_ms([x['map_asym'] for x in m])} | "
            f"{_ms([x['map_sym'] for x in m])} | {_ms([x['p@100_asym'] for x in m])} | "
            f"{_ms([x['p@100_sym'] for x in m])} | {_ms([x['top1'] for x in m])} | "
            f"{_ms([x['train_time_s'] for x in m])} |")
    return lines


def main() -> int:
    print("\n".join(["## Segmentation (fmnist-seg)", "", *segment_table(), "", "## Hashing (fmnist-hash)", "",
                     *hash_table()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

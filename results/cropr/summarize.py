"""Summarise results/cropr (written by benchmark.sh) as markdown tables: per arm the mean +- sample std
over seeds of the task metric (top-1 / mIoU) and the wall time per run; the diagnostics averaged over
the seeds' checkpoints; the DeiT-S throughput of cropr vs random at the same schedule (paired
per-round ratios of one interleaved run)."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
ARMS = ("cropr", "random", "topk", "evit", "none")


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _load(folder: str) -> list[tuple[str, dict]]:
    return [(p.stem, json.loads(p.read_text())) for p in sorted((HERE / folder).glob("*.json"))]


def task_table(folder: str, metric: str, label: str) -> list[str]:
    """One row per arm (file names ``<task>-<arm>-s<seed>.json``)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for stem, doc in _load(folder):
        groups[stem.split("-")[1]].append(doc["metrics"])
    if not groups:
        return []
    lines = [f"| arm | spec (seed 0) | seeds | {label} | wall s per run |", "|---|---|---|---|---|"]
    for arm in sorted(groups, key=lambda a: ARMS.index(a) if a in ARMS else len(ARMS)):
        m = sorted(groups[arm], key=lambda x: x["seed"])
        lines.append(f"| {arm} | `{m[0].get('spec') or 'none'}` | {', '.join(str(x['seed']) for x in m)} | "
                     f"{_ms([x[metric] for x in m])} | {_ms([x['train_time_s'] for x in m])} |")
    return lines


def diagnostics_table() -> list[str]:
    docs = [doc["result"] for _, doc in _load("diag")]
    if not docs:
        return []
    blocks: dict[int, list[dict]] = defaultdict(list)
    for d in docs:
        for row in d["modules"]:
            blocks[row["block"]].append(row)
    lines = [f"Over {len(docs)} checkpoint(s) ({', '.join(Path(d['checkpoint']).parent.name for d in docs)}), "
             f"{docs[0]['items']} test mosaics each; mean ± std over checkpoints.", "",
             "| module after block | tokens in | kept | Spearman(s, t) | kept-set overlap |",
             "|---:|---:|---:|---:|---:|"]
    for b in sorted(blocks):
        rows = blocks[b]
        lines.append(f"| {b} | {rows[0]['tokens']} | {rows[0]['kept']} | {_ms([r['spearman'] for r in rows])} | "
                     f"{_ms([r['overlap'] for r in rows])} |")
    lines += ["", "| scorer | mIoU % |", "|---|---:|",
              f"| deployed: sum of raw logits | {_ms([d['miou']['logits'] for d in docs])} |",
              f"| training-time: sum of per-query softmax | {_ms([d['miou']['softmax'] for d in docs])} |",
              f"| fixed random, same schedule, LLF (seed mean) | {_ms([d['miou']['fixed'] for d in docs])} |",
              f"| unpruned, same weights | {_ms([d['miou']['unpruned'] for d in docs])} |"]
    return lines


def _paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def bench_table() -> list[str]:
    path = HERE / "bench_deit_small_cpu2.json"
    if not path.is_file():
        return []
    rows = {r["label"]: r for r in json.loads(path.read_text())["results"]}
    lines = ["| spec | GMACs | img/s | speed-up | vs random at the same schedule |", "|---|---:|---:|---:|---:|"]
    for label, r in rows.items():
        ratio = r.get("ratio_vs_random")
        if ratio is None and r["kind"] == "method" and not label.startswith("random"):
            twin = next((x for x in rows.values() if x["kind"] == "method" and x is not r and x["label"].startswith(
                "random") and x["tokens_per_block"] == r["tokens_per_block"]), None)
            ratio = _paired(r["img_per_s_runs"], twin["img_per_s_runs"]) if twin else None
        lines.append(f"| `{label}` | {r['gmacs']:.2f} | {r['img_per_s']:.1f} | {r['speedup']:.3f} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} |")
    return lines


def main() -> int:
    out = ["## Classification (fmnist-cropr, top-1 %)", "", *task_table("cls", "top1", "top-1 %"), "",
           "## Segmentation (fmnist-cropr-seg, mIoU %)", "", *task_table("seg", "miou", "mIoU %"), "",
           "## Diagnostics (cropr_diagnostics on the seg cropr checkpoints)", "", *diagnostics_table(), "",
           "## DeiT-S throughput, deployed cropr vs random (2 threads, batch 32)", "", *bench_table()]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Summarise the BSPF benchmark (results/bspf/benchmark.sh) as markdown tables: mean +- sample std over seeds.

- train/*.json (one per variant and seed): top-1 after the fmnist-bspf fine-tune, MACs per image of the
  variant (bench.count_macs on the recipe's model with the run's spec and transforms), wall time;
- fmnist_speed/results.json (tokenreduce eval): measured speed-up of the fine-tuned untied variants;
- symmetry/*.json (tokenreduce experiment bspf_symmetry): |A - A^T| and exact vs mirrored agreement;
- bench_deit_small_cpu*.json (tokenreduce bench): DeiT-S MACs and measured speed-ups.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
ORDER = ["full", "chunked", "chunked-tied", "bspf", "bspf-tied", "bspf-tied-mirrored"]


def _ms(values: list[float], digits: int = 2) -> str:
    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else f"{mean:.{digits}f}"


def _load(pattern: str) -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text())) for p in sorted(HERE.glob(pattern))]


def _macs(model_cfg: dict | None, spec: str | None) -> float:
    """MACs per image (M) of the recipe's model with ``spec`` applied."""
    import tokenreduce as tr
    from tokenreduce.bench import count_macs
    from tokenreduce.models import build_model
    from tokenreduce.train.recipes import RECIPES

    model = build_model(model_cfg or RECIPES["fmnist-vit"]["model"])
    if spec:
        tr.apply(model, spec)
    return count_macs(model).total / 1e6


def _speedups() -> dict[str | None, tuple[float, float]]:
    """spec (None: no reducer) -> (speed-up at batch B, latency speed-up at batch 1) of the fine-tuned cases."""
    path = HERE / "fmnist_speed" / "results.json"
    if not path.is_file():
        return {}
    out = {}
    for row in json.loads(path.read_text())["results"]:
        if row.get("kind") == "fine-tuned":
            out[row.get("spec")] = (row["speedup"], row["latency_speedup"])
    return out


def train_table() -> list[str]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for path, doc in _load("train/*.json"):
        groups[re.sub(r"-s\d+$", "", path.stem)].append(doc)
    if not groups:
        return []
    speed = _speedups()
    lines = ["| variant | spec | W_q = W_k | seeds | top-1 % | MACs (M) | speed-up b32 / b1 | wall s per run |",
             "|---|---|---|---|---|---|---|---|"]
    for name in sorted(groups, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n)):
        docs = groups[name]
        m = [d["metrics"] for d in docs]
        model_cfg = docs[0]["config"].get("model")
        tied = bool(model_cfg and model_cfg.get("transforms"))
        spec = m[0].get("spec")
        sp = speed.get(spec) if not tied else None
        sp_text = f"{sp[0]:.2f} / {sp[1]:.2f}" if sp else ("same as untied" if tied else "-")
        lines.append(f"| {name} | {spec or 'none'} | {'yes' if tied else 'no'} | "
                     f"{', '.join(str(x['seed']) for x in m)} | {_ms([x['top1'] for x in m])} | "
                     f"{_macs(model_cfg, spec):.1f} | {sp_text} | {_ms([x['train_time_s'] for x in m], 0)} |")
    return lines


def symmetry_table() -> list[str]:
    docs = _load("symmetry/*.json")
    if not docs:
        return []
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path, doc in docs:
        for v in doc["result"]["variants"]:
            groups[(re.sub(r"-s\d+$", "", path.stem), v["kernel"])].append({**v, "tied": doc["result"]["tied"]})
    lines = ["| model | kernel | W_q = W_k | runs | max abs(A - A^T) | mean abs(A - A^T) / mean A | kept tokens "
             "shared % (per block) | entry masks equal % | top-1 exact | top-1 mirrored | same prediction % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (model, kernel), vs in sorted(groups.items()):
        blocks = sorted({b["block"] for v in vs for b in v["blocks"]})

        def per_block(key: str, vs=vs, blocks=blocks) -> str:
            return " / ".join(_ms([b[key] for v in vs for b in v["blocks"] if b["block"] == k], 1) for k in blocks)

        lines.append(
            f"| {model} | {kernel} | {'yes' if vs[0]['tied'] else 'no'} | {len(vs)} | "
            f"{max(b['attn_asym_max'] for v in vs for b in v['blocks']):.3f} | "
            f"{_ms([b['attn_asym_mean'] / b['attn_mean'] for v in vs for b in v['blocks']], 3)} | "
            f"{per_block('token_agreement')} | {per_block('entry_agreement')} | {_ms([v['top1_exact'] for v in vs])} | "
            f"{_ms([v['top1_mirrored'] for v in vs])} | {_ms([v['pred_agreement'] for v in vs])} |")
    return lines


def deit_table() -> list[str]:
    docs = _load("bench_deit_small_cpu*.json")
    if not docs:
        return []
    lines = ["| case | GMACs | speed-up b32 | latency speed-up b1 | tokens per block |", "|---|---|---|---|---|"]
    for row in docs[-1][1]["results"]:
        lines.append(f"| {row['label']} | {row['gmacs']:.2f} | {row['speedup']:.2f} | {row['latency_speedup']:.2f} | "
                     f"{' '.join(map(str, row['tokens_per_block']))} |")
    return lines


def main() -> int:
    sections = [("## Fashion-MNIST: full vs chunked vs chunked + pruning + fusion (fmnist-bspf)", train_table()),
                ("## Symmetry: exact vs mirrored scoring (bspf_symmetry)", symmetry_table()),
                ("## DeiT-S (random weights): MACs and measured speed-up", deit_table())]
    out = []
    for title, lines in sections:
        out += [title, "", *(lines or ["(no results yet)"]), ""]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

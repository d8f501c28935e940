"""Matched budgets for the ImagePiece benchmark: for each ImagePiece operating point on the fmnist-vit
model (conv stem), the EViT, ToMe and composite specs with the closest analytic MACs per image.

    python results/imagepiece/budgets.py          # prints arm, spec, MACs ratio, tokens per block (TSV)

benchmark.sh spells the specs this prints (they are fixed there so every run is reproducible);
summarize.py reports the MACs of every arm next to its accuracy. Runs in seconds, no data.
"""

from __future__ import annotations

import tokenreduce as tr
from tokenreduce.bench import count_macs
from tokenreduce.core.method import scaled_locs
from tokenreduce.models import build_model
from tokenreduce.train.recipes import get_recipe

#: The ImagePiece operating points: the paper's regime (merge at blocks 1, 2, 4 = (2, 5, 8) of 12
#: moved to 6 blocks, prune at the next block, keep 0.8) and the hyper-speed one (an iteration at
#: every block that has a next one, keep 0.7: 7 of 49 tokens left, 14%).
TARGETS = {
    "paper": "imagepiece(locs=(1, 2, 4))",
    "hyper": "imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)",
}
#: Re-tokenization only (no pruning of its own) in front of a baseline, which then re-scores.
FRONT = "imagepiece(locs=(1, 2, 4), keep=1.0)"


def model():
    return build_model({**get_recipe("fmnist-vit-short")["model"], "stem": "conv"}).eval()


def macs(m, spec: str | None) -> tuple[int, list[int]]:
    if spec is None:
        return count_macs(m).total, []
    tr.apply(m, spec)
    try:
        return count_macs(m).total, tr.get_info(m).tokens_per_block
    finally:
        tr.remove(m)


def families(depth: int) -> dict[str, list[str]]:
    keeps = [round(0.2 + 0.01 * i, 2) for i in range(81)]
    locs = scaled_locs((3, 6, 9), depth)  # EViT's blocks moved to this depth
    tome = []
    for r in range(1, 13):
        for j in range(depth + 1):  # r in the first j blocks, r - 1 after: finer steps than r alone
            rs = (r,) * j + (r - 1,) * (depth - j)
            tome.append(f"tome(r={r})" if j == depth else f"tome(r={rs})")
    return {
        "evit": [f"evit(keep={k}, locs={locs})" for k in keeps],
        "tome": tome,
        "imagepiece+evit": [f"{FRONT} + evit(keep={k}, locs=(2, 3, 5))" for k in keeps],
        "imagepiece+tome": [f"{FRONT} + {t}" for t in tome],
    }


def main() -> None:
    m = model()
    base, _ = macs(m, None)
    print("regime\tarm\tspec\tmacs_ratio\ttokens_per_block")
    for regime, target in TARGETS.items():
        goal, toks = macs(m, target)
        print(f"{regime}\timagepiece\t{target}\t{base / goal:.3f}\t{toks}")
        for arm, specs in families(6).items():
            if regime == "hyper" and "+" in arm:  # the hyper-speed comparison: each method alone
                continue
            best = None
            for spec in specs:
                try:
                    total, toks = macs(m, spec)
                except tr.TokenReduceError:
                    continue
                if best is None or abs(total - goal) < abs(best[1] - goal):
                    best = (spec, total, toks)
            print(f"{regime}\t{arm}\t{best[0]}\t{base / best[1]:.3f}\t{best[2]}")


if __name__ == "__main__":
    main()

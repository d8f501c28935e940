#!/usr/bin/env bash
# The hooks cost nothing measurable: tokenreduce bench on DeiT-S for every existing method with the
# platform (this revision), then the same command on the revision before it (538bb68, methods it
# knows), back to back on idle cores. Compare the speed-up columns (ratios of the same run).
# Usage: bash results/platform/bench.sh [OLD_SRC]   (OLD_SRC: a checkout of 538bb68's src/, optional)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/platform
common=(--model deit_small_patch16_224 --spec 'evit(keep=0.7, locs=(3, 6, 9))' --spec 'tome(r=13)' --spec 'ctp()'
        --spec 'topk(keep=0.7, locs=(3, 6, 9))' --spec 'dynamicvit(keep=0.7)' --match-random --threads 2 --batch 32
        --repeats 10)
tokenreduce bench "${common[@]}" --spec 'chunked(size=49)' --out "$out/bench_deit_small_cpu2.json" \
  > "$out/bench_deit_small_cpu2.txt"
if [ -n "${1:-}" ]; then
  PYTHONPATH="$1" tokenreduce bench "${common[@]}" --out "$out/bench_deit_small_cpu2_before.json" \
    > "$out/bench_deit_small_cpu2_before.txt"
fi

#!/usr/bin/env bash
# The platform issue's baselines on Fashion-MNIST, one resumable script (re-running it skips
# finished runs and resumes interrupted ones):
#   segment: the fmnist-seg recipe (mosaics, from scratch), seeds 0 1 2
#   hash:    the fmnist-hash recipe (fine-tuned from the cached fmnist-vit reference), 16/32/64 bits x seeds 0 1 2
# Results: results/platform/{seg,hash}/*.json (metrics, command, versions), summarised by summarize.py.
# Usage: bash results/platform/benchmark.sh [seg|hash|all]   (THREADS=1 to share the machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
threads=${THREADS:-2}
runs=${RUNS:-runs/platform}
out=results/platform
mkdir -p "$out/seg" "$out/hash"
if [ "$what" = seg ] || [ "$what" = all ]; then
  for seed in 0 1 2; do
    tokenreduce train --recipe fmnist-seg --seed "$seed" --threads "$threads" --resume \
      --out "$runs/seg-s$seed" --results "$out/seg/seg-s$seed.json"
  done
fi
if [ "$what" = hash ] || [ "$what" = all ]; then
  for bits in 16 32 64; do
    for seed in 0 1 2; do
      tokenreduce train --recipe fmnist-hash --task "hash(bits=$bits)" --seed "$seed" --threads "$threads" --resume \
        --out "$runs/hash$bits-s$seed" --results "$out/hash/hash$bits-s$seed.json"
    done
  done
fi
python "$out/summarize.py"

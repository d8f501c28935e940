#!/usr/bin/env bash
# Baselines: every method's speed-up against the unreduced model and against its matched
# random pruner, on each backend (eager, torch.compile, onnxruntime), one `tokenreduce bench` run per
# model x backend (batch 32 for img/s and batch 1 for latency in the same run; the unreduced model and
# the zero-reduction control run on the same backend as the specs).
#
#   deit    deit_small_patch16_224, random weights: evit(0.7 @ 3,6,9), tome(r=13), ctp(), topk(0.7 @ 3,6,9)
#   fmnist  the Fashion-MNIST reference (the cached fmnist-vit; `tokenreduce train --recipe fmnist-vit`),
#           each training-free method at its 1.5x pick (results/fmnist/picks.tsv)
#   smoke   test_vit at 64x64, --quick, eager and onnxruntime: seconds, checks the script (numbers mean nothing)
#   all     deit and fmnist (default)
#
# Usage: bash results/backends/benchmark.sh [deit|fmnist|smoke|all] [--resume]
#   A run whose results JSON exists is skipped (re-running resumes the rest); --resume changes nothing.
# Knobs (environment): THREADS (2), BACKENDS ("eager compile onnxruntime"), REPEATS (10).
# Outputs: results/backends/<model>-<backend>.{json,txt} (rows, every round, provenance).
set -euo pipefail
cd "$(dirname "$0")/../.."
what=all
for arg in "$@"; do [ "$arg" = --resume ] || what=$arg; done
threads=${THREADS:-2}
backends=${BACKENDS:-eager compile onnxruntime}
repeats=${REPEATS:-10}
out=results/backends
mkdir -p "$out"

run() {  # run NAME BACKEND ARGS...: one bench run, skipped when its JSON exists
  local name=$1 backend=$2
  shift 2
  if [ -f "$out/$name-$backend.json" ]; then echo "skip $name-$backend (done)"; return; fi
  tokenreduce bench --backend "$backend" --threads "$threads" --match-random "$@" \
    --out "$out/$name-$backend.d" > "$out/$name-$backend.txt.part"
  mv "$out/$name-$backend.d/results.json" "$out/$name-$backend.json" && rmdir "$out/$name-$backend.d"
  mv "$out/$name-$backend.txt.part" "$out/$name-$backend.txt"
}

deit_specs=(--spec 'evit(keep=0.7, locs=(3, 6, 9))' --spec 'tome(r=13)' --spec 'ctp()'
            --spec 'topk(keep=0.7, locs=(3, 6, 9))')
fmnist_specs=()
while IFS=$'\t' read -r label spec; do
  case $label in *-1.5x) [ "${label%-1.5x}" = random ] || fmnist_specs+=(--spec "$spec") ;; esac
done < results/fmnist/picks.tsv

if [ "$what" = deit ] || [ "$what" = all ]; then
  for b in $backends; do run deit_small "$b" --model deit_small_patch16_224 --batch-size 32 --repeats "$repeats" "${deit_specs[@]}"; done
fi
if [ "$what" = fmnist ] || [ "$what" = all ]; then
  for b in $backends; do run fmnist "$b" --checkpoint fmnist-vit --batch-size 32 --repeats "$repeats" "${fmnist_specs[@]}"; done
fi
if [ "$what" = smoke ]; then
  for b in eager onnxruntime; do
    run smoke "$b" --model test_vit --img-size 64 --quick --spec 'tome(r=2)' --spec 'evit(keep=0.7, locs=(1, 3))'
  done
fi

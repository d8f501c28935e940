#!/usr/bin/env bash
# The random pruner at the token counts of top-k's 1.5x pick (keep 0.55 @ 1,3,4: 50 28 28 16 10 10),
# fine-tuned like every pick (results/fmnist/finetune.sh, 3 seeds), then timed in one run with
# the reference, the random 1.5x pick (keep 0.6) and top-k's pick, fine-tuned.
# Why: the random 1.5x pick measured 1.48x, a hair under the issue's >= 1.5x; this is the next budget
# on the same grid, and the matched random pruner of top-k's pick (same tokens, no scoring).
#   bash results/fmnist/matched/command.sh [ft|eval]   (default both; ft may run in several THREADS=1 lanes)
#   BACKEND=onnxruntime bash results/fmnist/matched/command.sh eval   (the same rows timed with onnxruntime
#                                                      -> results/fmnist/matched/onnxruntime/)
# Time on 2 cores: ft ~8.5 min per run in each of two lanes (3 runs: ~17 min); eval ~1.5 min on idle cores (source of commit 0d43725 for the committed run).
set -euo pipefail
cd "$(dirname "$0")/../../.."
. results/fmnist/finetune.sh
what=${1:-all}
case "$what" in ft|eval|all) ;; *) echo "usage: bash results/fmnist/matched/command.sh [ft|eval]" >&2; exit 2 ;; esac
REF=${REF:-cache/fmnist-vit}
FT_DIR=${FT_DIR:-cache/ft-2ep}
FT_EPOCHS=2
FT_SUBSET=
THREADS=${THREADS:-2}
BACKEND=${BACKEND:-eager}
out=results/fmnist/matched
if [ "$BACKEND" != eager ]; then out=$out/$BACKEND; fi
spec="random(keep=0.55, locs=(1, 3, 4))"
name=random-matched-topk-1.5x
if [ "$what" != eval ]; then
  for seed in 0 1 2; do finetune "$name" "$spec" "$seed"; done
fi
if [ "$what" != ft ]; then
  ckpts=()
  for arm in random-1.5x topk-1.5x "$name"; do
    for seed in 0 1 2; do ckpts+=(--finetuned "$FT_DIR/$arm-s$seed"); done
  done
  tokenreduce eval --checkpoint "$REF" "${ckpts[@]}" --spec "$spec" --seeds 0,1,2 --threads "$THREADS" \
      --backend "$BACKEND" --out "$out"
fi

#!/usr/bin/env bash
# The Fashion-MNIST benchmark: the reference model's accuracy; every training-free method at the specs
# whose measured speed-up is nearest each target (1.5x and 2x); top-1 drop training-free (random over 3
# pattern seeds) and after a fine-tune (3 training seeds each), all timed in one interleaved run.
#
#   bash results/fmnist/benchmark.sh [free|ft|final|all]     (default all; needs the reference:
#                                                             tokenreduce train --recipe fmnist-vit)
#   free   tokenreduce eval --budgets ... --budget-rule measured: the picks -> $OUT/free/, $OUT/picks.tsv
#   ft     each pick x seeds 0 1 2: tokenreduce train --recipe fmnist-vit-ft (logit distillation from the
#          reference) for FT_EPOCHS epochs on FT_SUBSET images (default: 2 epochs on the full 60 000);
#          resumable (--resume: a finished run is reused, an interrupted one continues exactly)
#   final  one tokenreduce eval of the picks training-free and fine-tuned, timed together -> $OUT/finetuned/
#
# A finished step is skipped (delete its output to redo it). Several lanes may share `ft` (e.g.
# THREADS=1 twice: each run is claimed through a lock, results/lanes.sh); run `final` alone on idle cores.
# Time on 2 cores: free ~4 min; ft ~8.5 min per run in each of two THREADS=1 lanes (0.55 s a step, 936 steps;
# 11 picks x 3 seeds: ~2.5 h); final ~5 min.
# Knobs (environment): REF (reference checkpoint dir), OUT (results dir), BUDGETS (targets, "1.5,2"),
# FT_EPOCHS (2), FT_SUBSET (training images per epoch; empty: all), FT_DIR (fine-tune checkpoints,
# cache/ft-<epochs>ep), THREADS (2), EVAL_ARGS (extra arguments for both evaluations, e.g. '--subset 500'
# for a dry run).
set -euo pipefail
cd "$(dirname "$0")/../.."
. results/fmnist/finetune.sh
what=${1:-all}
case "$what" in free|ft|final|all) ;; *) echo "usage: bash results/fmnist/benchmark.sh [free|ft|final|all]" >&2; exit 2 ;; esac
REF=${REF:-cache/fmnist-vit}
OUT=${OUT:-results/fmnist}
BUDGETS=${BUDGETS:-1.5,2}
FT_EPOCHS=${FT_EPOCHS:-2}
FT_SUBSET=${FT_SUBSET:-}
FT_DIR=${FT_DIR:-cache/ft-${FT_EPOCHS}ep}
THREADS=${THREADS:-2}
EVAL_ARGS=${EVAL_ARGS:-}

# 1. training-free: budget picks by measured speed-up, every method, unpatched first
if { [ "$what" = free ] || [ "$what" = all ]; } && [ ! -f "$OUT/free/results.json" ]; then
  tokenreduce eval --checkpoint "$REF" --budgets "$BUDGETS" --budget-rule measured --seeds 0,1,2 \
      --threads "$THREADS" $EVAL_ARGS --out "$OUT/free"
fi
if [ ! -f "$OUT/free/results.json" ]; then echo "no $OUT/free/results.json: run the free step first" >&2; exit 1; fi
python3 - "$OUT/free/results.json" > "$OUT/picks.tsv" <<'PY'
import json, sys
# the smallest target first: its fine-tunes are the ones the issue's target reads
for pick in sorted(json.load(open(sys.argv[1]))["budgets"]["picks"], key=lambda p: (p["target"], p["method"])):
    print(f"{pick['method']}-{pick['target']:g}x\t{pick['spec']}")
PY

# 2. fine-tune every pick with 3 seeds
checkpoints=()
specs=()
while IFS=$'\t' read -r name spec; do
  specs+=(--spec "$spec")
  for seed in 0 1 2; do
    checkpoints+=(--finetuned "$FT_DIR/$name-s$seed")
    if [ "$what" = ft ] || [ "$what" = all ]; then finetune "$name" "$spec" "$seed"; fi
  done
done < "$OUT/picks.tsv"

# 3. the picked specs training-free and fine-tuned (3 seeds per spec -> mean +- std), all timed in
#    one run with the reference
if { [ "$what" = final ] || [ "$what" = all ]; } && [ ! -f "$OUT/finetuned/results.json" ]; then
  for dir in "${checkpoints[@]}"; do
    if [ "$dir" != --finetuned ] && [ ! -f "$dir/model.safetensors" ]; then
      echo "fine-tune $dir is not finished: run the ft step first" >&2; exit 1
    fi
  done
  tokenreduce eval --checkpoint "$REF" "${specs[@]}" "${checkpoints[@]}" --seeds 0,1,2 --threads "$THREADS" \
      $EVAL_ARGS --out "$OUT/finetuned"
fi

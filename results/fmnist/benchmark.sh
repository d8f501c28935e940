#!/usr/bin/env bash
# The Fashion-MNIST benchmark (issue: data, training, evaluation): the reference model's accuracy;
# every training-free method at the specs whose measured speed-up is nearest 1.5x and 2x; top-1 drop
# training-free (random over 3 pattern seeds) and after a short fine-tune (3 training seeds each).
#
#   bash results/fmnist/benchmark.sh            # needs the reference: tokenreduce train --recipe fmnist-vit
#
# Knobs (environment): REF (reference checkpoint dir), OUT (results dir), FT_EPOCHS and FT_SUBSET
# (fine-tune length: FT_SUBSET training images for FT_EPOCHS epochs), THREADS, EVAL_ARGS (extra
# arguments for both evaluations, e.g. '--subset 500' for a dry run).
set -euo pipefail
REF=${REF:-cache/fmnist-vit}
OUT=${OUT:-results/fmnist}
FT_EPOCHS=${FT_EPOCHS:-1}
FT_SUBSET=${FT_SUBSET:-12800}
THREADS=${THREADS:-2}
EVAL_ARGS=${EVAL_ARGS:-}
FT_DIR=${FT_DIR:-cache/ft}

# 1. training-free: budget picks by measured speed-up, every method, unpatched first
tokenreduce eval --checkpoint "$REF" --budgets 1.5,2 --budget-rule measured --seeds 0,1,2 \
    --threads "$THREADS" $EVAL_ARGS --out "$OUT/free"

# 2. fine-tune every pick with 3 seeds (logit distillation from the reference; recipe fmnist-vit-ft)
python3 - "$OUT/free/results.json" > "$OUT/picks.tsv" <<'PY'
import json, sys
for pick in json.load(open(sys.argv[1]))["budgets"]["picks"]:
    name = f"{pick['method']}-{pick['target']:g}x"
    print(f"{name}\t{pick['spec']}")
PY
checkpoints=()
specs=()
while IFS=$'\t' read -r name spec; do
    specs+=(--spec "$spec")
    for seed in 0 1 2; do
        dir="$FT_DIR/$name-s$seed"
        tokenreduce train --recipe fmnist-vit-ft --init "$REF" --teacher "$REF" --spec "$spec" \
            --epochs "$FT_EPOCHS" --subset "$FT_SUBSET" --eval-subset 500 --seed "$seed" \
            --threads "$THREADS" --quiet --out "$dir"
        checkpoints+=(--checkpoint "$dir")
    done
done < "$OUT/picks.tsv"

# 3. the picked specs training-free and fine-tuned (3 seeds per spec -> mean +- std), all timed in
#    one run with the reference
tokenreduce eval --checkpoint "$REF" "${specs[@]}" "${checkpoints[@]}" --seeds 0,1,2 --threads "$THREADS" \
    $EVAL_ARGS --out "$OUT/finetuned"

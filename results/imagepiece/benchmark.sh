#!/usr/bin/env bash
# ImagePiece: the stem / re-tokenization controls, the baselines with the same stem, ImagePiece in
# front of them, and the hyper-speed regime - one resumable script.
#
#   train  every arm below x seeds 0 1 2 from scratch with the SAME short recipe (fmnist-vit-short: the
#          fmnist-vit model, 4 epochs on a fixed 20 000 training images, full test set at the end), the
#          reducer active in training; a finished run (its results JSON exists) is skipped
#   speed  tokenreduce bench --checkpoint on the seed-0 checkpoint of each stem's unreduced arm: every spec of
#          that stem, each with a random pruner at its counts, the unreduced model and the zero-reduction control
#          in one interleaved run (img/s at batch 32, latency at batch 1; the weights do not change the cost)
#          -> results/imagepiece/speed-{conv,patch}.{json,txt}, ~5 min each on idle cores
#   deit   tokenreduce bench on deit_small_patch16_224 (random weights: speed only): the unreduced model,
#          ImagePiece at the paper's operating point (claimed +54% throughput), EViT keep 0.7, the
#          hyper-speed schedule, ImagePiece in front of EViT, each with a random pruner at its counts
#   smoke  one composite arm for a few steps (checks the pipeline; nothing is kept)
#   summary  python results/imagepiece/summarize.py > results/imagepiece/README-results.md
#
# Usage: bash results/imagepiece/benchmark.sh [--resume] [train|speed|deit|smoke|summary|all]   (default: train)
#   --resume  continue interrupted runs from their last checkpoint (exactly); finished runs are always skipped
#   THREADS=2 (torch threads per run), RUNS=runs/imagepiece (checkpoints), SEEDS="0 1 2",
#   REVERSE=1 (train the arms of a seed last to first). Several lanes may share the train target (e.g.
#   THREADS=1 twice, one with REVERSE=1): a run in progress holds $RUNS/<run>.lock (with its owner's pid) and
#   the other lanes skip it; a lock whose owner is gone is taken over.
# Time on 2 idle cores: ~4.5 min per run (the conv stem and no reduction is the slowest), 11 arms x 3 seeds
# = 33 runs ~ 2.5 h; deit ~10 min.
#
# Budgets: the arms of one regime have the same analytic MACs per image within 1% (fmnist-vit with the
# conv stem; python results/imagepiece/budgets.py prints the search that picked them):
#   paper regime, 1.32x fewer MACs: imagepiece(locs=(1, 2, 4)) = merge at blocks (2, 5, 8) of 12 moved to 6
#     blocks, prune at the next block, keep 0.8, merge ratio 0.08, bottom 0.3 (49 -> 45 -> 33 -> 27 -> 25 -> 20)
#   hyper-speed, 1.82x: imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7), 7 of 49 tokens left (14%)
#   ImagePiece in front of a baseline = re-tokenization only (keep=1.0: merging inside the inattentive set),
#   the baseline then re-scores at the next block (EViT at blocks 2, 3, 5) and prunes or merges.
set -euo pipefail
cd "$(dirname "$0")/../.."
. results/lanes.sh
resume=()
what=train
for arg in "$@"; do
  case "$arg" in
    --resume) resume=(--resume) ;;
    train|speed|deit|smoke|summary|all) what=$arg ;;
    *) echo "usage: bash results/imagepiece/benchmark.sh [--resume] [train|speed|deit|smoke|summary|all]" >&2
       exit 2 ;;
  esac
done
threads=${THREADS:-2}
runs=${RUNS:-runs/imagepiece}
seeds=${SEEDS:-0 1 2}
out=results/imagepiece

# name | stem | reducer spec (empty: none)
ARMS=(
  "patch-none|patch|"
  "conv-none|conv|"
  "patch-imagepiece|patch|imagepiece(locs=(1, 2, 4))"
  "conv-imagepiece|conv|imagepiece(locs=(1, 2, 4))"
  "conv-evit|conv|evit(keep=0.74, locs=(1, 3, 4))"
  "conv-tome|conv|tome(r=(5, 5, 4, 4, 4, 4))"
  "conv-imagepiece+evit|conv|imagepiece(locs=(1, 2, 4), keep=1.0) + evit(keep=0.76, locs=(2, 3, 5))"
  "conv-imagepiece+tome|conv|imagepiece(locs=(1, 2, 4), keep=1.0) + tome(r=(4, 3, 3, 3, 3, 3))"
  "conv-imagepiece-hyper|conv|imagepiece(locs=(0, 1, 2, 3, 4), keep=0.7)"
  "conv-evit-hyper|conv|evit(keep=0.44, locs=(1, 3, 4))"
  "conv-tome-hyper|conv|tome(r=(9, 9, 8, 8, 8, 8))"
)

train_arm() {  # name stem spec seed [extra train flags...]
  local name=$1 stem=$2 spec=$3 seed=$4
  shift 4
  local res="$out/runs/$name-s$seed.json"
  if [ -f "$res" ]; then
    echo "== $name seed $seed: done ($res)"
    return
  fi
  local lock="$runs/$name-s$seed.lock"
  if ! claim "$lock"; then
    echo "== $name seed $seed: in progress in another lane"
    return
  fi
  echo "== $name seed $seed"
  local args=(--recipe fmnist-vit-short --stem "$stem" --seed "$seed" --threads "$threads"
              --out "$runs/$name-s$seed" --results "$res" "${resume[@]}" "$@")
  if [ -n "$spec" ]; then
    args+=(--spec "$spec")
  fi
  tokenreduce train "${args[@]}"
  release "$lock"
}

if [ "$what" = train ] || [ "$what" = all ]; then
  mkdir -p "$out/runs"
  for seed in $seeds; do  # seed-major: every arm has a first seed before any has a third
    order=("${ARMS[@]}")
    if [ "${REVERSE:-0}" = 1 ]; then
      order=()
      for ((i = ${#ARMS[@]} - 1; i >= 0; i--)); do order+=("${ARMS[$i]}"); done
    fi
    for arm in "${order[@]}"; do
      IFS='|' read -r name stem spec <<< "$arm"
      train_arm "$name" "$stem" "$spec" "$seed"
    done
  done
fi

if [ "$what" = speed ] || [ "$what" = all ]; then
  # measured speed-up of every spec of a stem against that stem's unreduced model, in one interleaved run,
  # each spec also against a random pruner at its per-block counts; the top-1 of each arm is its training run's
  first=${seeds%% *}
  for stem in conv patch; do
    specs=()
    for arm in "${ARMS[@]}"; do
      IFS='|' read -r name arm_stem spec <<< "$arm"
      if [ "$arm_stem" = "$stem" ] && [ -n "$spec" ]; then specs+=(--spec "$spec"); fi
    done
    tokenreduce bench --checkpoint "$runs/$stem-none-s$first" "${specs[@]}" --match-random --threads "$threads" \
      --batch-size 32 --repeats 10 --out "$out/speed-$stem.d" > "$out/speed-$stem.txt"
    mv "$out/speed-$stem.d/results.json" "$out/speed-$stem.json" && rmdir "$out/speed-$stem.d"
    cat "$out/speed-$stem.txt"
  done
fi

if [ "$what" = deit ] || [ "$what" = all ]; then
  tokenreduce bench --model deit_small_patch16_224 \
    --spec 'imagepiece()' \
    --spec 'evit(keep=0.7, locs=(3, 6, 9))' \
    --spec 'imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))' \
    --spec 'imagepiece(keep=1.0) + evit(keep=0.7, locs=(3, 6, 9))' \
    --match-random --threads "$threads" --batch-size 32 --repeats 10 \
    --out "$out/bench_deit_small_cpu2.d" > "$out/bench_deit_small_cpu2.txt"
  mv "$out/bench_deit_small_cpu2.d/results.json" "$out/bench_deit_small_cpu2.json" && rmdir "$out/bench_deit_small_cpu2.d"
  cat "$out/bench_deit_small_cpu2.txt"
fi

if [ "$what" = smoke ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  tokenreduce train --recipe fmnist-vit-short --stem conv --epochs 1 --subset 256 --eval-subset 200 \
    --threads "$threads" --quiet --out "$tmp/run" --results "$tmp/run.json" \
    --spec 'imagepiece(locs=(1, 2, 4), keep=1.0) + evit(keep=0.76, locs=(2, 3, 5))'
  python - "$tmp/run.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]
print(f"smoke ok: top1 {m['top1']:.2f} on {m['n_eval']} images, spec {m['spec']}")
EOF
fi

if [ "$what" = summary ] || [ "$what" = all ]; then
  python "$out/summarize.py" | tee "$out/README-results.md"
fi

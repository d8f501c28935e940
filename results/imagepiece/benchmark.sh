#!/usr/bin/env bash
# ImagePiece (issue 8): the stem / re-tokenization controls, the baselines with the same stem, ImagePiece in
# front of them, and the hyper-speed regime - one resumable script.
#
#   train  every arm below x seeds 0 1 2 from scratch with the SAME short recipe (fmnist-vit-short: the
#          fmnist-vit model, 4 epochs on a fixed 20 000 training images, full test set at the end), the
#          reducer active in training; a finished run (its results JSON exists) is skipped
#   speed  tokenreduce eval on the trained checkpoints: measured img/s speed-up (same run) and top-1 of every
#          arm, one run per stem (results/imagepiece/speed-{conv,patch}/, ~10 min each)
#   deit   tokenreduce bench on deit_small_patch16_224 (random weights: speed only): the unreduced model,
#          ImagePiece at the paper's operating point (claimed +54% throughput), EViT keep 0.7, the
#          hyper-speed schedule, ImagePiece in front of EViT, each with a random pruner at its counts
#   smoke  one composite arm for a few steps (checks the pipeline; nothing is kept)
#   summary  python results/imagepiece/summarize.py > results/imagepiece/README-results.md
#
# Usage: bash results/imagepiece/benchmark.sh [--resume] [train|speed|deit|smoke|summary|all]   (default: train)
#   --resume  continue interrupted runs from their last checkpoint (exactly); finished runs are always skipped
#   THREADS=2 (torch threads per run), RUNS=runs/imagepiece (checkpoints), SEEDS="0 1 2"
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
  echo "== $name seed $seed"
  local args=(--recipe fmnist-vit-short --stem "$stem" --seed "$seed" --threads "$threads"
              --out "$runs/$name-s$seed" --results "$res" "${resume[@]}" "$@")
  if [ -n "$spec" ]; then
    args+=(--spec "$spec")
  fi
  tokenreduce train "${args[@]}"
}

if [ "$what" = train ] || [ "$what" = all ]; then
  mkdir -p "$out/runs"
  for seed in $seeds; do  # seed-major: every arm has a first seed before any has a third
    for arm in "${ARMS[@]}"; do
      IFS='|' read -r name stem spec <<< "$arm"
      train_arm "$name" "$stem" "$spec" "$seed"
    done
  done
fi

if [ "$what" = speed ] || [ "$what" = all ]; then
  # measured speed-up and top-1 of every trained arm in one interleaved run per stem (tokenreduce eval:
  # the first checkpoint is the unreduced reference; the checkpoints of one spec make one row, mean and
  # std over seeds); ImagePiece applied training-free to the unreduced model is the extra --spec row
  for stem in conv patch; do
    ckpts=()
    for arm in "${ARMS[@]}"; do
      IFS='|' read -r name arm_stem spec <<< "$arm"
      [ "$arm_stem" = "$stem" ] || continue
      for seed in $seeds; do
        if [ "$name" != "$stem-none" ] || [ "$seed" != "${seeds%% *}" ]; then
          ckpts+=(--checkpoint "$runs/$name-s$seed/model.safetensors")
        fi
      done
    done
    tokenreduce eval --checkpoint "$runs/$stem-none-s${seeds%% *}/model.safetensors" "${ckpts[@]}" \
      --spec 'imagepiece(locs=(1, 2, 4))' --threads "$threads" --out "$out/speed-$stem" | tee "$out/speed-$stem.txt"
  done
fi

if [ "$what" = deit ] || [ "$what" = all ]; then
  tokenreduce bench --model deit_small_patch16_224 \
    --spec 'imagepiece()' \
    --spec 'evit(keep=0.7, locs=(3, 6, 9))' \
    --spec 'imagepiece(locs=(1, 2, 3, 4, 5, 6, 7))' \
    --spec 'imagepiece(keep=1.0) + evit(keep=0.7, locs=(3, 6, 9))' \
    --match-random --threads "$threads" --batch 32 --repeats 10 \
    --out "$out/bench_deit_small_cpu2.json" > "$out/bench_deit_small_cpu2.txt"
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

#!/usr/bin/env bash
# BSPF, one resumable command: re-running it skips finished runs and resumes interrupted ones.
#
#   train     the apples-to-apples comparison on Fashion-MNIST: the same short fine-tune (recipe fmnist-bspf:
#             1 epoch on a fixed 20 000 training images, AdamW 3e-4, from the cached reference) of
#               full             full attention (the reference, fine-tuned the same way)
#               chunked          chunked attention alone, chunks of 7 patches (one grid row of 7x7)
#               bspf             chunked attention + pruning + fusion (exact scoring path)
#               bspf-tied        the same with W_q = W_k (--transform tie_qk, from the reference's weights); the
#                                mirrored path is measured on these checkpoints by the symmetry target
#             seeds 0 1 2; one results JSON per run in results/bspf/train/
#   symmetry  the symmetry experiment (|A - A^T|, exact vs mirrored decisions, outputs, top-1; symmetric and
#             non-symmetric kernel) on the 10 000 test images: the reference tied with tie_qk (untrained
#             kernel), the untied reference, and the trained tied checkpoints (every seed; each run compares the
#             exact and the mirrored path on the same weights)
#   speed     top-1, MACs and measured speed-up of the untied fine-tuned checkpoints in one interleaved run
#             (tokenreduce eval; a tied model has the same MACs and speed as the untied one: same fused qkv)
#   deit      deit_small_patch16_224 (random weights): MACs and measured speed-up of each variant (tokenreduce
#             bench, batch 32 and 1, with the random pruner of the same token counts)
#   all       train, symmetry, speed, then the summary (default); deit is separate (run it on idle cores)
#
# Usage: bash results/bspf/benchmark.sh [train|symmetry|speed|deit|summary|all] [--resume]
#   Every target skips what is finished (a results file exists) and resumes interrupted training runs
#   (tokenreduce train --resume); --resume is accepted and changes nothing.
# Knobs (environment): THREADS (2), RUNS (runs/bspf: checkpoints), SEEDS ("0 1 2"), IMAGES (10000, symmetry).
set -euo pipefail
cd "$(dirname "$0")/../.."
what=all
for arg in "$@"; do [ "$arg" = --resume ] || what=$arg; done
threads=${THREADS:-2}
runs=${RUNS:-runs/bspf}
seeds=${SEEDS:-0 1 2}
images=${IMAGES:-10000}
out=results/bspf
mkdir -p "$out/train" "$out/symmetry"

CHUNKED="chunked(size=7)"
BSPF="bspf(size=7, keep=0.5, locs=(1, 3))"
# name | spec ('' = none) | transform ('' = none)
VARIANTS=(
  "full||"
  "chunked|$CHUNKED|"
  "bspf|$BSPF|"
  "bspf-tied|$BSPF|tie_qk"
)

train() {
  for seed in $seeds; do
    for v in "${VARIANTS[@]}"; do
      IFS='|' read -r name spec transform <<< "$v"
      args=(--recipe fmnist-bspf --seed "$seed" --threads "$threads" --resume --quiet
            --out "$runs/$name-s$seed" --results "$out/train/$name-s$seed.json")
      if [ -n "$spec" ]; then args+=(--spec "$spec"); fi
      if [ -n "$transform" ]; then args+=(--transform "$transform"); fi
      if [ -f "$out/train/$name-s$seed.json" ]; then echo "done: $name seed $seed"; continue; fi
      echo "train: $name seed $seed"
      tokenreduce train "${args[@]}"
    done
  done
}

experiment() {  # experiment SPEC RESULTS
  if [ -f "$2" ]; then echo "done: $2"; return; fi
  tokenreduce experiment "$1" --threads "$threads" --results "$2"
}

symmetry() {
  experiment "bspf_symmetry(spec=\"$BSPF\", images=$images)" "$out/symmetry/reference-tied.json"
  experiment "bspf_symmetry(spec=\"$BSPF\", transform='', images=$images)" "$out/symmetry/reference-untied.json"
  for seed in $seeds; do
    for name in bspf-tied; do
      ckpt="$runs/$name-s$seed/model.safetensors"
      if [ ! -f "$ckpt" ]; then echo "skip: $ckpt missing (run the train target first)"; continue; fi
      experiment "bspf_symmetry(checkpoint='$ckpt', images=$images)" "$out/symmetry/$name-s$seed.json"
    done
  done
}

speed() {
  if [ -f "$out/fmnist_speed/results.json" ]; then echo "done: $out/fmnist_speed"; return; fi
  ckpts=()
  for name in full chunked bspf; do
    for seed in $seeds; do ckpts+=(--finetuned "$runs/$name-s$seed"); done
  done
  # the training-free chunked spec on the reference is timed too (and keeps eval from adding budget cases)
  tokenreduce eval --checkpoint "${TOKENREDUCE_CACHE:-cache}/fmnist-vit" --spec "$CHUNKED" "${ckpts[@]}" --threads "$threads" \
    --out "$out/fmnist_speed"
}

deit() {
  tokenreduce bench --model deit_small_patch16_224 --spec 'chunked(size=49)' \
    --spec 'bspf(size=49, keep=0.5, locs=(3, 6, 9))' --spec "bspf(size=49, keep=0.5, locs=(3, 6, 9), path='mirrored')" \
    --spec 'bspf(size=49, keep=0.5, locs=(3, 7))' --match-random --threads "$threads" --batch-size 32 --repeats 10 \
    --out "$out/bench_deit_small_cpu$threads.d" > "$out/bench_deit_small_cpu$threads.txt"
  mv "$out/bench_deit_small_cpu$threads.d/results.json" "$out/bench_deit_small_cpu$threads.json"
  rmdir "$out/bench_deit_small_cpu$threads.d"
  cat "$out/bench_deit_small_cpu$threads.txt"
}

case "$what" in
  train) train ;;
  symmetry) symmetry ;;
  speed) speed ;;
  deit) deit ;;
  summary) ;;
  all) train; symmetry; speed ;;
  *) echo "unknown target $what; choose train, symmetry, speed, deit, summary or all" >&2; exit 2 ;;
esac
python "$out/summarize.py" > "$out/summary.md"
cat "$out/summary.md"

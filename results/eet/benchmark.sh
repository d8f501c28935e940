#!/usr/bin/env bash
# EET on Fashion-MNIST, one resumable script: re-running it skips finished runs and resumes
# interrupted ones. Every run starts from the cached fmnist-vit reference (tokenreduce train --recipe
# fmnist-vit) with the fmnist-eet recipe (SGD momentum 0.9, lr 0.01, warm-up + cosine, batch 64, 1 epoch
# on a fixed 10 000 training images, FISH per-image targets):
#   (a) unpruned hashing baseline   --task 'eet(dkt=False, drg=False)'                 (0.1 CE + MSE)
#   (b) CTP only                    --task 'eet(dkt=False, drg=False)' --spec 'ctp()'
#   (c) CTP + DKT                   --task 'eet(drg=False)'            --spec 'ctp()'
#   (d) full EET (CTP + DKT + DRG)  --task 'eet'                       --spec 'ctp()'
# x bits 16 64 x seeds 0 1 2 -> results/eet/runs/<arm><bits>-s<seed>.json (metrics, command, versions).
# Then, once: img/s and batch-1 latency of CTP against the unpruned model in one interleaved run
# (tokenreduce eval of arm a with ctp() training-free and arm b fine-tuned, 16 bits, seed 0) ->
# results/eet/speed/; recall@kept of ctp() on the reference -> results/eet/recall_at_kept.{json,md}.
# Summary: python results/eet/summarize.py (also run at the end).
# Usage: bash results/eet/benchmark.sh [train|speed|recall|all]   (THREADS=1 to share the machine;
# RUNS=DIR for the checkpoints, default runs/eet)
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
threads=${THREADS:-2}
runs=${RUNS:-runs/eet}
out=results/eet
mkdir -p "$out/runs"

arm_task() {  # the task spec of an arm (bits come from --bits)
  case $1 in
    a|b) echo "eet(dkt=False, drg=False)" ;;
    c) echo "eet(drg=False)" ;;
    d) echo "eet" ;;
  esac
}

if [ "$what" = train ] || [ "$what" = all ]; then
  for bits in ${BITS:-16 64}; do
    for seed in 0 1 2; do
      for arm in a b c d; do
        spec=()
        [ "$arm" = a ] || spec=(--spec 'ctp()')
        if [ -f "$out/runs/$arm$bits-s$seed.json" ]; then echo "done: $arm$bits-s$seed"; continue; fi
        tokenreduce train --recipe fmnist-eet --task "$(arm_task $arm)" --bits "$bits" "${spec[@]}" --seed "$seed" \
          --threads "$threads" --resume --out "$runs/$arm$bits-s$seed" --results "$out/runs/$arm$bits-s$seed.json"
      done
    done
  done
fi
if [ "$what" = speed ] || [ "$what" = all ]; then
  if [ ! -f "$out/speed/results.json" ]; then
    tokenreduce eval --checkpoint "$runs/a16-s0/model.safetensors" --finetuned "$runs/b16-s0/model.safetensors" \
      --spec 'ctp()' --threads "$threads" --out "$out/speed"
  fi
fi
if [ "$what" = recall ] || [ "$what" = all ]; then
  if [ ! -f "$out/recall_at_kept.json" ]; then
    tokenreduce experiment "recall_at_kept(spec='ctp()')" --threads "$threads" --out "$runs/recall" \
      --results "$out/recall_at_kept.json" > "$out/recall_at_kept.md.tmp"
    mv "$out/recall_at_kept.md.tmp" "$out/recall_at_kept.md"
  fi
fi
python "$out/summarize.py"

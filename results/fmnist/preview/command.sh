#!/usr/bin/env bash
# Accuracy of the 1.5x picks' fine-tunes (3 seeds each) on all 10 000 test images, before the `final`
# step: one tokenreduce eval of the reference and the 18 checkpoints. Run while other fine-tunes used the
# cores, with --repeats 1 --warmup 0: its timing columns mean nothing (read the speed-ups from free/).
# With no --spec, eval also adds its default budget picks (rule macs) as training-free rows.
set -euo pipefail
cd "$(dirname "$0")/../../.."
args=()
while IFS=$'\t' read -r name spec; do
  case $name in *-1.5x) ;; *) continue ;; esac
  for s in 0 1 2; do args+=(--checkpoint "cache/ft-2ep/$name-s$s"); done
done < results/fmnist/picks.tsv
tokenreduce eval --checkpoint cache/fmnist-vit "${args[@]}" --seeds 0,1,2 --threads 1 --repeats 1 --warmup 0 \
    --out results/fmnist/preview

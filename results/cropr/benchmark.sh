#!/usr/bin/env bash
# Token Cropr on Fashion-MNIST, one resumable script: every training run is
# `tokenreduce train --resume` (a finished run is reused, an interrupted one continues from its last
# checkpoint) and writes its own results JSON; the diagnostics and the bench skip a results file
# that exists (delete it to redo).
#
#   bash results/cropr/benchmark.sh [--resume] [cls|seg|diag|bench|all]     (default: all = cls seg diag)
#
#   cls    classification, recipe fmnist-cropr (1 epoch fine-tune of the cached fmnist-vit on a fixed
#          20 000 images): cropr(r=6) and random / topk / evit at the same per-block counts
#          49 -> 42 -> 36 -> 30 -> 24 -> 18 after blocks 0..4, plus the unpruned fine-tune; seeds 0 1 2
#   seg    segmentation of the mosaics, recipe fmnist-cropr-seg (from scratch, 3 epochs on 6 000):
#          cropr(r=40, one query per patch, warm-up) + llf() and random / topk / evit at the same counts
#          196 -> 155 -> 115 -> 75 -> 35 after blocks 0..3, + llf() (the final block on all 196 tokens;
#          EViT fuses what it drops, so nothing comes back and its final block runs on 36); seeds 0 1 2.
#          The unpruned baseline is results/platform/seg (fmnist-seg: the same recipe without --spec).
#   diag   cropr_diagnostics on each seg cropr checkpoint (deployed vs training-time score, mIoU with
#          each, a fixed random scorer at the same schedule with LLF, unpruned)
#   bench  (a separate target, not in all) DeiT-S throughput of cropr's deployed form vs random at the
#          same schedule, in one interleaved run (target: within 3%)
#
# Results: results/cropr/{cls,seg,diag}/*.json and bench_deit_small_cpu2.{json,txt}; tables:
# python results/cropr/summarize.py. Knobs (environment): THREADS (default 2), RUNS (checkpoints,
# default runs/cropr), SEEDS (default "0 1 2"), DIAG_ARGS (extra experiment parameters, e.g.
# ", images=500").
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --resume ]; then shift; fi  # every run resumes anyway
what=${1:-all}
threads=${THREADS:-2}
runs=${RUNS:-runs/cropr}
seeds=${SEEDS:-0 1 2}
out=results/cropr
mkdir -p "$out/cls" "$out/seg" "$out/diag"

cls_at="counts=(42, 36, 30, 24, 18), locs=(0, 1, 2, 3, 4)"
seg_at="counts=(155, 115, 75, 35), locs=(0, 1, 2, 3)"

train() {  # train NAME RECIPE SEED [SPEC]: one resumable run
  local name=$1 recipe=$2 seed=$3
  local args=(--recipe "$recipe" --seed "$seed" --threads "$threads" --resume --quiet
              --out "$runs/$name-s$seed" --results "$out/${name%%-*}/$name-s$seed.json")
  if [ $# -ge 4 ]; then args+=(--spec "$4"); fi
  echo "== $name seed $seed" >&2
  tokenreduce train "${args[@]}"
}

if [ "$what" = cls ] || [ "$what" = all ]; then
  for seed in $seeds; do
    train cls-cropr fmnist-cropr "$seed" "cropr(r=6, classes=10)"  # 49 -> 42 -> 36 -> 30 -> 24 -> 18
    train cls-random fmnist-cropr "$seed" "random($cls_at, where='block', seed=$seed)"
    train cls-topk fmnist-cropr "$seed" "topk($cls_at, where='block')"
    train cls-evit fmnist-cropr "$seed" "evit($cls_at)"
    train cls-none fmnist-cropr "$seed" ""
  done
fi

if [ "$what" = seg ] || [ "$what" = all ]; then
  for seed in $seeds; do
    train seg-cropr fmnist-cropr-seg "$seed" "cropr(r=40, queries=196, classes=11, locs=(0, 1, 2, 3), warmup_steps=140) + llf()"
    train seg-random fmnist-cropr-seg "$seed" "random($seg_at, where='block', seed=$seed) + llf()"
    train seg-topk fmnist-cropr-seg "$seed" "topk($seg_at, where='block') + llf()"
    train seg-evit fmnist-cropr-seg "$seed" "evit($seg_at) + llf()"
  done
fi

if [ "$what" = diag ] || [ "$what" = all ]; then
  for seed in $seeds; do
    ckpt="$runs/seg-cropr-s$seed"
    result="$out/diag/diag-s$seed.json"
    if [ -f "$result" ]; then continue; fi
    if [ ! -f "$ckpt/model.safetensors" ]; then echo "no $ckpt: run the seg target first" >&2; exit 1; fi
    tokenreduce experiment "cropr_diagnostics(checkpoint='$ckpt'${DIAG_ARGS:-})" --threads "$threads" \
      --out "$runs/diag-s$seed" --results "$result" > "$out/diag/diag-s$seed.md"
  done
fi

if [ "$what" = bench ]; then
  # the deployed form (inference=True: q only) against the random pruner at the same per-block counts,
  # all in one interleaved run (summarize.py pairs them per timed round); r = 8 and 16 without LLF
  # (modules after blocks 0..10), r = 8 with LLF (modules after blocks 0..9, all tokens back before block 11)
  l11="locs=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)"
  l10="locs=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"
  c8="counts=(187, 179, 171, 163, 155, 147, 139, 131, 123, 115"
  if [ ! -f "$out/bench_deit_small_cpu2.json" ]; then
    tokenreduce bench --model deit_small_patch16_224 --threads "$threads" --batch-size 32 --repeats 10 \
      --spec "cropr(r=8, inference=True)" --spec "random($c8, 107), $l11, where='block')" \
      --spec "cropr(r=16, inference=True)" \
      --spec "random(counts=(179, 163, 147, 131, 115, 99, 83, 67, 51, 35, 19), $l11, where='block')" \
      --spec "cropr(r=8, $l10, inference=True) + llf()" --spec "random($c8), $l10, where='block') + llf()" \
      --out "$out/bench_deit_small_cpu2.d" > "$out/bench_deit_small_cpu2.txt"
    mv "$out/bench_deit_small_cpu2.d/results.json" "$out/bench_deit_small_cpu2.json" && rmdir "$out/bench_deit_small_cpu2.d"
  fi
fi

python "$out/summarize.py"

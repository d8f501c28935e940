#!/usr/bin/env bash
# The prepared GPU check: on one CUDA GPU, in about 10 minutes,
#   1. the GPU test tier (pytest -m gpu: the contract suite on CUDA in float32 and bf16, the CUDA-only tests),
#   2. the GPU preset (tokenreduce study backends --testbed gpu: DeiT-S, bfloat16, batch 256 and 1, every
#      method at its published schedule with its matched random pruner, eager, and ToMe with CUDA graphs),
#   3. the scene study at ten times its CPU length: Cropr and top-k at Cropr's counts for 9 370 steps
#      (tokenreduce study cropr --run cropr-t9370-s0 / topk-t9370-s0), as far as the time left allows.
# Everything it writes goes to $OUT (default results/device): its log, the preset's records and summary, the
# scene records. Each step has a deadline; a scene run cut short keeps its checkpoint and resumes next time.
#
#   scripts/device-check.sh            on CUDA (fails without it)
#   scripts/device-check.sh --smoke    the same steps on the CPU at the studies' smoke sizes (the slow test tier)
#
# Environment: OUT (output folder), TOKENREDUCE_DATA (where the Fashion-MNIST files are, if not in the system
# folder), BUDGET_S (seconds for the whole script, default 570), PYTHON (default python3).
set -uo pipefail

smoke=0
[[ "${1:-}" == "--smoke" ]] && smoke=1
out="${OUT:-results/device}"
budget="${BUDGET_S:-570}"
py="${PYTHON:-python3}"
mkdir -p "$out"
log="$out/device-check.log"
: > "$log"
start=$(date +%s)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
say() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$log"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
step() {  # step NAME SECONDS COMMAND...: run with the smaller of SECONDS and the time left
    local name=$1 want=$2; shift 2
    local t; t=$(left); (( t < want )) && want=$t
    if (( want < 20 )); then say "skip $name: ${t}s left"; return 0; fi
    say "start $name (deadline ${want}s): $*"
    timeout --signal=INT --kill-after=15 "$want" "$@" >> "$log" 2>&1
    local rc=$?
    say "end $name rc=$rc"
    return 0
}

if (( smoke )); then device=cpu; amp=off; else device=cuda; amp=bf16; fi
"$py" - <<PY | tee -a "$log"
import json, torch
from tokenreduce.models.precision import device_info
print(json.dumps({"torch": torch.__version__, "cuda": torch.cuda.is_available(), **device_info("$device")}))
PY
if (( ! smoke )) && ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    say "no CUDA device: run with --smoke on a machine without one"; exit 2
fi

step "gpu test tier" 150 "$py" -m pytest -q -m gpu -p no:cacheprovider tests/test_contract.py tests/test_gpu_paths.py

# the smoke trains the one-epoch pair (a smoke epoch is seconds; ten of them would be the step's whole time)
if (( smoke )); then size=(--smoke --device cpu); long=t937; else size=(--device cuda); long=t9370; fi
step "gpu preset" 300 "$py" -m tokenreduce.cli study backends --testbed gpu "${size[@]}" --out "$out/backends-gpu"
for run in "cropr-$long-s0" "topk-$long-s0"; do
    step "scene run $run" 240 "$py" -m tokenreduce.cli study cropr --testbed scenes --run "$run" "${size[@]}" \
        --amp "$amp" --out "$out/cropr-scenes"
done
say "done in $(( $(date +%s) - start ))s; wrote $(find "$out" -name '*.json' -o -name '*.md' | wc -l) records and summaries"

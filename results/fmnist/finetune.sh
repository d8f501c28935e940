# The benchmark's fine-tune of one spec and seed, shared by results/fmnist/benchmark.sh and
# results/fmnist/matched/command.sh so that every arm runs the identical recipe (sourced):
#
#   finetune NAME SPEC SEED   -> $FT_DIR/NAME-sSEED/ (skipped when finished; resumed when interrupted;
#                                claimed through a lock so that several lanes may share the work)
#
# Reads REF (the reference and teacher), FT_DIR, FT_EPOCHS, FT_SUBSET (training images per epoch;
# empty: all), THREADS.
. "$(dirname "${BASH_SOURCE[0]}")/../lanes.sh"

finetune() {
  local name=$1 spec=$2 seed=$3
  local dir="$FT_DIR/$name-s$seed" subset=()
  if [ -f "$dir/model.safetensors" ]; then return; fi
  if ! claim "$dir.lock"; then echo "== $name seed $seed: in progress in another lane"; return; fi
  if [ -n "${FT_SUBSET:-}" ]; then subset=(--subset "$FT_SUBSET"); fi
  echo "== $name seed $seed"
  tokenreduce train --recipe fmnist-vit-ft --init "$REF" --teacher "$REF" --spec "$spec" \
      --epochs "$FT_EPOCHS" "${subset[@]}" --eval-subset 500 --seed "$seed" \
      --threads "$THREADS" --quiet --resume --out "$dir"
  release "$dir.lock"
}

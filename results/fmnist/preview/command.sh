cd /work/main
. .venv/bin/activate
export TOKENREDUCE_CACHE=/work/main/cache
args=()
while IFS=$'\t' read -r name spec; do
  case $name in *-1.5x) ;; *) continue ;; esac
  for s in 0 1 2; do args+=(--checkpoint cache/ft-2ep/$name-s$s); done
done < results/fmnist/picks.tsv
tokenreduce eval --checkpoint cache/fmnist-vit "${args[@]}" --seeds 0,1,2 --threads 1 --repeats 1 --warmup 0 --out /tmp/preview

# Shared by the benchmark scripts (sourced): several lanes (e.g. two processes of THREADS=1 on 2 cores)
# may run the same script; each run is claimed through a lock directory holding its owner's pid, so the
# other lanes skip it, and a lock whose owner is gone (killed lane) is taken over.
#
#   if claim "$dir.lock"; then tokenreduce train ...; release "$dir.lock"; fi

claim() {  # claim LOCKDIR: 0 if this lane may run it (free, or its owner is gone), 1 if another lane runs it
  mkdir -p "$(dirname "$1")"
  if ! mkdir "$1" 2>/dev/null; then
    local owner
    owner=$(cat "$1/pid" 2>/dev/null || true)
    if [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null; then
      return 1
    fi
  fi
  echo $$ > "$1/pid"
}

release() {  # release LOCKDIR
  rm -rf "$1"
}

# Shared by scripts/build-kube.sh and scripts/build-tools.sh (sourced, not run):
# logging, finding Go, Go's per-user caches, and one build at a time per cache.
#
# The sourcing script sets NAME (log prefix), START (=$SECONDS), CACHE (its binary cache)
# and GOCACHE_ROOT, and defines `built` and `link_bins`.

log() { printf '[%s %4ds] %s\n' "$NAME" "$((SECONDS - START))" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$NAME" "$1" >&2; exit "${2:-1}"; }

# find_go WHY — sets GO, or exits 3 saying what the build is for.
find_go() {
  if [[ -z "${GO:-}" ]]; then
    if command -v go >/dev/null 2>&1; then GO="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
    else
      die "Go is not installed (no 'go' on PATH, no /usr/local/go/bin/go). Install Go >= 1.24 or set GO=/path/to/go; $1" 3
    fi
  fi
  [[ -x "$GO" ]] || die "GO=$GO is not executable" 3
}

go_env() {
  export GOMODCACHE="$GOCACHE_ROOT/mod" GOCACHE="$GOCACHE_ROOT/build" GOPATH="$GOCACHE_ROOT/path"
  export GOTOOLCHAIN=local GOFLAGS="-buildvcs=false -mod=mod" CGO_ENABLED=0 GO111MODULE=on
  mkdir -p "$CACHE" "$GOMODCACHE" "$GOCACHE" "$GOPATH"
}

# lock_cache — one build at a time (parallel pytest sessions / CI jobs share the cache);
# exits 0 when a concurrent run finished the build while we waited.
lock_cache() {
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lock"
    if ! flock -n 9; then
      log "another build holds $CACHE/.lock; waiting"
      flock 9
    fi
  fi
  if built; then link_bins; log "built by a concurrent run"; exit 0; fi
}

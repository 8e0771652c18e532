# Shared by scripts/build-kube.sh, build-tools.sh and build-enforcer.sh (sourced, not
# run): logging, the fast path (--print, a cached build), finding Go, Go's per-user caches,
# and one build at a time per cache.
#
# The sourcing script sets NAME (log prefix), START (=$SECONDS) and CACHE (its binary
# cache), and defines `built` and `link_bins`. Go's caches are per user, shared by all
# three: GOCACHE_ROOT (SANDBOX_GO_CACHE moves them).

GOCACHE_ROOT="${SANDBOX_GO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-workspace/go}"

log() { printf '[%s %4ds] %s\n' "$NAME" "$((SECONDS - START))" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$NAME" "$1" >&2; exit "${2:-1}"; }

# fast_path PRINTED MESSAGE "$@" — `--print`: print PRINTED and exit 0 when built, else
# exit 1; built: link the binaries, log "cached: MESSAGE", exit 0 (no Go needed). Else
# returns: the caller builds.
fast_path() {
  local printed="$1" message="$2"
  if [[ "${3:-}" == "--print" ]]; then
    built && { echo "$printed"; exit 0; }
    exit 1
  fi
  if built; then
    link_bins
    log "cached: $message"
    exit 0
  fi
}

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

# lock_cache [LOCK] — one build at a time (parallel pytest sessions / CI jobs share the
# cache); LOCK: the lock file's name in CACHE (.lock; another name lets a build of other
# binaries in the same cache run beside it). Exits 0 when a concurrent run finished the
# build while we waited.
lock_cache() {
  local lock="$CACHE/${1:-.lock}"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$lock"
    if ! flock -n 9; then
      log "another build holds $lock; waiting"
      flock 9
    fi
  fi
  if built; then link_bins; log "built by a concurrent run"; exit 0; fi
}

#!/usr/bin/env bash
# Build the Kubernetes binaries the `cluster` and `node` test tiers use, from Go modules
# only: etcd, kube-apiserver and kube-controller-manager (control plane), plus
# kube-scheduler, kubelet and kubectl (the node tier: a real node and docs/operations.md's
# kubectl commands).
#
#   scripts/build-kube.sh            build (or reuse) the pinned versions
#   scripts/build-kube.sh --print    print the bin directory and exit 0 when built
#
# The binaries live under the git-ignored .cache/ directory of the project:
#   .cache/kube/bin/                 symlinks to the pinned binaries (what tests use)
#   .cache/kube/<component>-<ver>/   wrapper modules and the versioned binaries
# Go's own caches (GOMODCACHE, GOCACHE, GOPATH; 3.7 GB) are per user, in
# ~/.cache/sandbox-workspace/go/{mod,build,path}, so a fresh clone on the same machine
# (CI's) rebuilds in seconds instead of minutes. SANDBOX_GO_CACHE moves them.
#
# A second run with the binaries present takes well under a second.
# Override the pins with K8S_VERSION / ETCD_VERSION, the Go binary with GO=.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SANDBOX_KUBE_CACHE:-$ROOT/.cache/kube}"
BIN="$CACHE/bin"
K8S_DIR="$CACHE/kubernetes-$K8S_VERSION"
ETCD_DIR="$CACHE/etcd-$ETCD_VERSION"

START=$SECONDS
NAME=build-kube
# shellcheck source=lib/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-build.sh"
# `go get` lists every module it adds or upgrades (hundreds); keep the rest.
quiet() { "$@" 2>&1 | { grep -vE '^go: (added|upgraded|downgraded) ' || true; } >&2; }

# Every binary of the Kubernetes release that the tiers run (one wrapper module builds all).
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

# k8s_missing — the commands of K8S_CMDS not built yet, one per line.
k8s_missing() {
  local c
  for c in "${K8S_CMDS[@]}"; do [[ -x "$K8S_DIR/bin/$c" ]] || echo "$c"; done
}

built() {
  [[ -x "$ETCD_DIR/bin/etcd" && -z "$(k8s_missing)" ]]
}

link_bins() {
  mkdir -p "$BIN"
  ln -sfn "../etcd-$ETCD_VERSION/bin/etcd" "$BIN/etcd"
  local c
  for c in "${K8S_CMDS[@]}"; do
    ln -sfn "../kubernetes-$K8S_VERSION/bin/$c" "$BIN/$c"
  done
  printf 'K8S_VERSION=%s\nETCD_VERSION=%s\n' "$K8S_VERSION" "$ETCD_VERSION" >"$BIN/VERSIONS"
}

fast_path "$BIN" "etcd $ETCD_VERSION, kubernetes $K8S_VERSION in $BIN" "$@"

# ---- Go toolchain -----------------------------------------------------------
find_go "the cluster test tier needs it to build etcd and kube-apiserver."
go_env

lock_cache

log "go: $("$GO" version) ($GO); $(nproc) cores"
log "caches: GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE"

# ---- etcd ------------------------------------------------------------------
build_etcd() {
  local src="$ETCD_DIR/src" t0=$SECONDS
  log "etcd $ETCD_VERSION: preparing wrapper module in $src"
  rm -rf "$src"; mkdir -p "$src" "$ETCD_DIR/bin"
  cat >"$src/main.go" <<'GO'
// Wrapper so etcd builds from published modules (etcd's own main module
// carries replace directives that `go install pkg@version` refuses).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (
    cd "$src"
    "$GO" mod init sandbox-workspace.local/etcd-build >/dev/null 2>&1
    log "etcd: resolving go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    quiet "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    "$GO" mod tidy >&2
    log "etcd: compiling"
    "$GO" build -trimpath -ldflags "-s -w" -o "$ETCD_DIR/bin/etcd.tmp" . >&2
  )
  mv -f "$ETCD_DIR/bin/etcd.tmp" "$ETCD_DIR/bin/etcd"
  log "etcd: done in $((SECONDS - t0))s: $("$ETCD_DIR/bin/etcd" --version | head -1)"
}

# ---- the Kubernetes commands (only those missing: a cache built before kubelet joined
# the list keeps its control-plane binaries) -----------------------------------
build_k8s() {
  local src="$K8S_DIR/src" t0=$SECONDS minor patch major gomod info build_date
  [[ "$K8S_VERSION" =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.34.4"
  major="${BASH_REMATCH[1]}"; minor="${BASH_REMATCH[2]}"; patch="${BASH_REMATCH[3]}"
  local staging="v0.$minor.$patch"
  log "kubernetes $K8S_VERSION: fetching the release's go.mod"
  rm -rf "$src"; mkdir -p "$src" "$K8S_DIR/bin"
  local json; json="$(cd "$src" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1)" || true
  gomod="$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$json")"
  info="$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",$/\1/p' <<<"$json")"
  [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION: $json"
  build_date="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info")"
  [[ -n "$build_date" ]] || build_date="1970-01-01T00:00:00Z"

  # Wrapper go.mod: the release's go/godebug lines, a requirement on the release,
  # and every staging replace (=> ./staging/src/k8s.io/X) turned into X@v0.minor.patch.
  {
    echo "module sandbox-workspace.local/kube-build"
    echo
    grep -E '^(go|godebug) ' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "$gomod" | sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*$#\t\1 => \1 '"$staging"'#p'
    echo ")"
  } >"$src/go.mod"
  local n; n="$(grep -c " => k8s.io/" "$src/go.mod" || true)"
  [[ "$n" -gt 10 ]] || die "found only $n staging replaces in $gomod"
  log "kubernetes: wrapper module with $n staging replaces -> $staging"

  local cmds pkgs=() c
  mapfile -t cmds < <(k8s_missing)
  for c in "${cmds[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (
    cd "$src"
    log "kubernetes: resolving dependencies (go get)"
    quiet "$GO" get "${pkgs[@]/%/@$K8S_VERSION}"
    local X="" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      X+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
      X+=" -X $p.gitTreeState=clean -X $p.buildDate=$build_date"
    done
    log "kubernetes: compiling ${cmds[*]} (the slow part: ~4-5 min cold on 2 cores for the control plane, ~4 min more for kubelet/scheduler/kubectl)"
    rm -rf "$K8S_DIR/bin/tmp"; mkdir -p "$K8S_DIR/bin/tmp"
    "$GO" build -trimpath -ldflags "-s -w$X" -o "$K8S_DIR/bin/tmp/" "${pkgs[@]}" >&2
  )
  for c in "${cmds[@]}"; do mv -f "$K8S_DIR/bin/tmp/$c" "$K8S_DIR/bin/$c"; done
  rmdir "$K8S_DIR/bin/tmp"
  log "kubernetes: done in $((SECONDS - t0))s: $("$K8S_DIR/bin/kube-apiserver" --version)"
}

[[ -x "$ETCD_DIR/bin/etcd" ]] || build_etcd
[[ -z "$(k8s_missing)" ]] || build_k8s
link_bins
log "all built in $((SECONDS - START))s -> $BIN"

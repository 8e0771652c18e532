#!/usr/bin/env bash
# Build the node tier's NetworkPolicy enforcer from Go modules: kube-router's firewall
# (iptables + ipset; started with --run-firewall only, no routing, no service proxy).
#
#   scripts/build-enforcer.sh            build (or reuse) the pinned version
#   scripts/build-enforcer.sh --print    print the binary's path and exit 0 when built
#
# Why kube-router and not sigs.k8s.io/kube-network-policies (which builds against newer
# k8s.io modules): kube-network-policies sends each new connection to userspace with the
# nftables `queue` expression, and this kind of kernel has no CONFIG_NFT_QUEUE, so its
# rules cannot be loaded. kube-router only needs iptables, ipset and br_netfilter, which
# the tier's namespace has (docs/egress-spike.md (c)). Its one published v2 release
# (v2.1.0) builds against client-go 0.29, so it shares little of the control plane's Go
# build cache: ~8 min cold on a loaded 2-core machine, under a second once built.
#
# The binary lives beside the kube binaries (SANDBOX_KUBE_CACHE, default .cache/kube):
#   .cache/kube/kube-router-<ver>/bin/kube-router, linked as .cache/kube/bin/kube-router.
# Go's caches are the per-user ones scripts/build-kube.sh uses.
set -euo pipefail

KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SANDBOX_KUBE_CACHE:-$ROOT/.cache/kube}"
GOCACHE_ROOT="${SANDBOX_GO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-workspace/go}"
BIN="$CACHE/bin"
DIR="$CACHE/kube-router-$KUBE_ROUTER_VERSION"

START=$SECONDS
NAME=build-enforcer
# shellcheck source=lib/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-build.sh"

built() { [[ -x "$DIR/bin/kube-router" ]]; }
link_bins() { mkdir -p "$BIN"; ln -sfn "../kube-router-$KUBE_ROUTER_VERSION/bin/kube-router" "$BIN/kube-router"; }

if [[ "${1:-}" == "--print" ]]; then
  built && { echo "$BIN/kube-router"; exit 0; }
  exit 1
fi
if built; then
  link_bins
  log "cached: kube-router $KUBE_ROUTER_VERSION in $BIN"
  exit 0
fi

find_go "the node tier needs it to build its NetworkPolicy enforcer (kube-router)."
go_env
# Its own lock file: the kube build (same cache dir) may run beside it.
exec 8>"$CACHE/.lock-enforcer"
flock 8
if built; then link_bins; log "built by a concurrent run"; exit 0; fi

log "kube-router $KUBE_ROUTER_VERSION: compiling (~8 min cold on 2 loaded cores)"
mkdir -p "$DIR/bin"
GOBIN="$DIR/bin/tmp" "$GO" install -trimpath -ldflags "-s -w" \
  "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" >&2
mv -f "$DIR/bin/tmp/kube-router" "$DIR/bin/kube-router"
rmdir "$DIR/bin/tmp"
link_bins
log "kube-router: done in $((SECONDS - START))s -> $BIN/kube-router"

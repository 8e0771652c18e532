#!/usr/bin/env bash
# Build the node tier's NetworkPolicy enforcer: scripts/enforcer/, a small Go command of
# ours that runs kube-router's network policy controller (iptables + ipset) and nothing
# else of kube-router.
#
#   scripts/build-enforcer.sh            build (or reuse) it
#   scripts/build-enforcer.sh --print    print the binary's path and exit 0 when built
#
# Why kube-router's controller and not sigs.k8s.io/kube-network-policies: the latter sends
# each new connection to userspace with the nftables `queue` expression, and this kind of
# kernel has no CONFIG_NFT_QUEUE, so its rules cannot be loaded. kube-router's needs only
# iptables, ipset and br_netfilter, which the tier's namespace has (docs/egress-spike.md (c)).
#
# Why our own command and not kube-router's: its only published v2 release (v2.1.0) links
# gobgp, IPVS, the Docker client and the AWS SDK against client-go 0.29 — ~8 CPU-minutes
# cold. scripts/enforcer/go.mod holds every module it shares with the control plane at
# the version Kubernetes (scripts/build-kube.sh's K8S_VERSION) selects, so after that
# build (the prebuild runs this step right after `kube`) only kube-router's packages,
# netlink and go-iptables are compiled: docs/testing.md has the measured cost.
#
# The binary lives beside the kube binaries (SANDBOX_KUBE_CACHE, default .cache/kube), in
# a directory named after a hash of scripts/enforcer/ (a changed source builds anew):
#   .cache/kube/enforcer-<hash>/enforcer, linked as .cache/kube/bin/enforcer.
# Go's caches are the per-user ones scripts/build-kube.sh uses.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/scripts/enforcer"
CACHE="${SANDBOX_KUBE_CACHE:-$ROOT/.cache/kube}"
BIN="$CACHE/bin"
HASH="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -c1-12)"
DIR="$CACHE/enforcer-$HASH"

START=$SECONDS
NAME=build-enforcer
# shellcheck source=lib/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-build.sh"

built() { [[ -x "$DIR/enforcer" ]]; }
link_bins() { mkdir -p "$BIN"; ln -sfn "../enforcer-$HASH/enforcer" "$BIN/enforcer"; }

fast_path "$BIN/enforcer" "enforcer $HASH in $BIN" "$@"

find_go "the node tier needs it to build its NetworkPolicy enforcer (scripts/enforcer)."
go_env
# go.sum is committed: a module graph that does not match it is an error, not an edit.
export GOFLAGS="-buildvcs=false -mod=readonly"
# Its own lock file: the kube build (same cache dir) may run beside it.
lock_cache .lock-enforcer

log "enforcer $HASH: compiling scripts/enforcer (kube-router's netpol controller)"
mkdir -p "$DIR"
(cd "$SRC" && "$GO" build -trimpath -ldflags "-s -w" -o "$DIR/enforcer.tmp" .) >&2
mv -f "$DIR/enforcer.tmp" "$DIR/enforcer"
link_bins
log "enforcer: done in $((SECONDS - START))s -> $BIN/enforcer"

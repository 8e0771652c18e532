#!/usr/bin/env bash
# Installs the optional system tools the tests exercise, where this machine allows it:
#   bubblewrap — the local backend presents workspaces at /workspace (tests/api/test_bwrap.py)
#   curl       — the README walk-through test
#   nodejs     — seed 000 §6's frontend snippets run as written (tests/api/test_seed_snippets.py)
#   redis-server — the Redis-protocol chat run store shared by API replicas
#                (tests/api/test_runstore_replicas.py, tests/unit/test_runstore_redis.py,
#                bench/ha.py); Debian's Redis 7 (valkey-server, where installed, is used too)
#   chromium  — the web page's browser test (tests/browser; Playwright drives Debian's
#               Chromium, since Playwright's own browser download is not used)
#   podman, runc, debootstrap — the image smoke test (tests/image; scripts/build-image.sh):
#                a Debian base made with debootstrap, the Dockerfile built and run by
#                podman with runc (~10 s to install; the first image build ~90 s)
#   containerd, containernetworking-plugins, gcc + libc6-dev (static libc), iproute2 —
#                the node tier (tests/node): a real kubelet runs pods through Debian's
#                containerd + runc, CNI bridge/host-local give them addresses inside the
#                tier's private network namespace, gcc -static builds the pause binary;
#                iptables + ipset: the tier's NetworkPolicy enforcer (kube-router's controller)
# Without root or apt-get it only reports what is missing; the tests that need a missing
# tool are then skipped with a reason that names it.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v curl >/dev/null || missing+=(curl)
command -v node >/dev/null || missing+=(nodejs)
command -v nsenter >/dev/null || missing+=(util-linux)
command -v redis-server >/dev/null || command -v valkey-server >/dev/null || missing+=(redis-server)
command -v podman >/dev/null || missing+=(podman)
[ -x /usr/sbin/runc ] || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v containerd >/dev/null || missing+=(containerd)
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
command -v gcc >/dev/null || missing+=(gcc)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || missing+=(libc6-dev)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
command -v ipset >/dev/null || missing+=(ipset)
command -v chromium >/dev/null || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "installing ${missing[*]} (apt-get)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
else
  echo "note: ${missing[*]} not installed (need root + apt-get); dependent tests will skip"
fi

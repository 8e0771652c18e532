#!/usr/bin/env bash
# What the heavy test tiers need built, in the order they need it, for the test run to
# start in the background while the light tiers run (tests/support/prebuild.py):
#   tools  scripts/build-tools.sh             helm, kubeconform (tests/chart)
#   kube   scripts/build-kube.sh              etcd, the control plane, kubelet (tests/cluster,
#                                             tests/node, the benches' control plane)
#   enforcer scripts/build-enforcer.sh        the node tier's NetworkPolicy enforcer
#                                             (scripts/enforcer/: kube-router's controller);
#                                             after kube, whose Go build cache it reuses
#                                             (seconds then), in the background beside
#                                             the next step (images: podman, debootstrap)
#   images scripts/node/images.sh             pause + the product image as OCI archives
#                                             (tests/node), then the image tests' tag
#                                             (tests/image; podman's layer cache: seconds)
#
#   scripts/prebuild.sh DIR [STEP...]         run the steps (default: all), each step's exit
#                                             code written to DIR/STEP.rc when it ends
#
# Every step is the script a tier would run itself, and each locks its cache: a tier that
# calls one while this is at it waits for it, then finds the output cached. A failed step
# is only recorded — the tier that needs it runs the script again and reports why.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:?usage: scripts/prebuild.sh DIR [STEP...]}"
shift
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(tools kube enforcer images)
mkdir -p "$DIR"

run_step() {
  case "$1" in
    tools) bash "$ROOT/scripts/build-tools.sh" ;;
    kube) bash "$ROOT/scripts/build-kube.sh" ;;
    enforcer) bash "$ROOT/scripts/build-enforcer.sh" ;;
    images)
      bash "$ROOT/scripts/node/images.sh" &&
        IMAGE="${SANDBOX_TEST_IMAGE:-localhost/sandbox-workspace:test}" \
          bash "$ROOT/scripts/build-image.sh" --no-smoke ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

one_step() {
  local started=$SECONDS rc
  echo "[prebuild] $1: started"
  run_step "$1" 2>&1
  rc=$?
  echo "$rc" >"$DIR/$1.rc.tmp" && mv -f "$DIR/$1.rc.tmp" "$DIR/$1.rc"
  echo "[prebuild] $1: exit $rc after $((SECONDS - started)) s"
}

for step in "${steps[@]}"; do
  if [[ "$step" == enforcer ]]; then
    one_step "$step" &
  else
    one_step "$step"
  fi
done
wait

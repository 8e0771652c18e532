#!/usr/bin/env bash
# What the heavy test tiers need built, in the order they need it, for the test run to
# start in the background while the light tiers run (tests/support/prebuild.py):
#   tools  scripts/build-tools.sh             helm, kubeconform (tests/chart)
#   kube   scripts/build-kube.sh              etcd, the control plane, kubelet (tests/cluster,
#                                             tests/node, the benches' control plane)
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
[[ ${#steps[@]} -eq 0 ]] && steps=(tools kube images)
mkdir -p "$DIR"

run_step() {
  case "$1" in
    tools) bash "$ROOT/scripts/build-tools.sh" ;;
    kube) bash "$ROOT/scripts/build-kube.sh" ;;
    images)
      bash "$ROOT/scripts/node/images.sh" &&
        IMAGE="${SANDBOX_TEST_IMAGE:-localhost/sandbox-workspace:test}" \
          bash "$ROOT/scripts/build-image.sh" --no-smoke ;;
    *) echo "unknown step $1" >&2; return 2 ;;
  esac
}

for step in "${steps[@]}"; do
  started=$SECONDS
  echo "[prebuild] $step: started"
  run_step "$step" 2>&1
  rc=$?
  echo "$rc" >"$DIR/$step.rc.tmp" && mv -f "$DIR/$step.rc.tmp" "$DIR/$step.rc"
  echo "[prebuild] $step: exit $rc after $((SECONDS - started)) s"
done

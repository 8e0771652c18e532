#!/usr/bin/env bash
# Build the project's image with podman where no image registry is reachable, then
# smoke-run it.
#
#   scripts/build-image.sh             base (if missing) + build + smoke run
#   scripts/build-image.sh --no-smoke  base (if missing) + build
#   scripts/build-image.sh --check     exit 0 when podman (with runc) is usable, else
#                                      print why and exit 3
#
# The base: a minimal Debian bookworm root filesystem with Python 3.11 made by
# debootstrap and imported into podman as $BASE_IMAGE (built once; reused while it
# exists in podman's store). The Dockerfile is then built on it with
# --build-arg BASE_IMAGE=..., pip reaching PyPI through the host network with the host's
# CA bundle. podman's layer cache makes a rebuild with unchanged dependencies quick.
# Runs only local containers with host networking bound to 127.0.0.1 (no bridge network).
#
# Environment: IMAGE (default localhost/sandbox-workspace:dev), BASE_IMAGE (default
# localhost/sandbox-workspace-base:bookworm), DEBOOTSTRAP_MIRROR (default: debootstrap's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-localhost/sandbox-workspace:dev}"
BASE_IMAGE="${BASE_IMAGE:-localhost/sandbox-workspace-base:bookworm}"
SUITE=bookworm

START=$SECONDS
log() { printf '[build-image %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { printf '[build-image] ERROR: %s\n' "$1" >&2; exit "${2:-1}"; }

# crun fails on cgroup v1 hybrid hosts ("cgroups in hybrid mode not supported"): use runc
# when it is there. Containers get explicit ulimits: inheriting the host's fails.
PODMAN=(podman)
[[ -x /usr/sbin/runc ]] && PODMAN+=(--runtime /usr/sbin/runc)
ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

usable() {
  command -v podman >/dev/null 2>&1 || { echo "podman is not installed"; return 1; }
  local out
  if ! out="$("${PODMAN[@]}" info --format '{{.Host.OCIRuntime.Name}}' 2>&1)"; then
    echo "podman does not work here: ${out##*$'\n'}"; return 1
  fi
  return 0
}

if [[ "${1:-}" == "--check" ]]; then
  why="$(usable)" || { echo "$why"; exit 3; }
  exit 0
fi
why="$(usable)" || die "$why" 3

# One build at a time on this machine (the test run's background prebuild, a tier and a
# developer may start one together): two debootstraps of the base would race.
if command -v flock >/dev/null 2>&1; then
  exec 8>"${TMPDIR:-/tmp}/sandbox-workspace-build-image.lock"
  flock -n 8 || { log "another image build holds the lock; waiting"; flock 8; }
fi

# ---- base image -------------------------------------------------------------------
if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
  log "base $BASE_IMAGE: cached"
else
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)" 3
  [[ "$(id -u)" -eq 0 ]] || die "debootstrap needs root to build the base image" 3
  rootfs="$(mktemp -d /var/tmp/sandbox-workspace-rootfs.XXXXXX)"
  trap 'rm -rf "$rootfs"' EXIT
  log "base: debootstrap $SUITE (minbase + python3) into $rootfs"
  # No mirror argument unless given: debootstrap's default Debian mirror.
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$rootfs" ${DEBOOTSTRAP_MIRROR:+"$DEBOOTSTRAP_MIRROR"} >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  log "base: importing as $BASE_IMAGE"
  tar -C "$rootfs" -c . | "${PODMAN[@]}" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"; trap - EXIT
  log "base: done"
fi

# ---- the image ----------------------------------------------------------------------
log "building $IMAGE from $ROOT/Dockerfile on $BASE_IMAGE"
build_args=(build --network host --layers "${ULIMITS[@]}" --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$IMAGE")
[[ -r "$CA_BUNDLE" ]] && build_args+=(-v "$CA_BUNDLE:$CA_BUNDLE:ro")
"${PODMAN[@]}" "${build_args[@]}" -f "$ROOT/Dockerfile" "$ROOT" >&2
log "built $IMAGE ($("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"

[[ "${1:-}" == "--no-smoke" ]] && exit 0

# ---- smoke run ----------------------------------------------------------------------
run=("${PODMAN[@]}" run --rm "${ULIMITS[@]}" --network none --read-only --user 10001:10001
  --cap-drop ALL --security-opt no-new-privileges)
for cmd in api operator runtime; do
  "${run[@]}" "$IMAGE" "$cmd" --help >/dev/null || die "'$cmd --help' failed in the image"
done
log "smoke: api/operator/runtime --help work"

workspace="$(mktemp -d)"
chown 10001:10001 "$workspace"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
name="sandbox-workspace-smoke-$$"
cleanup() { "${PODMAN[@]}" rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$workspace"; }
trap cleanup EXIT
"${PODMAN[@]}" run -d --name "$name" "${ULIMITS[@]}" --network host --read-only \
  --tmpfs /tmp:rw,size=64m,mode=1777 -v "$workspace:/workspace" --user 10001:10001 \
  --cap-drop ALL --security-opt no-new-privileges -e SANDBOX_RUNTIME_TOKEN=smoke-token-0123456789 \
  "$IMAGE" runtime --host 127.0.0.1 --port "$port" --root /workspace >/dev/null
for _ in $(seq 100); do
  if python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
    log "smoke: runtime answers /healthz as uid $("${PODMAN[@]}" exec "$name" id -u) on a read-only root"
    exit 0
  fi
  sleep 0.2
done
"${PODMAN[@]}" logs "$name" >&2 || true
die "the runtime did not answer /healthz"

#!/usr/bin/env bash
# The images a real node of the `node` test tier runs, as OCI archives containerd imports
# (no registry is reachable here):
#   pause  — the pod sandbox image: scripts/node/pause.c built with `gcc -static`,
#            FROM scratch, by podman
#   $IMAGE — the product image (scripts/build-image.sh --no-smoke; podman's layer cache
#            makes an unchanged rebuild take seconds)
#
#   scripts/node/images.sh        build (or reuse) both archives; print one line each:
#                                 "pause=REF ARCHIVE" and "image=REF ARCHIVE"
#   scripts/node/images.sh --import SOCKET 'REF ARCHIVE'...
#                                 import those archives (as a build printed them) into
#                                 the containerd listening on SOCKET (namespace k8s.io),
#                                 skipping one that store already holds; builds nothing
#                                 (it runs inside the node tier's namespace, without
#                                 network). The archives are named explicitly because
#                                 podman's tag is shared by every checkout on the machine.
#
# Archives are cached in .cache/node/ by content: the pause archive by the hash of
# pause.c, the product's by podman's image ID — so only a changed image is saved again.
# An imported image carries the label sandbox-workspace.io/archive=<archive name>; a
# second import of the same archive into the same store is a label lookup (milliseconds).
#
# Environment: IMAGE (default localhost/sandbox-workspace:dev), SANDBOX_NODE_CACHE
# (default .cache/node), CTR (default ctr).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
IMAGE="${IMAGE:-localhost/sandbox-workspace:dev}"
CACHE="${SANDBOX_NODE_CACHE:-$ROOT/.cache/node}"
CTR="${CTR:-ctr}"
LABEL=sandbox-workspace.io/archive

START=$SECONDS
log() { printf '[node-images %4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { printf '[node-images] ERROR: %s\n' "$1" >&2; exit "${2:-1}"; }

# ---- import ----------------------------------------------------------------------------
import_one() { # ref archive
  local ref="$1" tar="$2" have
  have="$("$CTR" --address "$socket" -n k8s.io images ls "name==$ref" 2>/dev/null \
    | grep -F "$LABEL=$(basename "$tar")" || true)"
  if [[ -n "$have" ]]; then
    log "import: $ref already in the store"
    return
  fi
  local t=$SECONDS
  # The OCI archive names the image by its reference (annotation); --base-name keeps
  # only that one.
  "$CTR" --address "$socket" -n k8s.io images import --base-name "${ref%:*}" "$tar" >/dev/null
  "$CTR" --address "$socket" -n k8s.io images label "$ref" "$LABEL=$(basename "$tar")" >/dev/null
  log "import: $ref in $((SECONDS - t))s"
}
if [[ "${1:-}" == "--import" ]]; then
  socket="${2:?--import needs the containerd socket}"
  shift 2
  for pair in "$@"; do
    read -r ref tar <<<"$pair"
    [[ -s "$tar" ]] || die "no archive $tar: run scripts/node/images.sh (without --import) first" 3
    import_one "$ref" "$tar"
  done
  exit 0
fi

PODMAN=(podman)
[[ -x /usr/sbin/runc ]] && PODMAN+=(--runtime /usr/sbin/runc)
command -v podman >/dev/null || die "podman is not installed (scripts/install-system-deps.sh)" 3
command -v gcc >/dev/null || die "gcc is not installed (scripts/install-system-deps.sh)" 3
mkdir -p "$CACHE"

# One builder at a time per cache (parallel test sessions share it).
exec 9>"$CACHE/.images.lock"
flock 9

# ---- pause ----------------------------------------------------------------------
pause_hash="$(sha256sum "$ROOT/scripts/node/pause.c" | cut -c1-12)"
PAUSE_REF="localhost/sandbox-workspace-pause:$pause_hash"
PAUSE_TAR="$CACHE/pause-$pause_hash.tar"
if [[ ! -s "$PAUSE_TAR" ]]; then
  ctx="$(mktemp -d)"
  trap 'rm -rf "$ctx"' EXIT
  gcc -static -O2 -s -o "$ctx/pause" "$ROOT/scripts/node/pause.c"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
  "${PODMAN[@]}" build -q -t "$PAUSE_REF" -f "$ctx/Containerfile" "$ctx" >/dev/null
  rm -f "$PAUSE_TAR.tmp"
  "${PODMAN[@]}" save -q --format oci-archive -o "$PAUSE_TAR.tmp" "$PAUSE_REF"
  mv -f "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$ctx"; trap - EXIT
  log "pause: built $PAUSE_REF ($(stat -c %s "$PAUSE_TAR") bytes)"
fi

# ---- the product image -------------------------------------------------------------
IMAGE="$IMAGE" bash "$ROOT/scripts/build-image.sh" --no-smoke 2>"$CACHE/build-image.log" \
  || { tail -30 "$CACHE/build-image.log" >&2; die "scripts/build-image.sh failed (log: $CACHE/build-image.log)"; }
image_id="$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$IMAGE" | cut -c1-12)"
IMAGE_TAR="$CACHE/sandbox-workspace-$image_id.tar"
if [[ ! -s "$IMAGE_TAR" ]]; then
  # Older builds' archives (kept an hour: a concurrent run may be importing one).
  find "$CACHE" -maxdepth 1 -name 'sandbox-workspace-*.tar' -mmin +60 -delete
  rm -f "$IMAGE_TAR.tmp"
  "${PODMAN[@]}" save -q --format oci-archive -o "$IMAGE_TAR.tmp" "$IMAGE"
  mv -f "$IMAGE_TAR.tmp" "$IMAGE_TAR"
  log "image: saved $IMAGE ($image_id, $(($(stat -c %s "$IMAGE_TAR") / 1000000)) MB)"
fi
log "image: $IMAGE is $image_id (build check ${SECONDS}s)"

echo "pause=$PAUSE_REF $PAUSE_TAR"
echo "image=$IMAGE $IMAGE_TAR"

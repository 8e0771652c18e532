#!/usr/bin/env bash
# Build the chart-validation tools from Go modules: helm and kubeconform, plus the
# Kubernetes OpenAPI document that kubeconform's schemas are generated from.
#
#   scripts/build-tools.sh            build (or reuse) the pinned versions
#   scripts/build-tools.sh --print    print the bin directory and exit 0 when built
#
# Layout (all under the git-ignored .cache/ of the project):
#   .cache/tools/bin/helm, kubeconform      symlinks to the pinned binaries (what tests use)
#   .cache/tools/bin/k8s-openapi.json       the release's api/openapi-spec/swagger.json
#   .cache/tools/<tool>-<version>/          the versioned binaries
# Go's caches are the per-user ones scripts/build-kube.sh uses
# (~/.cache/sandbox-workspace/go/{mod,build,path}; SANDBOX_GO_CACHE moves them), so
# the Kubernetes module is downloaded once for both scripts.
#
# No registry but the Go module proxy is contacted; kubeconform is never pointed at a
# schema URL (tests/chart generates its schemas from the OpenAPI document and the models).
# Override the pins with HELM_VERSION / KUBECONFORM_VERSION / K8S_VERSION, Go with GO=.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.7.0}"
# The same release as the control plane of the cluster tier (scripts/build-kube.sh).
K8S_VERSION="${K8S_VERSION:-v1.34.4}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SANDBOX_TOOLS_CACHE:-$ROOT/.cache/tools}"
BIN="$CACHE/bin"
HELM="$CACHE/helm-$HELM_VERSION/helm"
KUBECONFORM="$CACHE/kubeconform-$KUBECONFORM_VERSION/kubeconform"
OPENAPI="$CACHE/k8s-openapi-$K8S_VERSION.json"

START=$SECONDS
NAME=build-tools
# shellcheck source=lib/go-build.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-build.sh"

built() { [[ -x "$HELM" && -x "$KUBECONFORM" && -s "$OPENAPI" ]]; }

link_bins() {
  mkdir -p "$BIN"
  ln -sfn "../helm-$HELM_VERSION/helm" "$BIN/helm"
  ln -sfn "../kubeconform-$KUBECONFORM_VERSION/kubeconform" "$BIN/kubeconform"
  ln -sfn "../k8s-openapi-$K8S_VERSION.json" "$BIN/k8s-openapi.json"
  printf 'HELM_VERSION=%s\nKUBECONFORM_VERSION=%s\nK8S_VERSION=%s\n' \
    "$HELM_VERSION" "$KUBECONFORM_VERSION" "$K8S_VERSION" >"$BIN/VERSIONS"
}

fast_path "$BIN" "helm $HELM_VERSION, kubeconform $KUBECONFORM_VERSION, OpenAPI $K8S_VERSION in $BIN" "$@"

# ---- Go toolchain -----------------------------------------------------------
find_go "the chart tests need it to build helm and kubeconform."
go_env

lock_cache
log "go: $("$GO" version) ($GO); $(nproc) cores; GOMODCACHE=$GOMODCACHE"

# `go install pkg@version` builds a published module as it is (neither has replace
# directives); -ldflags set the versions `helm version` and its Kubernetes defaults report.
install_tool() { # dir package@version ldflags
  local dir="$1" pkg="$2" ldflags="$3" t0=$SECONDS
  log "compiling $pkg"
  rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" "$GO" install -trimpath -ldflags "-s -w $ldflags" "$pkg" >&2
  rm -rf "$dir"; mv "$dir.tmp" "$dir"
  log "$pkg: done in $((SECONDS - t0))s"
}

if [[ ! -x "$HELM" ]]; then
  [[ "$K8S_VERSION" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "K8S_VERSION must look like v1.34.4"
  major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
  X="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  X+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    X+=" -X $p.k8sVersionMajor=$major -X $p.k8sVersionMinor=$minor"
  done
  install_tool "$(dirname "$HELM")" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$X"
fi

if [[ ! -x "$KUBECONFORM" ]]; then
  install_tool "$(dirname "$KUBECONFORM")" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" ""
fi

if [[ ! -s "$OPENAPI" ]]; then
  log "k8s.io/kubernetes@$K8S_VERSION: fetching the module for its OpenAPI document"
  json="$(cd "$CACHE" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" 2>&1)" || true
  dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json")"
  [[ -f "$dir/api/openapi-spec/swagger.json" ]] || die "no OpenAPI document in k8s.io/kubernetes@$K8S_VERSION: $json"
  cp "$dir/api/openapi-spec/swagger.json" "$OPENAPI.tmp"
  mv -f "$OPENAPI.tmp" "$OPENAPI"
fi

link_bins
log "all built in $((SECONDS - START))s -> $BIN ($("$HELM" version --short))"

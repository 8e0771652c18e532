"""Test helpers for the Helm chart (not product code): tools, rendering, schemas.

- ``build_tools()`` runs scripts/build-tools.sh (helm, kubeconform and the Kubernetes
  OpenAPI document, built from Go modules; a fraction of a second when cached) and
  returns their paths; ``ToolsMissing`` when they are absent and no Go exists.
- ``render()`` runs ``helm template`` and returns the manifests as dicts.
- ``write_schemas()`` writes kubeconform's schema directory: one JSON schema per
  built-in kind from the OpenAPI document, and one per custom resource from the pydantic
  models (operator/crdgen.py) — strict (unknown fields refused), self-contained, offline.

Used by tests/chart and by the cluster tier's tests/cluster/test_chart_rbac.py.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from build_scripts import build_with_go  # tests/support

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "sandbox-workspace"
BUILD_SCRIPT = REPO / "scripts" / "build-tools.sh"
TOOLS_BIN = Path(os.environ.get("SANDBOX_TOOLS_CACHE", REPO / ".cache" / "tools")) / "bin"
HARDENED_VALUES = Path(__file__).resolve().parent / "hardened-values.yaml"


class ToolsMissing(RuntimeError):
    """helm/kubeconform are not built and cannot be (no Go toolchain)."""


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubeconform: Path
    openapi: Path
    kubernetes_version: str


def tools_present() -> bool:
    return all((TOOLS_BIN / name).exists() for name in ("helm", "kubeconform", "k8s-openapi.json"))


def build_tools(stream: IO[str] | None = None) -> Tools:
    """Build (or reuse) the tools; raise ToolsMissing or RuntimeError (with the log)."""
    build_with_go(
        BUILD_SCRIPT,
        REPO,
        present=tools_present,
        missing=ToolsMissing,
        what=f"helm/kubeconform in {TOOLS_BIN}",
        stream=stream,
    )
    versions = dict(
        line.split("=", 1) for line in (TOOLS_BIN / "VERSIONS").read_text().split() if "=" in line
    )
    return Tools(
        helm=TOOLS_BIN / "helm",
        kubeconform=TOOLS_BIN / "kubeconform",
        openapi=TOOLS_BIN / "k8s-openapi.json",
        kubernetes_version=versions["K8S_VERSION"].lstrip("v"),
    )


def helm(tools: Tools, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm offline: no kubeconfig, no repositories, caches in a throwaway place."""
    home = REPO / ".cache" / "tools" / "helm-home"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": os.devnull,
    }
    result = subprocess.run(
        [str(tools.helm), *args], env=env, capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    return result


def render_text(
    tools: Tools,
    *,
    release: str = "sw",
    namespace: str = "sandbox",
    values: tuple[Path, ...] = (),
    set_values: dict[str, str] | None = None,
    include_crds: bool = False,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += [f"--kube-version={tools.kubernetes_version}"]
    for path in values:
        args += ["--values", str(path)]
    for key, value in (set_values or {}).items():
        args += ["--set", f"{key}={value}"]
    if include_crds:
        args.append("--include-crds")
    return helm(tools, *args, check=check)


def render(tools: Tools, **kwargs: Any) -> list[dict[str, Any]]:
    """``helm template`` → the manifests (empty documents dropped)."""
    text = render_text(tools, **kwargs).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


# ------------------------------------------------------------------------- schemas
def kind_file(kind: str, api_version: str) -> str:
    """kubeconform's ``{{ .ResourceKind }}{{ .KindSuffix }}.json`` for a kind."""
    group_parts = api_version.split("/")
    suffix = "-" + group_parts[0].split(".")[0].lower()
    if len(group_parts) > 1:
        suffix += "-" + group_parts[1].lower()
    return f"{kind.lower()}{suffix}.json"


SCHEMA_LOCATION = "{{ .ResourceKind }}{{ .KindSuffix }}.json"


def _strict(node: Any, *, nullable_optional: bool) -> Any:
    """Refuse unknown fields in every object that lists its properties; let optional
    fields be null, as YAML writes empty values (kubeconform's own schemas do both)."""
    if isinstance(node, list):
        return [_strict(n, nullable_optional=nullable_optional) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v, nullable_optional=nullable_optional) for k, v in node.items()}
    fmt = out.get("format")
    if fmt == "int-or-string":
        return {"description": out.get("description", ""), "oneOf": _INT_OR_STRING}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if nullable_optional and isinstance(out.get("properties"), dict):
        required = set(out.get("required", []))
        for name, prop in out["properties"].items():
            if name not in required and isinstance(prop.get("type"), str):
                prop["type"] = [prop["type"], "null"]
    return out


_INT_OR_STRING = [{"type": "string"}, {"type": "integer"}]
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            found.add(ref.removeprefix("#/definitions/"))
        for value in node.values():
            _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def _closure(defs: dict[str, Any], root: str) -> dict[str, Any]:
    todo, seen = [root], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        found: set[str] = set()
        _refs(defs[name], found)
        todo.extend(found - seen)
    return {name: defs[name] for name in sorted(seen)}


def builtin_schemas(openapi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{file name: JSON schema} for every kind of the Kubernetes OpenAPI (v2) document."""
    defs = copy.deepcopy(openapi["definitions"])
    # Quantities are strings on the wire but YAML writes `cpu: 1` as a number.
    defs[_QUANTITY] = {
        "description": "Quantity (`500m`, `1Gi`, or a number).",
        "oneOf": [{"type": "string"}, {"type": "number"}],
    }
    defs = {name: _strict(node, nullable_optional=True) for name, node in defs.items()}
    out: dict[str, dict[str, Any]] = {}
    for name, node in defs.items():
        for gvk in node.get("x-kubernetes-group-version-kind", []):
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            schema = {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "definitions": _closure(defs, name),
                "$ref": f"#/definitions/{name}",
            }
            out[kind_file(gvk["kind"], api_version)] = schema
    return out


def crd_schemas(crds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{file name: JSON schema} for the custom resources of ``crds`` (served versions)."""
    out: dict[str, dict[str, Any]] = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
            # The apiserver always accepts these at the root, declared or not.
            props = schema.setdefault("properties", {})
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            props.setdefault("metadata", {"type": "object"})
            schema = _strict(schema, nullable_optional=False)
            schema["$schema"] = "http://json-schema.org/draft-07/schema#"
            # kubeconform validates whole objects: apiVersion/kind/metadata must be there.
            schema.setdefault("required", [])
            for key in ("apiVersion", "kind", "metadata"):
                if key not in schema["required"]:
                    schema["required"].append(key)
            api_version = f"{spec['group']}/{version['name']}"
            out[kind_file(spec["names"]["kind"], api_version)] = schema
    return out


def write_schemas(tools: Tools, out_dir: Path, crds: list[dict[str, Any]]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    openapi = json.loads(tools.openapi.read_text())
    for name, schema in {**builtin_schemas(openapi), **crd_schemas(crds)}.items():
        (out_dir / name).write_text(json.dumps(schema))
    return out_dir


def kubeconform(
    tools: Tools, schema_dir: Path, manifests: Path, *, check: bool = True
) -> dict[str, Any]:
    """Validate ``manifests`` strictly against ``schema_dir`` only; the JSON summary."""
    result = subprocess.run(
        [
            str(tools.kubeconform),
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            tools.kubernetes_version,
            "-schema-location",
            str(schema_dir / SCHEMA_LOCATION),
            str(manifests),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    report = json.loads(result.stdout or "{}")
    if check and result.returncode != 0:
        raise AssertionError(f"kubeconform found problems:\n{result.stdout}{result.stderr}")
    report["returncode"] = result.returncode
    return report

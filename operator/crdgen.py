"""Render the CustomResourceDefinitions from the pydantic models (``operator/models.py``).

Contract: ``render_all()`` returns ``{file name: YAML text}``, deterministic byte for byte,
so a test can compare it with the committed ``crds/`` files. The schemas are *structural*
(what apiextensions.k8s.io/v1 requires): every node has a ``type`` (or is int-or-string),
no ``$ref``, no ``anyOf`` but the int-or-string one, no ``additionalProperties: false``
(the apiserver prunes unknown fields instead). Every property carries a description, so
``kubectl explain`` documents the resources; a field without one is a render error.
Defaults of the spec models are rendered (the apiserver applies them), those of the
status models are not (only the operator writes status).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from sandbox_workspace.contract import crd

from . import models
from .pool import resource as pool_resource

CATEGORY = "sandboxworkspace"

# Keys of OpenAPI v3 the apiserver accepts in a structural schema, passed through as is.
_PASSTHROUGH = {
    "type",
    "format",
    "description",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "nullable",
}


class SchemaError(ValueError):
    """The model cannot be expressed as a structural schema (or lacks a description)."""


class _Generator(GenerateJsonSchema):
    """Also renders ``default_factory`` defaults (``storage``, ``fileUploadConfig``...)."""

    def get_default_value(self, schema: Any) -> Any:
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            return schema["default_factory"]()
        return super().get_default_value(schema)


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


_FIRST = ("description", "type", "format", "x-kubernetes-int-or-string", "anyOf")
_LAST = ("properties", "required", "additionalProperties", "items")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Stable, readable key order: description and type first, children last."""
    head = [k for k in _FIRST if k in node]
    tail = [k for k in _LAST if k in node]
    middle = sorted(k for k in node if k not in head and k not in tail)
    return {k: node[k] for k in (*head, *middle, *tail)}


class _Converter:
    def __init__(self, defs: dict[str, Any], *, keep_defaults: bool) -> None:
        self.defs = defs
        self.keep_defaults = keep_defaults

    def convert(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        node = dict(node)
        if "anyOf" in node:
            node = self._any_of(node, path)
        if "$ref" in node:
            target = self.defs[node.pop("$ref").rsplit("/", 1)[-1]]
            # The field's own keys (description, default) win over the model's.
            node = {**target, **node}
        if "const" in node:
            node["enum"] = [node.pop("const")]
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "additionalProperties", "properties", "required", "items"):
                continue
            if key == "default" and not self.keep_defaults:
                continue
            if key in _PASSTHROUGH or key.startswith("x-kubernetes-"):
                out[key] = _drop_none(value) if key == "default" else value
            elif key == "anyOf" and node.get("x-kubernetes-int-or-string"):
                out[key] = value
            else:
                raise SchemaError(f"{path}: '{key}' has no structural equivalent")
        if node.get("type") == "object" or "properties" in node:
            out["type"] = "object"
            props = node.get("properties", {})
            if props:
                out["properties"] = {
                    name: self._property(sub, f"{path}.{name}") for name, sub in props.items()
                }
            if node.get("required"):
                out["required"] = list(node["required"])
            extra = node.get("additionalProperties")
            if isinstance(extra, dict):
                out["additionalProperties"] = self.convert(extra, f"{path}.*")
        elif node.get("type") == "array":
            out["items"] = self.convert(node.get("items", {}), f"{path}[]")
        if "type" not in out and not out.get("x-kubernetes-int-or-string"):
            raise SchemaError(f"{path}: no type")
        return _ordered(out)

    def _property(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        out = self.convert(node, path)
        if not out.get("description"):
            raise SchemaError(f"{path}: every field needs a description (kubectl explain)")
        return out

    def _any_of(self, node: dict[str, Any], path: str) -> dict[str, Any]:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        # Optional fields are simply not required: the apiserver prunes a null to absent.
        if "default" in node and node["default"] is None:
            del node["default"]
        if len(options) == 1:
            return {**options[0], **node}
        types = sorted(o.get("type", "") for o in options)
        if types == ["integer", "string"]:
            merged: dict[str, Any] = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            }
            for option in options:
                if "pattern" in option:
                    merged["pattern"] = option["pattern"]
            merged.update(node)
            return merged
        raise SchemaError(f"{path}: a union of {types} is not structural")


def model_schema(model: type[BaseModel], *, keep_defaults: bool) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model."""
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_Generator)
    conv = _Converter(raw.get("$defs", {}), keep_defaults=keep_defaults)
    return conv.convert({k: v for k, v in raw.items() if k != "$defs"}, model.__name__)


@dataclass(frozen=True)
class Column:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True)
class Kind:
    """What a CRD needs beyond the models: names and printer columns."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    description: str
    spec: type[BaseModel]
    status: type[BaseModel]
    columns: tuple[Column, ...] = field(default_factory=tuple)

    @property
    def file_name(self) -> str:
        return f"{self.plural}.yaml"


AGE = Column("Age", ".metadata.creationTimestamp", "date")

KINDS = (
    Kind(
        kind=crd.SESSION_KIND,
        plural=crd.SESSION_PLURAL,
        short_names=("sbs",),
        description="A user's sandbox: a pod running the Sandbox Workspace runtime, its "
        "bearer-token Secret and (when persistent) the PersistentVolumeClaim of /workspace. "
        "Idle sessions are stopped (pod deleted, files kept) and resume on use.",
        spec=models.SandboxSessionSpec,
        status=models.SandboxSessionStatus,
        columns=(
            Column("User", ".spec.userId", description="The platform's user id."),
            Column("Phase", ".status.phase", description="Pending, Running, Stopped or Error."),
            Column("Pod", ".status.podName", description="The sandbox pod."),
            AGE,
            Column("Idle-Since", ".status.lastActivityTime", "date", "Last activity."),
            Column("Expires", ".status.expiresAt", "date", "When ttlSeconds deletes it."),
            Column(
                "Egress",
                ".spec.egress.rules[*].host",
                description="Hosts the egress policy allows (<none>: no policy, no network).",
            ),
            Column("Endpoint", ".status.endpoint", description="Runtime URL.", priority=1),
        ),
    ),
    Kind(
        kind=crd.WORKSPACE_KIND,
        plural=crd.WORKSPACE_PLURAL,
        short_names=("cws",),
        description="A conversation's directory inside its user's SandboxSession. Deleting "
        "it deletes the files: the finalizer sandboxworkspace.io/files is released only once "
        "the runtime confirms the directory is gone (or the session's storage is).",
        spec=models.ConversationWorkspaceSpec,
        status=models.ConversationWorkspaceStatus,
        columns=(
            Column("Conversation", ".spec.conversationId", description="Conversation id."),
            Column("Session", ".spec.sessionRef", description="The SandboxSession."),
            Column("Phase", ".status.phase", description="Pending, Ready, Deleting or Error."),
            Column("Files", ".status.fileCount", "integer", "Files in the directory."),
            AGE,
            Column("Path", ".status.path", description="Directory in the sandbox.", priority=1),
        ),
    ),
    Kind(
        kind=pool_resource.POOL_KIND,
        plural=pool_resource.POOL_PLURAL,
        short_names=("sbp",),
        description="A warm pool's counts, as the active operator replica sees them (one "
        "per pool namespace, named `default`, made and written by the operator). The pool "
        "is configured by the operator's settings (chart values sandbox.pool.*).",
        spec=pool_resource.SandboxPoolSpec,
        status=pool_resource.SandboxPoolStatus,
        columns=(
            Column("Size", ".status.size", "integer", "Free ready pods kept."),
            Column("Ready", ".status.ready", "integer", "Free pods ready to be claimed."),
            Column("Claimed", ".status.claimed", "integer", "Live pods claimed by sessions."),
            AGE,
        ),
    ),
)


def build_crd(kind: Kind) -> dict[str, Any]:
    """The CustomResourceDefinition manifest of one kind."""
    spec = model_schema(kind.spec, keep_defaults=True)
    status = model_schema(kind.status, keep_defaults=False)
    root = {
        "type": "object",
        "description": kind.description,
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"Versioned schema of this representation (`{crd.API_VERSION}`).",
            },
            "kind": {"type": "string", "description": f"`{kind.kind}`."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{crd.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "sandbox-workspace"},
        },
        "spec": {
            "group": crd.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": crd.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.render() for c in kind.columns],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = (
    "# Generated by `sandbox-workspace crds` from sandbox_workspace/operator/models.py.\n"
    "# Do not edit: change the models and render again (a test fails when this is stale).\n"
)


def render(kind: Kind) -> str:
    return HEADER + yaml.safe_dump(build_crd(kind), sort_keys=False, width=100, allow_unicode=True)


def render_all() -> dict[str, str]:
    return {kind.file_name: render(kind) for kind in KINDS}


def write_all(output_dir: Path) -> list[Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = output_dir / name
        path.write_text(text)
        written.append(path)
    return written

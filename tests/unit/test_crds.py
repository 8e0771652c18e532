"""crds/*.yaml: rendered from operator/models.py, structural, documented, and up to date."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_workspace.cli import main
from sandbox_workspace.operator import crdgen, models
from sandbox_workspace.operator.crdgen import SchemaError, model_schema

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


def walk(node: dict[str, Any], path: str = "$"):
    """Every schema node under ``node`` with its path."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


@pytest.mark.parametrize("name", sorted(crdgen.render_all()))
def test_committed_crds_are_up_to_date(name: str) -> None:
    committed = CRD_DIR / name
    assert committed.exists(), f"{committed} is missing: run `sandbox-workspace crds`"
    assert committed.read_text() == crdgen.render_all()[name], (
        f"{committed} is stale: run `sandbox-workspace crds` and commit the result"
    )


def test_crds_check_command_reports_stale_files(tmp_path: Path, capsys) -> None:
    assert main(["crds", "--output-dir", str(tmp_path)]) == 0
    assert main(["crds", "--check", "--output-dir", str(tmp_path)]) == 0
    (tmp_path / "sandboxsessions.yaml").write_text("stale")
    assert main(["crds", "--check", "--output-dir", str(tmp_path)]) == 1
    assert "sandboxsessions.yaml is stale" in capsys.readouterr().err


@pytest.mark.parametrize("kind", crdgen.KINDS, ids=lambda k: k.plural)
def test_schemas_are_structural_and_documented(kind: crdgen.Kind) -> None:
    crd = crdgen.build_crd(kind)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "$ref" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:  # the one anyOf allowed: int-or-string
            assert node["x-kubernetes-int-or-string"] is True, path
        else:
            assert "type" in node, path
        assert "nullable" not in node, path
        assert not node.get("x-kubernetes-preserve-unknown-fields"), path
        if path.count(".") >= 2 and not path.endswith("[]"):  # kubectl explain shows them
            assert node.get("description"), f"{path} has no description"
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}


def test_session_crd_names_and_columns() -> None:
    crd = yaml.safe_load(crdgen.render_all()["sandboxsessions.yaml"])
    assert crd["metadata"]["name"] == "sandboxsessions.sandboxworkspace.io"
    assert crd["spec"]["names"] == {
        "kind": "SandboxSession",
        "listKind": "SandboxSessionList",
        "plural": "sandboxsessions",
        "singular": "sandboxsession",
        "shortNames": ["sbs"],
        "categories": ["sandboxworkspace"],
    }
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [(c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("User", ".spec.userId"),
        ("Phase", ".status.phase"),
        ("Pod", ".status.podName"),
        ("Age", ".metadata.creationTimestamp"),
        ("Idle-Since", ".status.lastActivityTime"),
        ("Expires", ".status.expiresAt"),
        ("Egress", ".spec.egress.rules[*].host"),
        ("Endpoint", ".status.endpoint"),
    ]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {
        "phase",
        "podName",
        "podIP",
        "endpoint",
        "conditions",
        "lastActivityTime",
        "startedAt",
        "expiresAt",
        "observedGeneration",
    } <= set(status)


def test_workspace_crd_names_and_columns() -> None:
    crd = yaml.safe_load(crdgen.render_all()["conversationworkspaces.yaml"])
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["cws"] and names["categories"] == ["sandboxworkspace"]
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Conversation",
        "Session",
        "Phase",
        "Files",
        "Age",
        "Path",
    ]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["conversationId", "sessionRef"]
    assert spec["properties"]["sessionRef"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "sessionRef is immutable"}
    ]


def test_spec_defaults_are_rendered_and_match_the_models() -> None:
    spec = model_schema(models.SandboxSessionSpec, keep_defaults=True)["properties"]
    defaults = models.SandboxSessionSpec(user_id="u")
    assert spec["idleTimeoutSeconds"]["default"] == defaults.idle_timeout_seconds
    assert spec["storage"]["default"] == {"persistent": True, "size": "1Gi"}
    assert spec["fileUploadConfig"]["default"] == defaults.file_upload_config.model_dump(
        by_alias=True
    )
    assert "default" not in spec["ttlSeconds"]  # optional, not null


def test_status_schema_has_no_defaults() -> None:
    status = model_schema(models.SandboxSessionStatus, keep_defaults=False)
    assert all("default" not in node for _, node in walk(status))


def test_quantities_are_int_or_string() -> None:
    spec = model_schema(models.SandboxSessionSpec, keep_defaults=True)
    cpu = spec["properties"]["resources"]["properties"]["limits"]["properties"]["cpu"]
    assert cpu["x-kubernetes-int-or-string"] is True
    assert cpu["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert cpu["pattern"] == models.QUANTITY_PATTERN


def test_a_field_without_description_is_a_render_error() -> None:
    from pydantic import BaseModel

    class Undocumented(BaseModel):
        """A model."""

        x: int

    with pytest.raises(SchemaError, match="description"):
        model_schema(Undocumented, keep_defaults=True)


def test_a_union_that_is_not_structural_is_a_render_error() -> None:
    from pydantic import BaseModel, Field

    class Mixed(BaseModel):
        """A model."""

        x: int | list[int] = Field(description="x")

    with pytest.raises(SchemaError, match="not structural"):
        model_schema(Mixed, keep_defaults=True)

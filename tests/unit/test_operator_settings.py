"""operator/settings.py and sandbox_workspace/kube.py: settings from the environment, credentials
from a kubeconfig."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from sandbox_workspace.kube import CredentialsError, load_credentials
from sandbox_workspace.operator.settings import OperatorSettings


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("team-a,team-b", ["team-a", "team-b"], id="comma-list"),
        pytest.param('["team-a"]', ["team-a"], id="json"),
        pytest.param("", [], id="empty-is-cluster-wide"),
    ],
)
def test_namespaces_from_env(monkeypatch, raw: str, expected: list[str]) -> None:
    monkeypatch.setenv("SANDBOX_OPERATOR_NAMESPACES", raw)
    assert OperatorSettings().namespaces == expected


def test_nested_resource_defaults_from_env(monkeypatch) -> None:
    monkeypatch.setenv("SANDBOX_OPERATOR_DEFAULT_RESOURCES__LIMITS__MEMORY", "2Gi")
    limits = OperatorSettings().default_resources.limits
    assert limits is not None and limits.memory == "2Gi"


def test_empty_values_disable(monkeypatch) -> None:
    monkeypatch.setenv("SANDBOX_OPERATOR_METRICS_PORT", "")
    monkeypatch.setenv("SANDBOX_OPERATOR_LIVENESS_ENDPOINT", "")
    settings = OperatorSettings()
    assert settings.metrics_port is None and settings.liveness_endpoint is None


def test_credentials_from_kubeconfig(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("CA")
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}],
        "clusters": [
            {
                "name": "k",
                "cluster": {"server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"},
            }
        ],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    creds = load_credentials(path)
    assert creds.server == "https://127.0.0.1:6443"
    assert creds.bearer() == "secret-token"
    assert creds.ca_file == str(tmp_path / "ca.crt")  # relative to the kubeconfig
    assert creds.namespace == "ns"


def test_ca_data_is_decoded(tmp_path: Path) -> None:
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [
            {
                "name": "k",
                "cluster": {
                    "server": "https://x",
                    "certificate-authority-data": base64.b64encode(b"PEM").decode(),
                },
            }
        ],
        "users": [{"name": "u", "user": {}}],
    }
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    assert load_credentials(path).ca_data == "PEM"


def test_missing_context_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump({"current-context": "nope"}))
    with pytest.raises(CredentialsError, match="current-context"):
        load_credentials(path)


def test_workspace_names_are_valid_and_distinct() -> None:
    from sandbox_workspace.operator.naming import workspace_name

    a = workspace_name("sb-session-a", "b.c")
    b = workspace_name("sb-session-a.b", "c")
    assert a != b
    assert len(a) <= 63 and a == a.lower()

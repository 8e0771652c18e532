"""RuntimeSettings.env is the one writer of the runtime's environment: what each starter
writes (the operator's pod, the local backend, the API's local defaults, the execution
limits) reads back as the same settings, a misspelt key fails where it is written, and a
key the runtime does not know yet (an upgrade: a newer writer, an older runtime) is
ignored by the reader, so the runtime still starts."""

from __future__ import annotations

import os

import httpx
import pytest

from sandbox_workspace.api.app import build_backend
from sandbox_workspace.api.backends.local import session_runtime_env
from sandbox_workspace.api.settings import ApiSettings
from sandbox_workspace.operator.builders import runtime_env
from sandbox_workspace.operator.models import (
    ExecutionLimits,
    FileUploadConfig,
    SandboxSession,
    SandboxSessionSpec,
)
from sandbox_workspace.operator.settings import OperatorSettings
from sandbox_workspace.runtime.settings import RuntimeSettings

PREFIX = "SANDBOX_RUNTIME_"


@pytest.fixture
def read_back(monkeypatch):
    """The settings a runtime started with ``env`` reads (its own environment only)."""
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)

    def read(env: dict[str, str]) -> RuntimeSettings:
        unknown = [
            k for k in env if k.removeprefix(PREFIX).lower() not in RuntimeSettings.model_fields
        ]
        assert unknown == [], "written but never read by the runtime"
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return RuntimeSettings()

    return read


def test_a_misspelt_setting_fails_where_it_is_written():
    with pytest.raises(KeyError, match="max_file_sise_bytes"):
        RuntimeSettings.env(max_file_sise_bytes=1)
    with pytest.raises(KeyError, match="tokn"):
        RuntimeSettings.env_name("tokn")


def test_a_value_the_runtime_would_refuse_fails_where_it_is_written():
    with pytest.raises(ValueError, match="max_file_count"):
        RuntimeSettings.env(max_file_count=0)
    with pytest.raises(ValueError, match="LIMIT_"):
        RuntimeSettings.env(limit_memory=2**20)  # the limits come all four or none


def test_the_writers_own_environment_takes_no_part(monkeypatch):
    monkeypatch.setenv("SANDBOX_RUNTIME_LIMIT_MEMORY", "1")  # would break all-or-none
    assert RuntimeSettings.env(confinement="auto") == {"SANDBOX_RUNTIME_CONFINEMENT": "auto"}


def test_an_older_runtime_starts_with_a_setting_it_does_not_know(read_back, monkeypatch):
    monkeypatch.setenv("SANDBOX_RUNTIME_A_SETTING_OF_A_LATER_RELEASE", "on")
    settings = read_back({"SANDBOX_RUNTIME_TOKEN": "t"})
    assert settings.resolved_token() == "t"


def test_the_operators_pod_reads_back(read_back):
    session = SandboxSession(
        name="sb-session-alice",
        namespace="ns",
        spec=SandboxSessionSpec.model_validate(
            {
                "userId": "alice",
                "fileUploadConfig": {
                    "maxFileSize": 2,
                    "maxFileCount": 7,
                    "allowedFileTypes": ["csv", "txt"],
                },
                "network": {"enabled": True},
            }
        ),
    )
    settings = OperatorSettings(
        _env_file=None, image="registry.example/sandbox:1", confinement="require"
    )
    env = runtime_env(session, settings, secret="s")
    values = {e["name"]: e["value"] for e in env if "value" in e and e["name"].startswith(PREFIX)}
    assert [e["name"] for e in env if "valueFrom" in e] == ["SANDBOX_RUNTIME_TOKEN"]
    got = read_back({**values, "SANDBOX_RUNTIME_TOKEN": "t"})
    assert got.max_file_size_bytes == 2 * 1024**2
    assert (got.max_file_count, got.allowed_file_types) == (7, ["csv", "txt"])
    assert (got.confinement, got.network) == ("require", "allow")
    limits = session.spec.limits
    assert got.limits() is not None
    assert got.limits().memory == limits.memory_bytes
    assert got.limits().cpu_seconds == limits.cpu_seconds
    assert got.limits().file_size == limits.file_size_bytes
    assert got.limits().conversation_size == limits.conversation_size_bytes


def test_a_pod_with_an_egress_policy_reads_back_its_proxy_port_and_code_env(read_back):
    session = SandboxSession(
        name="sb-session-alice",
        namespace="ns",
        spec=SandboxSessionSpec.model_validate(
            {"userId": "alice", "egress": {"rules": [{"host": "pypi.org"}]}}
        ),
    )
    settings = OperatorSettings(_env_file=None, image="i", egress_proxy="10.96.0.9:3128")
    env = runtime_env(session, settings, secret="s")
    values = {e["name"]: e["value"] for e in env if "value" in e and e["name"].startswith(PREFIX)}
    got = read_back({**values, "SANDBOX_RUNTIME_TOKEN": "t"})
    assert (got.network, got.connect_port()) == ("proxy_port", 3128)
    assert got.code_env["HTTPS_PROXY"] == "http://10.96.0.9:3128"


def test_a_bad_code_env_or_a_proxy_port_without_its_port_is_refused(read_back):
    with pytest.raises(ValueError, match="not an environment variable name"):
        read_back({"SANDBOX_RUNTIME_CODE_ENV": '{"A=B": "x"}'})
    with pytest.raises(ValueError, match="more than 65536 bytes"):
        read_back({"SANDBOX_RUNTIME_CODE_ENV": '{"A": "%s"}' % ("x" * 70000)})
    with pytest.raises(ValueError, match="needs SANDBOX_RUNTIME_EGRESS_PROXY_PORT"):
        read_back({"SANDBOX_RUNTIME_NETWORK": "proxy_port", "SANDBOX_RUNTIME_CODE_ENV": "{}"})


def test_the_local_backends_session_runtime_reads_back(read_back, tmp_path):
    upload = FileUploadConfig(max_file_size=3, max_file_size_unit="KB", allowed_file_types=[])
    got = read_back(session_runtime_env("tok", tmp_path, upload))
    assert got.resolved_token() == "tok"
    assert got.root == tmp_path
    assert (got.max_file_size_bytes, got.max_file_count, got.allowed_file_types) == (3072, 50, [])


async def test_the_apis_local_defaults_read_back(read_back, tmp_path):
    settings = ApiSettings(
        _env_file=None,
        backend="local",
        data_dir=tmp_path,
        sandbox_mount="none",
        confinement="none",
        session_network="allow",
        local_session_memory="1Gi",
        limits=ExecutionLimits(memory="256Mi", cpu_seconds=9),
        service_token="a-service-token-long-enough-for-the-check-0123456789",
    )
    async with httpx.AsyncClient() as http:
        backend = build_backend(settings, http)
    got = read_back({**backend.runtime_env, "SANDBOX_RUNTIME_TOKEN": "t"})
    assert (got.confinement, got.network, got.session_memory) == ("none", "allow", 2**30)
    assert got.limits() is not None
    assert (got.limits().memory, got.limits().cpu_seconds) == (256 * 2**20, 9)


def test_a_pool_pods_claim_key_reads_back(read_back):
    from sandbox_workspace.operator.pool.spec import build_pool_pod

    settings = OperatorSettings(_env_file=None, image="registry.example/sandbox:1")
    env = build_pool_pod("ns", settings)["spec"]["containers"][0]["env"]
    from_secret = [e["name"] for e in env if "valueFrom" in e]
    assert from_secret == ["SANDBOX_RUNTIME_CLAIM_KEY"]  # a pooled runtime: no token
    values = {e["name"]: e["value"] for e in env if "value" in e and e["name"].startswith(PREFIX)}
    got = read_back({**values, "SANDBOX_RUNTIME_CLAIM_KEY": "k"})
    assert got.pooled and got.resolved_token() is None

"""The container image, smoke-tested with podman: one entrypoint for the three
processes, non-root by default, and the runtime working as a sandbox pod runs it —
uid 10001, read-only root filesystem, a tmpfs /tmp, a writable /workspace volume, no
capabilities, no privilege escalation. Containers use the host network bound to
127.0.0.1 only, or no network at all."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from ports import free_port

# What every container here gets: the restrictions of a sandbox pod (and the ulimits
# podman needs on these hosts).
LOCKED = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=4096:4096",
    "--read-only",
    "--user",
    "10001:10001",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges",
]


def run(
    podman: list[str], image: str, *args: str, entrypoint: str | None = None
) -> subprocess.CompletedProcess:
    extra = ["--entrypoint", entrypoint] if entrypoint else []
    return subprocess.run(
        [*podman, "run", "--rm", "--network", "none", *LOCKED, *extra, image, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["api", "operator", "runtime"])
def test_entrypoint_runs_each_process(podman: list[str], image: str, command: str) -> None:
    result = run(podman, image, command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: sandbox-workspace {command}" in result.stdout


def test_image_is_non_root_and_slim(podman: list[str], image: str) -> None:
    inspect = subprocess.run(
        [
            *podman,
            "image",
            "inspect",
            "--format",
            "{{.Config.User}} {{.Config.Entrypoint}}",
            image,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert inspect.stdout.split(" ", 1) == ["10001:10001", "[sandbox-workspace]\n"]
    # Without --user: the image's own default user.
    plain = subprocess.run(
        [*podman, "run", "--rm", "--network=none", *LOCKED[:4], "--entrypoint=id", image, "-u"],
        capture_output=True,
        text=True,
    )
    assert plain.stdout.strip() == "10001"
    # The runtime's helpers are there, the build's tools are not.
    tools = run(
        podman,
        image,
        "-c",
        "command -v bash setpriv python3; command -v gcc pip3 || true",
        entrypoint="bash",
    )
    assert tools.returncode == 0, tools.stderr
    assert [Path(p).name for p in tools.stdout.split()] == ["bash", "setpriv", "python3"]


@dataclass
class Sandbox:
    url: str
    token: str
    workspace: Path
    name: str

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        )


@pytest.fixture
def sandbox(podman: list[str], image: str, tmp_path: Path) -> Iterator[Sandbox]:
    """The runtime as in a sandbox pod, on 127.0.0.1 (host network, loopback only)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    os.chown(workspace, 10001, 10001)
    token, port = secrets.token_urlsafe(24), free_port()
    name = f"sandbox-workspace-test-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            *podman,
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            *LOCKED,
            "--tmpfs",
            "/tmp:rw,size=64m,mode=1777",
            "-v",
            f"{workspace}:/workspace",
            "-e",
            f"SANDBOX_RUNTIME_TOKEN={token}",
            image,
            "runtime",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--root",
            "/workspace",
        ],
        check=True,
        capture_output=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run([*podman, "logs", name], capture_output=True, text=True)
                raise AssertionError(f"the runtime never answered:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.1)
        yield Sandbox(url, token, workspace, name)
    finally:
        subprocess.run([*podman, "rm", "-f", name], capture_output=True)


def test_runtime_serves_as_a_sandbox_pod_runs_it(sandbox: Sandbox) -> None:
    with sandbox.client() as client:
        assert client.get("/healthz").status_code == 200
        assert httpx.get(sandbox.url + "/v1/stats").status_code == 401  # token required
        upload = client.post(
            "/v1/uploads",
            files={"file": ("weather.csv", b"city,temp\nParis,21\nOslo,9\n")},
            data={"conversation_id": "conv1"},
        )
        assert upload.status_code == 201, upload.text
        code = (
            "import os, pandas as pd\n"
            "df = pd.read_csv('uploads/temparea/weather.csv')\n"
            "os.makedirs('outputs', exist_ok=True)\n"
            "df.to_json('outputs/weather.json')\n"
            "print(os.getuid(), df.temp.mean())"
        )
        result = client.post(
            "/v1/conversations/conv1/execute", json={"language": "python", "code": code}
        ).json()
        assert result["exit_code"] == 0, result
        assert result["stdout"].split() == ["10001", "15.0"]
        # The root filesystem is read-only for executed code too. The pod's /tmp is shared
        # by every conversation, so code gets only its own scratch directory (TMPDIR).
        probe = client.post(
            "/v1/conversations/conv1/execute",
            json={
                "language": "bash",
                "code": "touch /opt/venv/x 2>/dev/null && echo writable || echo read-only;"
                " touch /tmp/x 2>/dev/null && echo tmp-shared || echo tmp-refused;"
                ' touch "$TMPDIR/x" && echo scratch-ok',
            },
        ).json()
        assert probe["stdout"].split() == ["read-only", "tmp-refused", "scratch-ok"], probe
    stored = sandbox.workspace / "conv1" / "uploads" / "temparea" / "weather.csv"
    assert stored.read_bytes().startswith(b"city,temp")
    assert stored.stat().st_uid == 10001
    assert (sandbox.workspace / "conv1" / "outputs" / "weather.json").exists()

"""``make cluster``'s path on the tier's node: the install it makes is the tier's own
(``nodeenv.standup.install_release``, the ``release`` fixture), and its way in — a
loopback listener served by the relay to the API pod, ``ready.json``, the service token
file — answers the commands scripts/cluster.py prints, until ``make cluster-down``'s
stop file ends it. (The namespaces and builds around it are the tier's own; the
script's outer half is tests/unit/test_cluster_script.py.)"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import threading
import uuid

import httpx
import pytest
from kubeenv.client import wait_until
from nodeenv.release import REPO_ROOT
from nodeenv.standup import READY, STOP, serve

pytestmark = pytest.mark.node


def _script():
    spec = importlib.util.spec_from_file_location(
        "cluster_script", REPO_ROOT / "scripts" / "cluster.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_make_cluster_serves_the_installed_chart_on_a_loopback_port(release, kube, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    server = threading.Thread(target=serve, args=(release, kube, listener, tmp_path), daemon=True)
    server.start()
    ready = wait_until(lambda: (tmp_path / READY).exists(), timeout=30, message="ready.json")
    assert ready
    info = json.loads((tmp_path / READY).read_text())
    assert info["url"].startswith("http://127.0.0.1:")
    assert httpx.get(f"{info['url']}/healthz", timeout=10, trust_env=False).status_code == 200
    # The "Try it" lines the script prints, run as printed.
    printed = _script().how_to_reach(info)
    lines = printed.split("Try it:", 1)[1].split("kubectl:", 1)[0]
    script = "\n".join(line.strip() for line in lines.splitlines()).replace("\\\n", " ")
    assert "X-User-Id: alice" in script
    user = f"cl-{uuid.uuid4().hex[:8]}"  # alice may be another node test's user
    script = script.replace("X-User-Id: alice", f"X-User-Id: {user}")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace("curl ", "curl --noproxy '*' ")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, printed + result.stdout + result.stderr
    assert f'"session_id":"sb-session-{user}"' in result.stdout.replace(" ", ""), result.stdout
    with release.client(user) as api:
        assert api.delete(f"/sessions/sb-session-{user}").status_code == 200
    (tmp_path / STOP).touch()
    server.join(timeout=30)
    assert not server.is_alive() and not (tmp_path / READY).exists()

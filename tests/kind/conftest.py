"""Fixtures of the `kind` test tier: the operator and the API deployed on a kind cluster.

- ``kind_deployment`` (session): pytest-kind's ``kind_cluster`` (created, or reused by
  name), the image (``SANDBOX_KIND_IMAGE``, else built: see ``kindenv/image.py``) loaded
  into it, the CRDs, and the operator and API of ``kindenv.manifests`` in a fresh
  namespace; the API is reached through ``kubectl port-forward`` on 127.0.0.1.
- ``user``: a fresh user id per test; its session is deleted afterwards.

Tests marked ``kind`` are SKIPPED, with the probe's reason, where pytest-kind is not
installed or no Docker daemon answers ``docker version`` (or SANDBOX_SKIP_KIND=1).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kindenv.image import REPO_ROOT, image_for_kind
from kindenv.manifests import (
    API,
    API_PORT,
    OPERATOR,
    api_objects,
    operator_cluster_role_name,
    operator_objects,
)
from kindenv.probe import kind_skip_reason
from kindenv.scenarios import Deployment, wait_until

_probe: dict[str, str | None] = {}


def _reason() -> str | None:
    if "reason" not in _probe:
        _probe["reason"] = kind_skip_reason()
    return _probe["reason"]


def pytest_collection_finish(session: pytest.Session) -> None:
    items = [i for i in session.items if i.get_closest_marker("kind")]
    if not items or session.config.option.collectonly:
        return
    reason = _reason()
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@contextlib.contextmanager
def _port_forward(cluster: Any, namespace: str) -> Iterator[int]:
    """``kubectl port-forward`` of the API's Service to a free port on 127.0.0.1."""
    cluster.ensure_kubectl()
    proc = subprocess.Popen(
        [
            str(cluster.kubectl_path),
            "port-forward",
            "--address",
            "127.0.0.1",
            "-n",
            namespace,
            f"service/{API}",
            f":{API_PORT}",
        ],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def drain() -> None:  # kubectl logs every connection: keep its pipe from filling
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=drain, daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=60)
            if not line:
                raise RuntimeError(f"kubectl port-forward exited with {proc.wait()}")
            match = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
            if match:
                break
        yield int(match.group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _cleanup(kubectl: Any, namespace: str) -> None:
    """Sessions and workspaces first, while the operator runs (their finalizers need it)."""
    for kind in ("conversationworkspaces", "sandboxsessions"):
        kubectl("delete", "-n", namespace, kind, "--all", "--wait=true", "--timeout=120s")
    kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
    role = operator_cluster_role_name(namespace)
    kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found")


def _deploy(kubectl: Any, namespace: str, image: str, token: str) -> None:
    objects = [*operator_objects(namespace, image), *api_objects(namespace, image, token)]
    listing = {"apiVersion": "v1", "kind": "List", "items": objects}
    kubectl("apply", "-f", "-", input=json.dumps(listing))
    for name in (OPERATOR, API):
        kubectl("rollout", "status", "-n", namespace, f"deployment/{name}", "--timeout=300s")


@pytest.fixture(scope="session")
def kind_deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    reason = _reason()
    if reason:
        pytest.skip(reason)
    cluster = request.getfixturevalue("kind_cluster")  # pytest-kind

    def kubectl(*args: str, **kw: Any) -> str:
        return cluster.kubectl(*args, stderr=subprocess.PIPE, **kw)

    image, _ = image_for_kind()
    cluster.load_docker_image(image)
    crds = str(REPO_ROOT / "crds")
    kubectl("apply", "-f", crds)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", crds)
    namespace = f"sbw-kind-{secrets.token_hex(3)}"
    token = secrets.token_urlsafe(24)
    kubectl("create", "namespace", namespace)
    try:
        _deploy(kubectl, namespace, image, token)
        with (
            _port_forward(cluster, namespace) as port,
            httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=120,
                trust_env=False,
            ) as api,
        ):
            wait_until(
                lambda: api.get("/healthz").status_code == 200, 60, "the API through port-forward"
            )
            yield Deployment(api, kubectl, namespace)
    finally:
        _cleanup(kubectl, namespace)


@pytest.fixture
def user(kind_deployment: Deployment) -> Iterator[str]:
    name = f"kind-{secrets.token_hex(3)}"
    yield name
    kind_deployment.api.delete(f"/api/v1/sessions/sb-session-{name}", headers={"X-User-Id": name})

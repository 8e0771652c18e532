"""The key scenarios of the operator, against a deployed API and operator.

They need only an HTTP client of the API (service token) and ``kubectl``, so they run
the same on a kind cluster as anywhere else. Files in the sandbox are checked from
inside it, by code executed through the API in another conversation — no ``kubectl
exec``, no assumption about where the node keeps volumes.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from sandbox_workspace.operator.naming import session_name_for, workspace_name

T = TypeVar("T")
SESSIONS = "/api/v1/sessions"
SESSION_LABEL = "sandboxworkspace.io/session"


def wait_until(predicate: Callable[[], T], timeout: float, message: str) -> T:
    """Poll ``predicate`` until truthy (exceptions count as "not yet"); return it."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}; last: {last!r}")
        time.sleep(0.25)


@dataclass
class Deployment:
    """A deployed API (``api``: base URL and service token set) and a way to kubectl."""

    api: httpx.Client
    kubectl: Callable[..., str]
    namespace: str
    timeout: float = 180.0  # first session on a fresh node also starts its image

    def as_user(self, user: str) -> dict[str, str]:
        return {"X-User-Id": user}

    def get_json(self, *args: str) -> dict[str, Any] | None:
        try:
            out = self.kubectl("get", "-n", self.namespace, *args, "-o", "json")
        except subprocess.CalledProcessError as e:
            if "NotFound" in str(e.stderr or e.output or ""):
                return None
            raise
        return json.loads(out)

    def names(self, kinds: str, selector: str) -> list[str]:
        out = self.kubectl("get", "-n", self.namespace, kinds, "-l", selector, "-o", "name")
        return out.split()


def _ok(r: httpx.Response, *codes: int) -> dict[str, Any]:
    assert r.status_code in codes, f"{r.request.method} {r.request.url} -> {r.status_code} {r.text}"
    return r.json()


def start_session(d: Deployment, user: str) -> dict[str, Any]:
    """Session → pod → Running with an endpoint; the pod is locked down."""
    sid = f"sb-session-{user}"
    _ok(d.api.post(SESSIONS, headers=d.as_user(user), json={}), 201)
    session = wait_until(
        lambda: (
            s
            if (s := _ok(d.api.get(f"{SESSIONS}/{sid}", headers=d.as_user(user)), 200))["status"]
            == "running"
            else None
        ),
        d.timeout,
        f"{sid} to run",
    )
    name = session_name_for(user)
    sbs = d.get_json("sandboxsessions", name)
    assert sbs is not None and sbs["status"]["phase"] == "Running", sbs
    assert sbs["status"]["endpoint"].startswith("http://"), sbs["status"]
    pod = d.get_json("pod", sbs["status"]["podName"])
    assert pod is not None
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["automountServiceAccountToken"] is False
    return session


def execute(d: Deployment, user: str, conversation: str, code: str) -> str:
    body = {"conversation_id": conversation, "language": "bash", "code": code}
    result = _ok(
        d.api.post(f"{SESSIONS}/sb-session-{user}/execute", headers=d.as_user(user), json=body),
        200,
    )
    assert result["exit_code"] == 0, result
    return result["stdout"]


def upload_is_visible(d: Deployment, user: str) -> None:
    """An upload through the API is in the workspace, as sandboxed code sees it."""
    data = b"city,temp\nParis,21\n"
    answer = _ok(
        d.api.post(
            f"{SESSIONS}/sb-session-{user}/files/upload",
            headers=d.as_user(user),
            files={"file": ("weather.csv", data)},
            data={"conversation_id": "conv-1"},
        ),
        201,
    )
    assert answer["size"] == len(data)
    assert execute(d, user, "conv-1", "cat uploads/temparea/weather.csv") == data.decode()
    cws = workspace_name(session_name_for(user), "conv-1")
    wait_until(
        lambda: (
            ((d.get_json("conversationworkspaces", cws) or {}).get("status") or {}).get("phase")
            == "Ready"
        ),
        d.timeout,
        f"{cws} Ready",
    )


def conversation_delete_removes_files(d: Deployment, user: str, workspace_path: str) -> None:
    """Deleting the conversation deletes its files, then its CR (the finalizer)."""
    directory = f"{workspace_path.rstrip('/')}/conv-1"
    probe = f"test -e {directory} && echo present || echo gone"
    assert execute(d, user, "probe", probe).strip() == "present"
    r = d.api.delete(f"{SESSIONS}/sb-session-{user}/conversations/conv-1", headers=d.as_user(user))
    _ok(r, 200, 202)
    cws = workspace_name(session_name_for(user), "conv-1")
    wait_until(lambda: d.get_json("conversationworkspaces", cws) is None, 60, f"{cws} gone")
    assert execute(d, user, "probe", probe).strip() == "gone"


def session_delete_collects_everything(d: Deployment, user: str) -> None:
    """Deleting the session garbage-collects its pod, Secret, PVC and workspaces."""
    name = session_name_for(user)
    _ok(d.api.delete(f"{SESSIONS}/sb-session-{user}", headers=d.as_user(user)), 200)
    wait_until(lambda: d.get_json("sandboxsessions", name) is None, 60, f"{name} gone")
    kinds = "pods,secrets,persistentvolumeclaims,conversationworkspaces"
    wait_until(
        lambda: not d.names(kinds, f"{SESSION_LABEL}={name}"),
        120,
        f"the children of {name} to be collected",
    )

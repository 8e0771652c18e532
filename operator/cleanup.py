"""Cleanup pods: a short-lived runtime on an orphaned claim, to delete directories.

Contract: a claim left without owner (``kubectl delete --cascade=orphan`` of its
session) still holds conversations' files, and no session serves it. When a
ConversationWorkspace on it is deleted, ``cleanup_runtime`` brings up a runtime pod
mounting that claim (``{claim}-cleanup``, with its own token Secret, never labelled with
a session) and answers its client once it is ready — or ``NotReady`` saying why to wait.
``remove_cleanup`` deletes pod and Secret once the directory is confirmed gone (a later
deletion starts another). The pod is built like a sandbox pod (same lockdown, same
image) from a stand-in session carrying the claim's user id.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import kopf
from pydantic import ValidationError

from sandbox_workspace.contract.conditions import Reason
from sandbox_workspace.contract.crd import ANNOTATION_USER_ID
from sandbox_workspace.kube import core_path
from sandbox_workspace.runtime.client import RuntimeClient

from . import naming
from .builders import TOKEN_KEY, build_cleanup_pod, build_cleanup_secret
from .children import uid_of
from .context import OperatorContext
from .models import SandboxSession, SandboxSessionSpec
from .settings import RUNTIME_PORT
from .status import observe_pod


class NotReady(Exception):
    """The cleanup runtime is not serving yet; the message says why."""


def _stand_in(claim: dict[str, Any]) -> SandboxSession:
    meta = claim["metadata"]
    user = (meta.get("annotations") or {}).get(ANNOTATION_USER_ID, "")
    try:
        spec = SandboxSessionSpec(user_id=user)
    except ValidationError:
        spec = SandboxSessionSpec(user_id="unknown")
    return SandboxSession(name=meta["name"], namespace=meta["namespace"], spec=spec)


async def _token(ctx: OperatorContext, stand_in: SandboxSession, claim: str) -> str:
    ns = stand_in.namespace
    path = core_path(ns, "secrets", naming.cleanup_secret_name(claim))
    secret = await ctx.api.get(path)
    if secret is None:
        token = secrets.token_urlsafe(32)
        await ctx.api.create(core_path(ns, "secrets"), build_cleanup_secret(stand_in, claim, token))
        secret = await ctx.api.get(path)
    data = (secret or {}).get("data") or {}
    if TOKEN_KEY not in data:
        raise NotReady(f"the cleanup Secret of claim {claim} has no token yet")
    return base64.b64decode(data[TOKEN_KEY]).decode()


async def cleanup_runtime(ctx: OperatorContext, claim: dict[str, Any]) -> RuntimeClient:
    """A client of the cleanup runtime on ``claim`` (see the module contract)."""
    stand_in = _stand_in(claim)
    name, ns = stand_in.name, stand_in.namespace
    token = await _token(ctx, stand_in, name)
    path = core_path(ns, "pods", naming.cleanup_pod_name(name))
    pod = await ctx.api.get(path)
    if pod is None:
        await ctx.api.create(core_path(ns, "pods"), build_cleanup_pod(stand_in, ctx.settings, name))
        message = f"started a cleanup pod on claim {name}"
        kopf.event(claim, type="Normal", reason=Reason.CLEANUP_POD, message=message)
        raise NotReady(f"starting a cleanup pod on orphaned claim {name}")
    state = observe_pod(pod)
    if state.kind in ("failed", "broken"):
        await ctx.api.delete(path, uid=uid_of(pod))
        raise NotReady(f"the cleanup pod on claim {name} failed ({state.reason}); replacing it")
    if state.kind != "ready" or not state.ip:
        raise NotReady(f"the cleanup pod on claim {name} is starting ({state.reason})")
    assert ctx.http is not None
    return RuntimeClient(ctx.http, f"http://{state.ip}:{RUNTIME_PORT}", token)


async def remove_cleanup(ctx: OperatorContext, namespace: str, claim: str) -> None:
    """Delete the cleanup pod and Secret of ``claim`` (absent ones are fine)."""
    await ctx.api.delete(core_path(namespace, "pods", naming.cleanup_pod_name(claim)))
    await ctx.api.delete(core_path(namespace, "secrets", naming.cleanup_secret_name(claim)))

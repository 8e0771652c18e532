"""A session takes a ready pod from the warm pool (issue 25; STYLE 17).

Contract: ``claim_pod`` is called where a session would create its pod (new, resumed or
replaced). It returns the claimed pod, or None, and the caller starts the pod cold:
- None at once when the namespace has no pool or ``spec.misfits`` names a field;
- otherwise free ready pods are tried one by one: a compare-and-swap merge patch
  (``spec.claim_patch``, resourceVersion precondition) makes the pod the session's; on
  409 (claimed by another session or operator, or changed) the next one is tried;
- after the swap, the session's token is delivered to the pod's runtime
  (``POST /v1/claim`` with the namespace's claim key; no restart). A pod whose runtime
  refuses or does not answer is deleted (it is the session's now, never free again) and
  the next one is tried;
- a claimed pod never goes back: its ``pool`` label says ``claimed`` for its whole life.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from typing import Any

import httpx

from sandbox_workspace.kube import Conflict, core_path

from ..children import uid_of
from ..context import OperatorContext
from ..models import SandboxSession
from ..settings import RUNTIME_PORT
from .spec import CLAIM_KEY, POOL_SECRET, claim_patch, misfits

log = logging.getLogger("sandbox_workspace.operator.pool")
ATTEMPTS = 5  # free pods tried per start before starting cold
REFILL_AFTER_CLAIM_SECONDS = 0.05


async def claim_key(ctx: OperatorContext, namespace: str) -> str | None:
    assert ctx.pool is not None
    key = ctx.pool.keys.get(namespace)
    if key is None:
        secret = await ctx.api.get(core_path(namespace, "secrets", POOL_SECRET))
        data = (secret or {}).get("data") or {}
        if CLAIM_KEY in data:
            key = ctx.pool.keys[namespace] = base64.b64decode(data[CLAIM_KEY]).decode()
    return key


async def deliver_token(ctx: OperatorContext, pod: dict[str, Any], key: str, token: str) -> bool:
    """The session's token to the claimed pod's runtime; True when it took it."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or ctx.http is None:
        return False
    try:
        response = await ctx.http.post(
            f"http://{ip}:{RUNTIME_PORT}/v1/claim",
            json={"token": token},
            headers={"Authorization": f"Bearer {key}"},
        )
    except httpx.HTTPError as e:
        name = pod["metadata"]["name"]
        log.warning("claimed pod did not take its token", extra={"pod": name, "error": str(e)})
        return False
    if response.status_code != 200:
        log.warning(
            "claimed pod refused its token",
            extra={"pod": pod["metadata"]["name"], "status": response.status_code},
        )
        return False
    if ctx.pool is not None:
        ctx.pool.delivered.add(uid_of(pod))
    return True


async def claim_pod(
    ctx: OperatorContext, session: SandboxSession, body: dict[str, Any]
) -> dict[str, Any] | None:
    """A pool pod now the session's, its token delivered; None: start cold."""
    pool, ns = ctx.pool, session.namespace
    if pool is None or not pool.serves(ns):
        return None
    if misfits(session.spec, ctx.settings):
        pool.metrics.starts.labels(ns, "cold_spec").inc()
        return None
    started = time.monotonic()
    key = await claim_key(ctx, ns)
    token = await ctx.runtime_token(ns, session.name, session.uid)
    if key is None or token is None:
        pool.metrics.starts.labels(ns, "cold_nokey").inc()
        return None
    outcome = "cold_empty"
    for _ in range(ATTEMPTS):
        pod = pool.take(ns)
        if pod is None:
            break
        path = core_path(ns, "pods", pod["metadata"]["name"])
        try:
            claimed = await ctx.api.patch(path, claim_patch(pod, session, body, ctx.settings))
        except Conflict:
            outcome = "cold_conflict"
            continue  # someone else's now, or changed since we saw it: the next one
        if claimed is None:
            continue  # gone
        pool.note_claimed(ns, claimed["metadata"]["name"], live=True)
        # One fewer free pod: refill — a moment later, off this start's critical path (its
        # listing and creates would share the event loop and the API with the token's
        # delivery and the session's status write).
        asyncio.get_running_loop().call_later(REFILL_AFTER_CLAIM_SECONDS, pool.wake.set)
        pool.claiming.add(uid_of(claimed))  # its own event must not deliver it again
        try:
            delivered = await deliver_token(ctx, claimed, key, token)
        finally:
            pool.claiming.discard(uid_of(claimed))
        if delivered:
            pool.metrics.claim_seconds.observe(time.monotonic() - started)
            pool.metrics.starts.labels(ns, "pool").inc()
            return claimed
        await ctx.api.delete(path, uid=uid_of(claimed))
        outcome = "cold_refused"
    pool.metrics.starts.labels(ns, outcome).inc()
    return None

"""A claim key rotated (operator/pool: the ``sandbox-pool-claim`` Secret deleted or
changed) while sessions run on pods claimed with the old key: an operator that did not see
those claims delivered (restarted, or a standby replica taking over) re-delivers on the
pods' events (``refill._redeliver``). The new key is not the one those runtimes hold: the
runtime answers 401, and a refused delivery deleted the pod — every running pool-started
session lost its pod (and its processes) at the first operator restart after a rotation.
The runtime here is the real claim logic (``runtime/claim.ClaimState``) on MockTransport;
the apiserver ``FakeKube``."""

from __future__ import annotations

import base64
import json

import httpx
import kopf
import pytest
from fake_kube import FakeKube
from prometheus_client import CollectorRegistry

from sandbox_workspace.contract.crd import ANNOTATION_CLAIM_KEY_ID, LABEL_SESSION
from sandbox_workspace.contract.errors import ApiError
from sandbox_workspace.kube import core_path, custom_path
from sandbox_workspace.operator import naming
from sandbox_workspace.operator.context import OperatorContext
from sandbox_workspace.operator.pool import PoolMetrics, PoolState
from sandbox_workspace.operator.pool.refill import on_pool_pod_event
from sandbox_workspace.operator.pool.spec import (
    CLAIM_KEY,
    CLAIMED,
    LABEL_POOL,
    POOL_SECRET,
    key_id,
)
from sandbox_workspace.operator.settings import OperatorSettings
from sandbox_workspace.runtime.claim import ClaimState

NS = "sessions"
SESSION = "sb-session-a"
TOKEN = "t" * 32
OLD_KEY, NEW_KEY = "old-key-" + "o" * 32, "new-key-" + "n" * 32


def runtime(state: ClaimState, sent: list[httpx.Request]) -> httpx.MockTransport:
    """A pooled runtime's claim and an authenticated route, as the real one answers."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        authorization = request.headers.get("authorization")
        if request.url.path == "/v1/claim":
            try:
                state.claim(authorization, json.loads(request.read())["token"])
            except ApiError as e:
                return httpx.Response(e.status, json={"code": e.code})
            return httpx.Response(
                200, json={"claimed": True, "network": "deny", "workspace_path": "/workspace"}
            )
        if state.token is not None and authorization == f"Bearer {state.token}":
            return httpx.Response(200, json={})
        return httpx.Response(401, json={"code": "unauthorized"})

    return httpx.MockTransport(answer)


def cluster(pod_key: str) -> tuple[FakeKube, dict]:
    """The namespace after a rotation: the Secret holds ``NEW_KEY``; a pod claimed for the
    session, started with ``pod_key``, Running and ready."""
    kube = FakeKube()
    secret = {"data": {CLAIM_KEY: base64.b64encode(NEW_KEY.encode()).decode()}}
    kube.put(core_path(NS, "secrets", POOL_SECRET), secret)
    session = kube.put(
        custom_path(NS, "sandboxsessions", SESSION),
        {
            "apiVersion": "sandboxworkspace.io/v1alpha1",
            "kind": "SandboxSession",
            "metadata": {"name": SESSION, "uid": "s1"},
            "spec": {"userId": "a", "storage": {"persistent": False}},
        },
    )
    token = {"data": {"token": base64.b64encode(TOKEN.encode()).decode()}}
    kube.put(core_path(NS, "secrets", naming.runtime_secret_name(SESSION)), token)
    pod = kube.put(
        core_path(NS, "pods", "pool-7"),
        {
            "metadata": {
                "labels": {LABEL_POOL: CLAIMED, LABEL_SESSION: SESSION},
                "annotations": {ANNOTATION_CLAIM_KEY_ID: key_id(pod_key)},
                "ownerReferences": [{"uid": session["metadata"]["uid"], "name": SESSION}],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    return kube, pod


async def event_after_restart(kube: FakeKube, pod: dict, state: ClaimState) -> list:
    """A new operator (nothing delivered by it) gets the claimed pod's watch event."""
    ctx = OperatorContext(OperatorSettings(_env_file=None), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 1, PoolMetrics(CollectorRegistry()))
    sent: list[httpx.Request] = []
    async with httpx.AsyncClient(transport=runtime(state, sent)) as http:
        ctx.http = http
        event = {"type": "MODIFIED", "object": pod}
        await on_pool_pod_event(event=event, namespace=NS, memo=kopf.Memo(ctx=ctx))
    assert ctx.pool is not None
    return [sent, ctx.pool.delivered]


async def test_a_session_claimed_with_a_rotated_key_keeps_its_pod() -> None:
    kube, pod = cluster(OLD_KEY)
    state = ClaimState(None, OLD_KEY)
    state.claim(f"Bearer {OLD_KEY}", TOKEN)  # claimed before the rotation: it serves
    sent, delivered = await event_after_restart(kube, pod, state)
    assert ("delete", core_path(NS, "pods", "pool-7")) not in kube.calls
    assert pod["metadata"]["uid"] in delivered  # no new attempt at each of its events
    # The new key is not handed to a runtime that was never given it.
    assert all(NEW_KEY not in r.headers.get("authorization", "") for r in sent)


async def test_a_pod_of_a_rotated_key_never_given_its_token_is_deleted() -> None:
    """Swapped, then the operator went before the delivery, and the key rotated: no claim
    can reach it now (its key is gone) — deleted, the session starts another pod."""
    kube, pod = cluster(OLD_KEY)
    sent, _ = await event_after_restart(kube, pod, ClaimState(None, OLD_KEY))
    assert ("delete", core_path(NS, "pods", "pool-7")) in kube.calls
    assert all(NEW_KEY not in r.headers.get("authorization", "") for r in sent)


async def test_a_pod_of_the_current_key_is_delivered_again() -> None:
    """No rotation: the re-delivery is the claim itself, idempotent."""
    kube, pod = cluster(NEW_KEY)
    state = ClaimState(None, NEW_KEY)
    _, delivered = await event_after_restart(kube, pod, state)
    assert state.token == TOKEN and pod["metadata"]["uid"] in delivered
    assert ("delete", core_path(NS, "pods", "pool-7")) not in kube.calls


async def test_a_short_hand_put_key_is_refused_not_spread_as_a_digest() -> None:
    """Every pool pod is annotated with sha256(key)[:16], readable with pods' read access
    alone (Kubernetes' ``view`` role, no Secrets): a short key put in the Secret by hand
    ("changeme") would be guessed offline from it. Refused: no pod is made with it, and
    claims find no key (sessions start cold) until a long one is put in."""
    from sandbox_workspace.kube import KubeError
    from sandbox_workspace.operator.pool.claim import claim_key
    from sandbox_workspace.operator.pool.refill import refill

    kube = FakeKube()
    weak = {"data": {CLAIM_KEY: base64.b64encode(b"changeme").decode()}}
    kube.put(core_path(NS, "secrets", POOL_SECRET), weak)
    ctx = OperatorContext(OperatorSettings(_env_file=None, pool_size=2), kube=kube)  # type: ignore[arg-type]
    ctx.pool = PoolState((NS,), 2, PoolMetrics(CollectorRegistry()))
    with pytest.raises(KubeError) as refused:
        await refill(ctx, NS, relist=True)
    assert refused.value.reason == "NoClaimKey"
    assert not [p for p in kube.objects if p.startswith(core_path(NS, "pods") + "/")]
    assert await claim_key(ctx, NS, fresh=True) is None
    strong = {"data": {CLAIM_KEY: base64.b64encode(NEW_KEY.encode()).decode()}}
    kube.put(core_path(NS, "secrets", POOL_SECRET), strong)
    assert await claim_key(ctx, NS, fresh=True) == NEW_KEY


async def test_a_pod_of_an_earlier_incarnation_is_not_handed_the_current_token() -> None:
    """Swapped to a session, then the operator went before the delivery; the session was
    deleted and made again under its name (a new uid, a new token Secret of the same
    name). The old pod's event must not deliver the new incarnation's token to a pod its
    garbage collection is about to remove (and that the new one never uses)."""
    kube, pod = cluster(NEW_KEY)
    pod["metadata"]["ownerReferences"] = [{"uid": "an-earlier-uid", "name": SESSION}]
    state = ClaimState(None, NEW_KEY)
    sent, delivered = await event_after_restart(kube, pod, state)
    assert state.token is None and not sent and not delivered

"""A session takes a ready pod from the warm pool (issue 25; STYLE 17).

Contract: ``claim_pod`` is called where a session would create its pod (new, resumed or
replaced) — by the full reconcile, and by the short path of a new or resumed session
(``handlers/pool_start.py``). It returns the claimed pod, or None, and the caller starts
the pod cold:
- None at once when the namespace has no pool or ``spec.misfits`` names a field;
- otherwise free ready pods are tried one by one, taken from the watch-fed hint (no
  listing, no read): a compare-and-swap merge patch (``spec.claim_patch``,
  resourceVersion precondition) makes the pod the session's; on 409 (claimed by another
  session or operator, or changed) the next one is tried;
- the session's token is delivered to the pod's runtime (``POST /v1/claim`` with the
  namespace's claim key; no restart) in the same round trip as the swap: a pod runs no
  one's code before its claim, and one that took the token but was not swapped to the
  session (409) is read again: still free (its version moved: a status write, a stale
  hint) it is swapped once more, already this session's (another replica's claim of it)
  it is kept, anyone else's it is deleted — so only the session's own pod ever serves
  it, and a conflict burns no pod that holds nobody else's token. A pod whose
  runtime refuses or does not answer is deleted (it is the session's now, never free
  again) and the next one is tried;
- ``alongside``, when given, is a write the start needs anyway (the short path's token
  Secret), made in the same round trip as the first swap; when it answers False a pod
  already swapped or holding the token is deleted and the answer is None;
- a claimed pod never goes back: its ``pool`` label says ``claimed`` for its whole life;
- the claim's answer names the runtime's workspace path: kept (``PoolState.workspace_paths``,
  when ``models.workspace_path_of`` accepts it) for the status write that follows, so the
  API's first command asks no ``GET /v1/stats`` for it (issue 39).

Claims talk to the apiserver through the pool's own client (``PoolState.api``: its own
connections and a higher limit of requests in flight), so a burst of starts does not
queue behind the refiller's listings and creations or the other reconciles.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from sandbox_workspace.kube import Kube, KubeConflict, KubeError, core_path

from ..children import judge, uid_of
from ..context import OperatorContext
from ..models import SandboxSession, workspace_path_of
from ..settings import RUNTIME_PORT
from .spec import CLAIM_KEY, CLAIMED, LABEL_POOL, POOL_SECRET, claim_egress, claim_patch, misfits

log = logging.getLogger("sandbox_workspace.operator.pool")
ATTEMPTS = 5  # free pods tried per start before starting cold
Alongside = Callable[[], Awaitable[bool]]


def claims_api(ctx: OperatorContext) -> Kube:
    """The client claims use: the pool's own when it has one."""
    if ctx.pool is not None and ctx.pool.api is not None:
        return ctx.pool.api
    return ctx.api


# The shortest claim key used: every pool pod carries the key's unsalted digest
# (``spec.key_id``), readable by anyone who may read pods (Kubernetes' own ``view`` role,
# which reads no Secret) — a short hand-put key could be guessed from it offline. The
# operator's own keys are 43 characters (``secrets.token_urlsafe(32)``: 256 random bits).
MIN_KEY_CHARS = 32


async def claim_key(ctx: OperatorContext, namespace: str, *, fresh: bool = False) -> str | None:
    """The namespace's claim key: as last read, or read now (``fresh``, or never read);
    None when its Secret has none (deleted: the refiller makes a new key) or one shorter
    than ``MIN_KEY_CHARS`` (refused: no pool pod carries its digest, sessions start cold)."""
    assert ctx.pool is not None
    if fresh or namespace not in ctx.pool.keys:
        secret = await ctx.api.get(core_path(namespace, "secrets", POOL_SECRET))
        data = (secret or {}).get("data") or {}
        key = base64.b64decode(data[CLAIM_KEY]).decode() if CLAIM_KEY in data else None
        if key is not None and len(key) < MIN_KEY_CHARS:
            log.warning(
                "claim key refused: too short",
                extra={"namespace": namespace, "secret": POOL_SECRET, "min": MIN_KEY_CHARS},
            )
            key = None
        if key is not None:
            ctx.pool.keys[namespace] = key
        else:
            ctx.pool.keys.pop(namespace, None)
    return ctx.pool.keys.get(namespace)


async def deliver_token(
    ctx: OperatorContext,
    pod: dict[str, Any],
    key: str,
    token: str,
    egress: dict[str, Any] | None = None,
) -> bool:
    """The session's token (and ``egress``: its code's network, ``spec.claim_egress``) to
    the pod's runtime (claimed, or being swapped: ``_swap_delivering``); True when it
    took them. A runtime that answers without
    the network asked for (one older than the egress claim) did not take it: refused."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or ctx.http is None:
        return False
    body: dict[str, Any] = {"token": token}
    if egress is not None:
        body["egress"] = egress
    name = pod["metadata"]["name"]
    try:
        response = await ctx.http.post(
            f"http://{ip}:{RUNTIME_PORT}/v1/claim",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        )
    except httpx.HTTPError as e:
        log.warning("claimed pod did not take its token", extra={"pod": name, "error": str(e)})
        return False
    if response.status_code != 200:
        log.warning(
            "claimed pod refused its token", extra={"pod": name, "status": response.status_code}
        )
        return False
    answer = _answer_of(response)
    wanted = "proxy_port" if egress is not None else None
    if wanted and (network := _network_of(answer)) != wanted:
        log.warning(
            "claimed pod did not take the network asked for",
            extra={"pod": name, "wanted": wanted, "answered": network},
        )
        return False
    if ctx.pool is not None:
        ctx.pool.delivered.add(uid_of(pod))
        path = workspace_path_of(answer.get("workspace_path")) if isinstance(answer, dict) else None
        if path is not None:  # else (an older runtime, a bad answer): the stats tell
            ctx.pool.keep_workspace_path(uid_of(pod), path)
    return True


async def serves(ctx: OperatorContext, pod: dict[str, Any], token: str) -> bool | None:
    """Whether the pod's runtime answers ``token`` already (a claim of it was delivered):
    True on 200, False when refused (401: not claimed, or claimed with another token),
    None when not known (no address, no answer, another status)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or ctx.http is None:
        return None
    try:
        response = await ctx.http.get(
            f"http://{ip}:{RUNTIME_PORT}/v1/stats", headers={"Authorization": f"Bearer {token}"}
        )
    except httpx.HTTPError:
        return None
    return {200: True, 401: False}.get(response.status_code)


def _answer_of(response: httpx.Response) -> dict[str, Any] | str:
    """The runtime's claim answer as a JSON object, or what is wrong with it (not JSON,
    not an object): a runtime's answer, never trusted to have our shape."""
    try:
        answer = response.json()
    except ValueError:
        return "(the answer is not JSON)"
    if not isinstance(answer, dict):
        return f"(the answer is not a JSON object: {type(answer).__name__})"
    return answer


def _network_of(answer: dict[str, Any] | str) -> str:
    """The network the claim answer says the runtime set, or what is wrong with it."""
    if isinstance(answer, str):
        return answer
    network = answer.get("network")
    return network if isinstance(network, str) else "(the answer names no network)"


async def _swap(
    ctx: OperatorContext, pod: dict[str, Any], session: SandboxSession, body: dict[str, Any]
) -> dict[str, Any] | None:
    """The compare-and-swap of one free pod; None when someone else's now, or gone."""
    path = core_path(session.namespace, "pods", pod["metadata"]["name"])
    try:
        return await claims_api(ctx).patch(path, claim_patch(pod, session, body, ctx.settings))
    except KubeConflict:
        return None  # someone else's now, or changed since we saw it


async def _swap_delivering(
    ctx: OperatorContext,
    pod: dict[str, Any],
    session: SandboxSession,
    body: dict[str, Any],
    deliver: Awaitable[bool],
    alongside: Alongside | None,
) -> tuple[dict[str, Any] | None, bool, bool]:
    """The swap, the token's delivery to the pod's runtime and ``alongside`` in one round
    trip: (the claimed pod or None, delivered, alongside's answer — True without one).

    The token goes to the pod before it is known to be ours: a pool pod runs no code of
    anyone's. One whose swap lost is read again (``_swap_again``); one left neither ours
    nor another claim's of this session, or whose ``alongside`` failed, holds a token
    nobody will use — it is deleted here, so no pod serves a session it was not swapped
    to. An error of any of the three is raised once
    all three ended, after that deletion."""
    swapped, delivered, done = await asyncio.gather(
        _swap(ctx, pod, session, body),
        deliver,
        alongside() if alongside is not None else _true(),
        return_exceptions=True,
    )
    if swapped is None and delivered is True and done is True:
        swapped = await _swap_again(ctx, pod, session, body)
        if swapped is _HELD:  # it serves the session through the other claim: left alone
            return None, False, True
    kept = isinstance(swapped, dict) and done is True
    # Not kept, a pod swapped to this session or holding its token is nobody's to give now.
    target = swapped if isinstance(swapped, dict) else pod if delivered is True else None
    if not kept and target is not None:
        path = core_path(session.namespace, "pods", target["metadata"]["name"])
        await claims_api(ctx).delete(path, uid=uid_of(target))
    for result in (swapped, delivered, done):
        if isinstance(result, BaseException):
            raise result
    return swapped if kept else None, delivered is True, done is True  # type: ignore[return-value]


# ``_swap_again``'s answer for a pod another claim of the same session swapped already.
_HELD: Any = object()


async def _swap_again(
    ctx: OperatorContext, pod: dict[str, Any], session: SandboxSession, body: dict[str, Any]
) -> Any:
    """The swap lost (409) but the pod took this session's token, so no other session's
    claim can deliver to it: it is this session's or nobody's. Read again: ``_HELD`` when
    another claim of this same session (another replica) swapped it already — it serves
    the session through that claim, whose status names it: neither used here (two status
    writes, the second refused, would delete it) nor deleted — and swapped once more when
    still free (its version moved for another reason: a status write, a hint older than a
    listing), instead of being deleted as every lost swap was (one start with a stale hint
    burned ``ATTEMPTS`` pods).
    None when another session's now (its claim, refused by the runtime, deletes it)."""
    path = core_path(session.namespace, "pods", pod["metadata"]["name"])
    try:
        fresh = await claims_api(ctx).get(path)
    except KubeError:
        return None  # not known: deleted as a lost swap
    if fresh is None or uid_of(fresh) != uid_of(pod):
        return None
    meta = fresh["metadata"]
    if judge(fresh, (body.get("metadata") or {}).get("uid", "")) == "ours":
        return _HELD
    if meta.get("deletionTimestamp") or (meta.get("labels") or {}).get(LABEL_POOL) == CLAIMED:
        return None
    return await _swap(ctx, fresh, session, body)


async def _true() -> bool:
    return True


async def claim_pod(
    ctx: OperatorContext,
    session: SandboxSession,
    body: dict[str, Any],
    *,
    token: str | None = None,
    alongside: Alongside | None = None,
    marks: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """A pool pod now the session's, its token delivered; None: start cold. ``token``:
    the session's (read from its Secret when not given); ``marks``, when given, gets the
    ``time.monotonic()`` of the last swap (``swapped``) and of the delivery (``delivered``)."""
    marks = {} if marks is None else marks
    pool, ns = ctx.pool, session.namespace
    if pool is None or not pool.serves(ns):
        return None
    if misfits(session.spec, ctx.settings):
        pool.metrics.starts.labels(ns, "cold_spec").inc()
        return None
    started = time.monotonic()
    key = await claim_key(ctx, ns)
    token = token or await ctx.runtime_token(ns, session.name, session.uid)
    if key is None or token is None:
        pool.metrics.starts.labels(ns, "cold_nokey").inc()
        return None
    outcome = "cold_empty"
    for _ in range(ATTEMPTS):
        pod = pool.take(ns)
        if pod is None:
            break
        # From before the swap (its watch event may come before its answer) until the
        # token is delivered, the pod's events wait for this claim (claim_settled).
        pool.begin_claim(uid_of(pod))
        try:
            egress = claim_egress(session, ctx.settings)
            deliver = deliver_token(ctx, pod, key, token, egress)
            claimed, delivered, done = await _swap_delivering(
                ctx, pod, session, body, deliver, alongside
            )
            if not done:
                return None  # the caller's fallback starts it (and counts it)
            alongside = None  # made with the first swap
            if claimed is None:
                outcome = "cold_conflict"
                continue
            marks["swapped"] = time.monotonic()
            pool.note_claimed(ns, claimed["metadata"]["name"], live=True)
            # The watch event of this very version needs no reconcile (the caller's own).
            ctx.pods_seen[uid_of(claimed)] = claimed["metadata"].get("resourceVersion", "")
            pool.wake_after_claim()  # one fewer free pod: the refiller, once claims settle
        finally:
            pool.end_claim(uid_of(pod))
        if delivered:
            marks["delivered"] = time.monotonic()
            pool.metrics.claim_seconds.observe(time.monotonic() - started)
            pool.metrics.starts.labels(ns, "pool").inc()
            return claimed
        path = core_path(ns, "pods", claimed["metadata"]["name"])
        await claims_api(ctx).delete(path, uid=uid_of(claimed))
        outcome = "cold_refused"
    if alongside is not None:
        return None  # no pod even swapped: the caller's fallback starts it (and counts it)
    pool.metrics.starts.labels(ns, outcome).inc()
    return None

"""Keeps each pool namespace at ``pool_size`` free pods, and follows pool pods' events.

Contract:
- ``start`` (kopf startup) makes the pool state when ``pool_size`` > 0 and starts one
  refill task; ``stop`` (kopf cleanup) ends it.
- The refill task, woken by a claim, a pool pod's event or every ``check_interval``:
  first it lets the claims settle (``settle``: no claim for ``REFILL_SETTLE`` seconds, or
  ``REFILL_DEFER_MAX`` seconds of waiting in a steady stream of them) — a burst of starts
  must not share the node's CPU and the API with the start-ups of its refill (the
  sessions' deadlines wait for ``settle`` too: ``handlers/checks.on_deadline``). Then per
  namespace it ensures the claim-key Secret (create-if-absent, a fresh random key; read
  again at each listing round, so a key rotated by deleting or changing the Secret is
  followed within ``RELIST_EVERY``: free pods of the old key are stale from then) and
  creates missing pods so that at most ``pool_refill_batch`` are starting (created, not
  ready yet) at once: a bounded rate, the next ones when those are ready (their event
  wakes it). It counts from the watch-fed state (``PoolState``: ready and starting pods),
  not from a listing: listing every pool pod (~10 KB each) on every pod's ready event
  cost the operator and the apiserver CPU just when the pool was full again and the next
  claim came (measured: docs/performance.md). A round lists the pool's pods only when
  ``PoolState.relist`` asks (the first round, after a failed or outdated pod's event) or
  every ``RELIST_EVERY`` seconds (a resync): it deletes the failed and the stale ones
  (built from an older template: operator upgraded) and re-seeds the state.
- The report task (``report``) keeps each namespace's SandboxPool resource
  (``resource.py``) showing the pool's counts: woken when a count may have moved (at most
  every ``REPORT_DEBOUNCE`` seconds, so a burst of claims is one write), it patches the
  status when it differs from the last one written, creating the resource when missing;
  every ``check_interval`` without news it writes anyway (a deleted resource comes back).
  Like the refiller, only on the active replica.
- Claims have an apiserver client of their own (``PoolState.api``, ``CLAIM_CONCURRENCY``
  requests in flight), made here and closed by ``stop``; the refill task keeps its
  connections open (``warm``: that many requests at once, every ``WARM_EVERY`` seconds),
  so a burst of claims pays no TLS handshakes.
- ``on_pool_pod_event`` keeps the hint current: a free pod enters it when its runtime is
  ready and leaves it on any other news; a claimed pod whose token this process has not
  delivered (an operator restarted between the swap and the delivery) gets it again,
  with its session's egress (read then) — delivery is idempotent for the same token,
  and a pod that refuses is deleted; one started with a key rotated away since (its
  ``claim-key-id`` is not the current key's) cannot take a claim: kept when its runtime
  answers the session's token already, deleted when it refuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Any

import kopf

from sandbox_workspace.contract.crd import ANNOTATION_CLAIM_KEY_ID, LABEL_SESSION, SESSION_PLURAL
from sandbox_workspace.kube import Kube, KubeError, core_path, custom_path

from ..children import uid_of
from ..context import OperatorContext
from ..models import SandboxSession
from ..status import observe_pod
from .claim import MIN_KEY_CHARS, claim_key, deliver_token, serves
from .resource import (
    POOL_NAME,
    POOL_PLURAL,
    SandboxPoolStatus,
    build_pool_resource,
    status_patch,
)
from .spec import (
    CLAIM_KEY,
    CLAIMED,
    LABEL_POOL,
    POOL_SECRET,
    build_pool_pod,
    build_pool_secret,
    claim_egress,
    is_free,
    key_id,
    template_hash,
)
from .state import PoolMetrics, PoolState

log = logging.getLogger("sandbox_workspace.operator.pool")
REPORT_DEBOUNCE = 0.2  # seconds: the counts of a burst of claims in one status write
REFILL_SETTLE = 0.5  # seconds without a claim before the refiller starts pods
REFILL_DEFER_MAX = 5.0  # seconds: the longest a steady stream of claims defers a refill
# Apiserver requests of claims in flight at once (their own client: the operator's general
# one would queue them behind the refiller and the reconciles). Not more: httpcore checks
# every pooled connection (a poll of its socket) each time it assigns a request, so 32
# kept-open connections cost ~10% of the operator's CPU in a burst of 50 claims (py-spy);
# 8 in flight are more than two cores' apiserver serves at once anyway.
CLAIM_CONCURRENCY = 8
WARM_EVERY = 60.0  # seconds; the client keeps an idle connection 120 s (kube.Kube)
# Seconds between the refiller's resyncs by listing (else it counts from the watch): a
# missed watch event costs at most this long a wrong count.
RELIST_EVERY = 60.0


def pool_namespaces(ctx: OperatorContext) -> tuple[str, ...]:
    settings = ctx.settings
    return tuple(settings.pool_namespaces or settings.namespaces)


async def start(memo: kopf.Memo, **_: Any) -> None:
    ctx: OperatorContext = memo.ctx
    if ctx.settings.pool_size <= 0 or ctx.pool is not None:
        return
    namespaces = pool_namespaces(ctx)
    if not namespaces:
        log.warning("pool_size is set but no namespace is named: no pool")
        return
    ctx.pool = PoolState(namespaces, ctx.settings.pool_size, PoolMetrics(ctx.metrics.registry))
    ctx.pool.api = Kube(ctx.ensure_credentials(), concurrency=CLAIM_CONCURRENCY)
    ctx.pool.task = asyncio.create_task(_refill_forever(ctx), name="pool refill")
    ctx.pool.reporter = asyncio.create_task(_report_forever(ctx), name="pool report")


async def stop(memo: kopf.Memo, **_: Any) -> None:
    ctx: OperatorContext = memo.ctx
    if ctx.pool is None:
        return
    for task in (ctx.pool.task, ctx.pool.reporter):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    ctx.pool.task = ctx.pool.reporter = None
    if ctx.pool.api is not None:
        await ctx.pool.api.aclose()
        ctx.pool.api = None


async def warm(api: Kube) -> None:
    """``CLAIM_CONCURRENCY`` connections of ``api`` open (as many requests at once)."""
    with contextlib.suppress(KubeError):
        await asyncio.gather(*(api.get("/version") for _ in range(CLAIM_CONCURRENCY)))


async def _refill_forever(ctx: OperatorContext) -> None:
    assert ctx.pool is not None
    pool = ctx.pool
    warmed = listed = 0.0
    while True:
        await settle(pool)
        if pool.api is not None and time.monotonic() - warmed >= WARM_EVERY:
            await warm(pool.api)
            warmed = time.monotonic()
        pool.wake.clear()
        relist = pool.relist or time.monotonic() - listed >= RELIST_EVERY
        pool.relist = False
        if relist:
            listed = time.monotonic()
        again = False
        for ns in pool.namespaces:
            try:
                # A standby replica's refiller is not paused by kopf: without this, two
                # peered operators would each fill the pool to its size.
                if ctx.activity is not None and not await ctx.activity.active(ns):
                    continue
                again |= await refill(ctx, ns, relist=relist)
            except KubeError as e:
                pool.relist = True  # the next round starts from the truth
                ctx.metrics.errors.labels("SandboxPool", e.reason or str(e.status)).inc()
                log.warning("pool refill failed", extra={"namespace": ns, "error": str(e)})
            except Exception:
                pool.relist = True
                log.exception("pool refill failed")
        if again:
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pool.wake.wait(), ctx.settings.check_interval_seconds)


async def settle(pool: PoolState) -> None:
    """Return once no claim came for ``REFILL_SETTLE`` s (or after ``REFILL_DEFER_MAX`` s)."""
    began = time.monotonic()
    while True:
        now = time.monotonic()
        quiet = now - pool.last_claim
        if quiet >= REFILL_SETTLE or now - began >= REFILL_DEFER_MAX:
            return
        await asyncio.sleep(min(REFILL_SETTLE - quiet, REFILL_DEFER_MAX - (now - began)))


async def _report_forever(ctx: OperatorContext) -> None:
    assert ctx.pool is not None
    pool = ctx.pool
    written: dict[str, SandboxPoolStatus] = {}
    loop = asyncio.get_running_loop()
    resync = loop.time()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pool.changed.wait(), ctx.settings.check_interval_seconds)
        if loop.time() - resync >= ctx.settings.check_interval_seconds:
            # A resync (the refiller's rounds keep `changed` busy, so on the clock): a
            # deleted SandboxPool comes back, a lost write is redone.
            written.clear()
            resync = loop.time()
        await asyncio.sleep(REPORT_DEBOUNCE)
        pool.changed.clear()
        for ns in pool.namespaces:
            try:
                if ctx.activity is not None and not await ctx.activity.active(ns):
                    written.pop(ns, None)  # the active one reports; write again if we take over
                    continue
                status = await report(ctx, ns, written.get(ns))
                written[ns] = status
            except KubeError as e:
                ctx.metrics.errors.labels("SandboxPool", e.reason or str(e.status)).inc()
                log.warning("pool report failed", extra={"namespace": ns, "error": str(e)})
            except Exception:
                log.exception("pool report failed")


async def report(
    ctx: OperatorContext, ns: str, last: SandboxPoolStatus | None
) -> SandboxPoolStatus:
    """The SandboxPool of ``ns`` shows this replica's counts (written when they moved)."""
    assert ctx.pool is not None
    ready, claimed = ctx.pool.counts(ns)
    status = SandboxPoolStatus(size=ctx.pool.size, ready=ready, claimed=claimed)
    if status == last:
        return status
    path = custom_path(ns, POOL_PLURAL, POOL_NAME)
    if await ctx.api.patch(path + "/status", status_patch(status)) is None:
        await ctx.api.create(custom_path(ns, POOL_PLURAL), build_pool_resource())
        await ctx.api.patch(path + "/status", status_patch(status))
    return status


async def ensure_secret(ctx: OperatorContext, ns: str, *, fresh: bool = False) -> str:
    """The namespace's claim key, its Secret made when missing (``fresh``: read again)."""
    key = await claim_key(ctx, ns, fresh=fresh)
    if key is None:
        await ctx.api.create(core_path(ns, "secrets"), build_pool_secret(secrets.token_urlsafe(32)))
        # Read back: another replica's create (409, answered None) may have won.
        key = await claim_key(ctx, ns, fresh=True)
    if key is None:
        raise KubeError(
            0,
            f"the Secret {POOL_SECRET} of {ns} has no `{CLAIM_KEY}` of at least "
            f"{MIN_KEY_CHARS} characters",
            "NoClaimKey",
        )
    return key


async def refill(ctx: OperatorContext, ns: str, *, relist: bool = True) -> bool:
    """One round for ``ns``; True when more pods are still missing. ``relist``: from a
    listing of the pool's pods, else from what the watch told ``PoolState``."""
    assert ctx.pool is not None
    pool = ctx.pool
    key = await ensure_secret(ctx, ns, fresh=relist)
    if relist:
        await _relist(ctx, ns, key)
    ready, _ = pool.counts(ns)
    starting = len(pool.starting.get(ns, ()))
    missing = pool.size - ready - starting
    batch = min(missing, ctx.settings.pool_refill_batch - starting)
    if batch <= 0:
        return False  # full, or enough starting: a pod's ready event wakes us
    manifest = build_pool_pod(ns, ctx.settings, key)
    made = await asyncio.gather(
        *(ctx.api.create(core_path(ns, "pods"), manifest) for _ in range(batch))
    )
    for pod in made:  # counted as starting before their first watch event comes
        if pod is not None and pod["metadata"]["name"] not in pool.free.get(ns, {}):
            pool.note_starting(ns, pod["metadata"]["name"], True)
    pool.metrics.refills.labels(ns).inc(batch)
    return missing > batch


async def _relist(ctx: OperatorContext, ns: str, key: str) -> None:
    """The pool's pods as listed: failed and stale free ones (another template or claim
    ``key``) deleted, the state re-seeded."""
    assert ctx.pool is not None
    pool = ctx.pool
    template = template_hash(ns, ctx.settings)
    pods = await ctx.api.list(core_path(ns, "pods"), label_selector=f"{LABEL_POOL}")
    pool.starting[ns] = set()
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod["metadata"]["labels"].get(LABEL_POOL) == CLAIMED:
            pool.note_claimed(ns, name, live=not pod["metadata"].get("deletionTimestamp"))
            continue
        state = observe_pod(pod)
        if pod["metadata"].get("deletionTimestamp"):
            pool.note_free(ns, pod, ready=False)
        elif state.kind in ("failed", "broken") or not is_free(pod, template, key):
            pool.note_free(ns, pod, ready=False)
            await ctx.api.delete(core_path(ns, "pods", name), uid=uid_of(pod))
        else:
            pool.note_free(ns, pod, ready=state.kind == "ready")
            pool.note_starting(ns, name, state.kind != "ready")


async def on_pool_pod_event(
    event: kopf.RawEvent, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """Any change of a pool member (free or claimed): see the module contract."""
    ctx: OperatorContext = memo.ctx
    pool = ctx.pool
    if pool is None or not pool.serves(namespace):
        return
    pod = event["object"]
    meta = pod.get("metadata") or {}
    gone = event["type"] == "DELETED" or bool(meta.get("deletionTimestamp"))
    if (meta.get("labels") or {}).get(LABEL_POOL) == CLAIMED:
        pool.note_claimed(namespace, meta["name"], live=not gone)
        if gone:
            pool.delivered.discard(meta.get("uid", ""))
            pool.workspace_paths.pop(meta.get("uid", ""), None)
        else:
            await _redeliver(ctx, namespace, pod)
        return
    state = observe_pod(pod)
    template = template_hash(namespace, ctx.settings)
    key = await claim_key(ctx, namespace)
    current = key is not None and is_free(pod, template, key)
    ready = not gone and state.kind == "ready" and current
    failed = state.kind in ("failed", "broken")
    became_ready = pool.note_free(namespace, pod, ready=ready)
    pool.note_starting(namespace, meta["name"], not (gone or ready or failed) and current)
    if not gone and (failed or not current):
        pool.relist = True  # the next round lists: it deletes this one
    if gone or failed or not current or became_ready:
        pool.wake.set()  # one fewer, or one fewer starting: the next of a refill may go


async def _redeliver(ctx: OperatorContext, namespace: str, pod: dict[str, Any]) -> None:
    """A claimed pod whose delivery this process did not see: deliver (idempotent)."""
    assert ctx.pool is not None
    meta = pod["metadata"]
    owners = meta.get("ownerReferences") or []
    session = (meta.get("labels") or {}).get(LABEL_SESSION)
    await ctx.pool.claim_settled(meta.get("uid", ""))  # our own claim's delivery first
    if meta.get("uid") in ctx.pool.delivered or not owners or not session:
        return
    if observe_pod(pod).kind != "ready":
        return
    key = await claim_key(ctx, namespace)
    if key is None:
        return
    # The claim carries the code's network too (an egress policy): from the session now.
    body = await ctx.api.get(custom_path(namespace, SESSION_PLURAL, session))
    if body is None:
        return  # the session is gone: its pod goes with it (owner reference)
    if uid_of(body) not in {o.get("uid") for o in owners}:
        # A pod of an earlier incarnation of the name (its garbage collection removes
        # it): the token Secret is the current one's, never to be handed to this pod.
        return
    token = await ctx.runtime_token(namespace, session, uid_of(body))
    if token is None:
        return
    if (meta.get("annotations") or {}).get(ANNOTATION_CLAIM_KEY_ID) != key_id(key):
        # Started with a key rotated away since: no claim of it can succeed now (its runtime
        # answers 401), and the current key is not handed to it. Claimed before the
        # rotation, it serves its session: kept (else every pool-started session lost its
        # pod at the first operator restart after a rotation); never given its token, it
        # never can be: deleted. Not known (no answer): the next event asks again.
        serving = await serves(ctx, pod, token)
        if serving:
            ctx.pool.delivered.add(meta.get("uid", ""))
        elif serving is False:
            await ctx.api.delete(core_path(namespace, "pods", meta["name"]), uid=uid_of(pod))
        return
    egress = claim_egress(SandboxSession.from_body(body), ctx.settings)
    if not await deliver_token(ctx, pod, key, token, egress):
        await ctx.api.delete(core_path(namespace, "pods", meta["name"]), uid=uid_of(pod))

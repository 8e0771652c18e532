"""What the handlers share: settings, clients, metrics, per-session locks.

One ``OperatorContext`` per operator run, carried in kopf's ``memo`` (``memo.ctx``), so
nothing lives at module level and several operators can run in one process (tests).
Clients are opened in ``start()`` (inside the operator's event loop) and closed in
``aclose()``.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import httpx
from httpx_aiohttp import AiohttpTransport

from sandbox_workspace import tracing
from sandbox_workspace.kube import Credentials, Kube, core_path, load_credentials
from sandbox_workspace.runtime.client import RuntimeClient
from sandbox_workspace.store import ObjectStore, S3Store

from . import naming
from .answers import RuntimeAnswers
from .deadlines import Deadlines
from .metrics import OperatorMetrics
from .peering import Activity
from .pool.state import PoolState
from .settings import OperatorSettings


@dataclass
class OperatorContext:
    settings: OperatorSettings
    credentials: Credentials | None = None
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    kube: Kube | None = None
    http: httpx.AsyncClient | None = None
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    # Per session incarnation (uid): its runtime token, and that its Secret and claim were
    # seen — both fixed for a session's life, so a look at a due session need not GET them.
    _tokens: dict[str, str] = field(default_factory=dict)
    children_seen: set[str] = field(default_factory=set)
    # Starting pods whose runtime answered the operator's own /healthz poll.
    answers: RuntimeAnswers = field(default_factory=RuntimeAnswers)
    # SANDBOX_OPERATOR_STORE=s3: the bucket the finalizer empties (checked at start).
    store: ObjectStore | None = None
    # The warm pool, when the settings ask for one (operator/pool; set at start-up).
    pool: PoolState | None = None
    # Every session's next deadline (idle, TTL, roll, first look at a new pod), in one
    # scheduler: set up by the startup handler (``handlers/checks.py`` acts on them).
    deadlines: Deadlines | None = None
    # This replica's peering id (main.py) and whether it is the active one now: deadlines
    # act only then (peering.py; kopf pauses its own handlers by itself).
    identity: str = ""
    activity: Activity | None = None
    # Per session incarnation (uid): the pod start whose runtime was asked for its stats
    # (``checks.start_marker``) — asked once per start, not on every event.
    checked_starts: dict[str, str] = field(default_factory=dict)
    # Pod uid → the resourceVersion the last reconcile acted on: a watch event of that
    # very version (the ADDED of our own create) changes nothing and is skipped.
    pods_seen: dict[str, str] = field(default_factory=dict)
    # (namespace, name) → the session's latest body from its watch events (and from this
    # process's own status writes): a due deadline is looked at from it, without reading
    # the session again; writes from it carry its resourceVersion (409 → a fresh look).
    # One body per session, without its managedFields (``see_session``).
    sessions_seen: dict[tuple[str, str], dict] = field(default_factory=dict)

    def ensure_credentials(self) -> Credentials:
        if self.credentials is None:
            self.credentials = load_credentials(self.settings.kubeconfig)
        return self.credentials

    async def start(self) -> None:
        if self.kube is None:
            self.kube = Kube(self.ensure_credentials(), concurrency=self.settings.api_concurrency)
        if self.http is None:
            self.http = httpx.AsyncClient(
                timeout=self.settings.runtime_timeout_seconds,
                trust_env=False,
                # Over aiohttp's pool (httpx-aiohttp, as the API's runtime calls): httpcore's
                # checks each pooled connection on every request — 18% of the operator's
                # CPU asking 1,000 runtimes for their stats (py-spy, 2026-11-27). Traced
                # when tracing is on (the inner one otherwise).
                transport=tracing.transport(AiohttpTransport(trust_env=False)),
            )
        if self.store is None and self.settings.store == "s3":
            self.store = S3Store(self.settings.s3)
            await self.store.check()  # a missing bucket or bad credentials stop the start

    async def aclose(self) -> None:
        if self.deadlines is not None:
            await self.deadlines.aclose()
        await self.answers.aclose()
        if self.kube is not None:
            await self.kube.aclose()
        if self.http is not None:
            await self.http.aclose()
        self.metrics.close()

    @property
    def api(self) -> Kube:
        assert self.kube is not None, "OperatorContext.start() was not called"
        return self.kube

    def lock(self, namespace: str, name: str) -> asyncio.Lock:
        """Serialises work on one session across handlers (events, timers, changes)."""
        return self._locks.setdefault((namespace, name), asyncio.Lock())

    def forget(self, namespace: str, name: str, uid: str | None = None) -> None:
        self._locks.pop((namespace, name), None)
        self.sessions_seen.pop((namespace, name), None)
        if self.deadlines is not None:
            self.deadlines.cancel((namespace, name))
        if uid:
            self._tokens.pop(uid, None)
            self.children_seen.discard(uid)
            self.checked_starts.pop(uid, None)

    def see_session(self, body: dict) -> None:
        """Keep ``body`` as the session's latest (``sessions_seen``), without its
        managedFields: nothing here reads them, and they are a large part of each body (an
        entry per writer: the API, kopf, the operator). With whole bodies the RSS at rest
        with 1,000 sessions went 122 → 144 MB."""
        meta = body.get("metadata") or {}
        if "managedFields" in meta:
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self.sessions_seen[(meta.get("namespace", ""), meta.get("name", ""))] = body

    def remember_token(self, uid: str | None, token: str) -> None:
        """The token of the Secret this process just created for incarnation ``uid``."""
        if uid:
            self._tokens[uid] = token

    async def runtime_token(
        self, namespace: str, session_name: str, uid: str | None = None
    ) -> str | None:
        if uid and uid in self._tokens:
            return self._tokens[uid]
        secret = await self._runtime_secret(namespace, session_name, uid)
        data = (secret or {}).get("data") or {}
        token = base64.b64decode(data["token"]).decode() if "token" in data else None
        if token and uid:
            self._tokens[uid] = token
        return token

    async def _runtime_secret(
        self, namespace: str, session_name: str, uid: str | None
    ) -> dict | None:
        """The session's token Secret under its current name, else under its legacy name
        (a session made before 2026-11-28, naming) — that one only when owned by ``uid``
        (when given): a legacy name may be another session's."""
        for legacy in (False, True):
            name = naming.runtime_secret_name(session_name, legacy=legacy)
            secret = await self.api.get(core_path(namespace, "secrets", name))
            if secret is None:
                continue
            owners = (secret.get("metadata") or {}).get("ownerReferences") or []
            if not legacy or uid is None or any(o.get("uid") == uid for o in owners):
                return secret
        return None

    async def runtime(
        self, namespace: str, session_name: str, endpoint: str, uid: str | None = None
    ) -> RuntimeClient | None:
        """A client of the session's runtime, or None when its token is missing; with the
        session's ``uid`` the token is read once per session incarnation."""
        token = await self.runtime_token(namespace, session_name, uid)
        if token is None:
            return None
        assert self.http is not None
        return RuntimeClient(self.http, endpoint, token)
